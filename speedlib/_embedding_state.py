"""HostEmbedding's optimizer state: a host table per per-row state tensor, saved and loaded apart
from the weight, as the class docstring says."""

from __future__ import annotations

import inspect

import torch

from speedlib._host_table import HostTable


class _OptimizerState:
    """HostEmbedding's optimizer state tables and state_dict; a mixin, it reads the embedding's table and optimizer."""

    def _new_state_table(self, key: str) -> HostTable:
        """A state table whose rows start where the optimizer's state starts (see the class doc)."""
        probe = torch.zeros(1, self.embedding_dim, dtype=self.table.dtype, device=self.table.device, requires_grad=True)
        probe.grad = torch.zeros_like(probe)
        # The same hyper-parameters as constructor arguments (Adagrad reads its initial value
        # there), leaving out what schedulers add to param groups (initial_lr, ...).
        accepted = inspect.signature(type(self.optimizer)).parameters
        group = self.optimizer.param_groups[0]
        opt = type(self.optimizer)([probe], **{k: v for k, v in group.items() if k in accepted and k != "params"})
        opt.step()
        # the weight's sort order: state moves as rows do
        table = HostTable(*self.table.shape, dtype=self.table.dtype, backend=self.table.backend,
                          device=self.table.device, **self.table.options)
        initial = opt.state[probe].get(key)
        if isinstance(initial, torch.Tensor) and initial.any():
            table.fill_(initial.detach())
        return table

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # Only the weight, as nn.Embedding's: a model saved with a HostEmbedding loads strictly
        # into the same model with a plain nn.Embedding. The optimizer state is kept apart.
        destination[prefix + "weight"] = self.table.cpu()

    def optimizer_state_dict(self) -> dict[str, object]:
        """The optimizer state (per-row tables as host tensors of the table's shape, and scalars
        such as Adam's step), to save beside the model's state_dict. Hyper-parameters belong
        to the optimizer factory."""
        return {key: (self._state_tables[key].cpu() if key in self._state_tables else value)
                for key, value in (self.optimizer.state.get(self._rows_weight, {}) if self.optimizer else {}).items()}

    def load_optimizer_state_dict(self, state: dict[str, object]) -> None:
        """Restore what optimizer_state_dict() returned. Call it after load_state_dict(): loading
        a weight starts the optimizer afresh (its state belonged to the old values)."""
        if self.optimizer is None:
            raise ValueError("this HostEmbedding has no optimizer (frozen): there is no optimizer state to load")
        self._set_optimizer_state(dict(state))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        mine = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        if "weight" not in mine:
            missing_keys.append(prefix + "weight")
            return
        try:
            self.table.copy_(mine.pop("weight"))
        except (ValueError, TypeError) as e:
            error_msgs.append(f"{prefix}weight: {e}")
            return
        self._generation += 1  # rows gathered before the load are stale
        loaded = {}
        for name, value in mine.items():
            if not name.startswith("optimizer."):
                unexpected_keys.append(prefix + name)
            elif self.optimizer is not None:  # state_dicts saved before optimizer_state_dict() existed carry it
                loaded[name.removeprefix("optimizer.")] = value
        if self.optimizer is not None:
            self._set_optimizer_state(loaded)

    def _set_optimizer_state(self, loaded: dict[str, object]) -> None:
        # The loaded state replaces this embedding's whole state, absent entries by their fresh
        # values: keeping ours (Adam's step count, momentum rows) would make training continue
        # differently from the source.
        self._state_tables, state = {}, {}
        for key, value in {**self._fresh_state, **loaded}.items():
            if isinstance(value, torch.Tensor) and tuple(value.shape) == self.table.shape:
                self._state_tables[key] = HostTable.from_tensor(value, backend=self.table.backend,
                                                                device=self.table.device)
                value = value.new_empty(0, self.embedding_dim).to(self.table.device)
            elif isinstance(value, torch.Tensor) and tuple(value.shape) == (0, self.embedding_dim):
                # fresh per-row state
                self._state_tables[key] = self._new_state_table(key)
            state[key] = value.clone() if isinstance(value, torch.Tensor) else value
        if state:
            self.optimizer.state[self._rows_weight] = state
        else:
            self.optimizer.state.pop(self._rows_weight, None)

