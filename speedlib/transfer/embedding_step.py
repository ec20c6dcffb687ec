"""HostEmbedding's training step: each lookup's gradient gathered by row, then the optimizer's
own step on the touched rows and their state, however the step is called."""

from __future__ import annotations

import weakref

import torch


def step_hooks(emb_ref: weakref.ref):
    """Optimizer step pre- and post-hooks that make any step of a HostEmbedding's optimizer
    (emb.step(), a direct `emb.optimizer.step()`, `scaler.step(emb.optimizer)`) one step of
    the embedding: the optimizer's parameter is a copy of the touched rows, which must be
    gathered with their state before the update and written back after it. Weak references,
    so the module is not kept alive by its own optimizer's hooks."""
    def before(optimizer, args, kwargs):
        emb = emb_ref()
        if emb is not None and not emb._stepping:  # emb.step() prepares before it steps
            emb._prepare_step()

    def after(optimizer, args, kwargs):
        emb = emb_ref()
        if emb is not None:
            emb._finish_step()
    return before, after


class RowStep:
    """HostEmbedding's gradients and step; a mixin, it reads the embedding's table, rows and optimizer."""

    def _accumulate(self, rows: torch.Tensor, leaf: torch.Tensor, generation: int) -> None:
        """Add a lookup's gradient into the step's rows (union) and gradient (summed by row)."""
        if self._combined:
            raise RuntimeError("a backward reached HostEmbedding after touched_rows() combined this step's "
                               "gradients over the ranks: call touched_rows() after the last backward")
        grad, leaf.grad = leaf.grad, None  # taken over: a second backward adds only its own
        values = leaf.detach()
        if self.padding_idx is not None:  # the padding row never trains: it is not a touched row
            keep = rows != self.padding_idx
            rows, keep = rows[keep], keep.to(grad.device)
            grad, values = grad[keep], values[keep]
        if generation != self._generation:  # step() ran since the lookup: use the current rows
            values = self.table.gather(rows)
        if self._rows is not None and self._rows_weight.grad is None:
            # emb.optimizer.zero_grad() dropped the pending gradient (a step GradScaler skipped):
            # those rows got no gradient since, so they are no touched rows any more.
            self._rows = None
        if self._rows is not None:
            old = self._rows_weight
            n = self._rows.numel()
            rows, where = torch.unique(torch.cat([self._rows, rows]), sorted=True, return_inverse=True)
            where = where.to(grad.device)
            # Positions are distinct within each index_add_, so the sums are deterministic
            # on GPUs too: (0 + old) + new, in lookup order.
            values = values.new_empty(rows.numel(), self.embedding_dim).index_copy_(0, where[:n], old.detach()) \
                .index_copy_(0, where[n:], values)
            grad = torch.zeros_like(values).index_add_(0, where[:n], old.grad).index_add_(0, where[n:], grad)
        if self._rows is not None and self._rows_generation != self._generation:
            self._rows_generation = -1  # the earlier rows' values are stale: step() re-gathers
        else:
            self._rows_generation = self._generation
        self._rows = rows
        weight = values.requires_grad_()
        weight.grad = grad
        self._swap_rows_weight(weight)

    def touched_rows(self) -> torch.Tensor:
        """This step's rows as a dense tensor whose `.grad` is their gradient (None before
        any backward), for gradient clipping: `clip_grad_norm_([*params, emb.touched_rows()])`.

        Call it after the last backward of the step; step() applies the `.grad` as it then
        is. Distributed, this combines the ranks' gradients (a collective: every rank calls it).
        """
        if self.freeze:
            return self._rows_weight
        group = self._process_group()
        if group is not None and not self._combined:
            self._combine(group)
        return self._rows_weight

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients gathered since the last step() without applying them (a parent
        module's zero_grad() does not reach here: it only visits parameters)."""
        self._rows, self._combined = None, False
        self._swap_rows_weight(self._rows_weight.detach().new_empty(0, self.embedding_dim).requires_grad_())

    def step(self) -> None:
        """Update the rows that received gradients since the last step, and their optimizer state.

        The same as `emb.optimizer.step()` (which `scaler.step(emb.optimizer)` calls), except
        that it raises when no lookup tracked gradients since the last step."""
        if self.freeze:
            self.zero_grad()
            return
        # Distributed, a rank without lookups still joins its peers' collective: no error there.
        if self._rows is None and not self._tracked and self._group is None:
            raise RuntimeError("step() needs a forward pass that tracked gradients first (or the optimizer was "
                               "already stepped since: emb.optimizer.step() and scaler.step(emb.optimizer) "
                               "are emb.step() too, so call one of them per step)")
        self._stepping = True
        try:
            self._prepare_step()
            if self._rows is not None and self._rows.numel():
                self.optimizer.step()  # through the optimizer, so LR schedulers see the step
            else:
                self._finish_step()
        finally:
            self._stepping = False

    def _prepare_step(self) -> None:
        """Before the optimizer updates the touched rows: combine the ranks' gradients, re-gather
        rows the table changed under (writes through .weight, max_norm), gather their state."""
        self._check_state()
        w = self.touched_rows()
        rows = self._rows
        if rows is None or not rows.numel():
            return
        if self._rows_generation != self._generation:
            with torch.no_grad():
                w.copy_(self.table.gather(rows))
            self._rows_generation = self._generation
        state = self.optimizer.state.get(w)
        if state:
            for key, table in self._state_tables.items():
                state[key] = table.gather(rows)

    def _finish_step(self) -> None:
        """After the optimizer step: write rows and state back, start the next step afresh."""
        w, rows = self._rows_weight, self._rows
        self._rows, self._tracked, self._combined, self._state_loaded = None, False, False, False
        if rows is not None and rows.numel():
            with torch.no_grad():
                self.table._write_unique(rows, w)
                for key, value in self.optimizer.state[w].items():
                    if isinstance(value, torch.Tensor) and value.shape == w.shape:
                        if key not in self._state_tables:
                            self._state_tables[key] = self._new_state_table(key)
                        self._state_tables[key]._write_unique(rows, value)
                        # The rows are on the host now; free the device copy until next step.
                        self.optimizer.state[w][key] = value.new_empty(0, self.embedding_dim)
            self._generation += 1
        self.zero_grad()

    def _swap_rows_weight(self, new: torch.Tensor) -> None:
        # A fresh leaf whenever the rows change (autograd caches a leaf's shape, so resizing
        # one in place fails); the optimizer's param entry and state move over to it.
        old = self._rows_weight
        if self.optimizer is not None:
            self.optimizer.param_groups[0]["params"][0] = new
            if old in self.optimizer.state:
                self.optimizer.state[new] = self.optimizer.state.pop(old)
        self._rows_weight = new
