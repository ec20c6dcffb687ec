"""HostEmbedding's optimizer state: a host table per per-row state tensor, saved and loaded apart
from the weight, as the class docstring says."""

from __future__ import annotations

import inspect
import weakref

import torch

from speedlib.transfer.table import HostTable


class OptimizerState:
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

    def _stateful_keys(self) -> list[str]:
        """The state the optimizer keeps (Adam: exp_avg, exp_avg_sq, step; SGD without momentum:
        none), from one step of a probe: what a resumed run needs besides the weight."""
        probe = torch.zeros(1, self.embedding_dim, dtype=self.table.dtype, device=self.table.device, requires_grad=True)
        probe.grad = torch.zeros_like(probe)
        accepted = inspect.signature(type(self.optimizer)).parameters
        group = self.optimizer.param_groups[0]
        opt = type(self.optimizer)([probe], **{k: v for k, v in group.items() if k in accepted and k != "params"})
        opt.step()
        return sorted(k for k, v in opt.state[probe].items() if v is not None)

    def _watch_optimizer_state(self) -> None:
        """Make the optimizer's own state_dict() / load_state_dict() carry the per-row state tables,
        so the loop that saves every optimizer's state_dict resumes this one too."""
        self._state_keys = self._stateful_keys()
        self._awaiting_state = False  # a weight was loaded and the optimizer state not (see _check_state)
        self._state_loaded = False  # optimizer state was loaded since the last step
        self.optimizer.register_state_dict_post_hook(_with_tables(weakref.ref(self)))
        before, after = _loading_tables(weakref.ref(self))
        self.optimizer.register_load_state_dict_pre_hook(before)
        self.optimizer.register_load_state_dict_post_hook(after)

    def _check_state(self) -> None:
        """Before a step: a loaded weight needs its optimizer state, or a deliberate fresh start."""
        if self._awaiting_state:
            raise RuntimeError(
                f"HostEmbedding: its weight was loaded (load_state_dict) but not its optimizer state "
                f"({', '.join(self._state_keys)}), which state_dict() does not hold; training on would differ "
                "from the run that saved it. Load what was saved beside it: "
                "emb.load_optimizer_state_dict(saved_optimizer_state_dict) or emb.optimizer.load_state_dict(...), "
                "or call emb.reset_optimizer_state() to start the optimizer afresh (a fine-tune from pretrained "
                "weights).")

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # Only the weight, as nn.Embedding's: a model saved with a HostEmbedding loads strictly
        # into the same model with a plain nn.Embedding. The optimizer state is kept apart.
        destination[prefix + "weight"] = self.table.cpu()

    def optimizer_state_dict(self) -> dict[str, object]:
        """The optimizer state (per-row tables as host tensors of the table's shape, and scalars
        such as Adam's step), to save beside the model's state_dict. Hyper-parameters belong
        to the optimizer factory. `emb.optimizer.state_dict()` holds the same, with them."""
        return {key: (self._state_tables[key].cpu() if key in self._state_tables else value)
                for key, value in (self.optimizer.state.get(self._rows_weight, {}) if self.optimizer else {}).items()}

    def load_optimizer_state_dict(self, state: dict[str, object]) -> None:
        """Restore what optimizer_state_dict() returned, before or after load_state_dict()."""
        if self.optimizer is None:
            raise ValueError("this HostEmbedding has no optimizer (frozen): there is no optimizer state to load")
        self._set_optimizer_state(dict(state))

    def reset_optimizer_state(self) -> None:
        """Start the optimizer afresh (every row's state as before any step), on purpose: after
        loading pretrained weights to fine-tune, where no optimizer state was saved."""
        if self.optimizer is None:
            raise ValueError("this HostEmbedding has no optimizer (frozen): there is no optimizer state to reset")
        self._set_optimizer_state({})

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
        if self.optimizer is None:
            return
        if loaded:
            self._set_optimizer_state(loaded)
        elif self._state_keys and not self._state_loaded:
            # The state for this weight is elsewhere: the next step raises until it is loaded
            # (in either order) or reset on purpose.
            self._awaiting_state = True

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
        self._awaiting_state, self._state_loaded = False, True


def _with_tables(emb_ref: weakref.ref):
    """optimizer.state_dict() post-hook: the per-row state as whole tables (host tensors)."""
    def hook(optimizer, state_dict):
        emb = emb_ref()
        if emb is not None and emb._state_tables:
            state_dict["state"][0] = {**state_dict["state"].get(0, {}), **emb.optimizer_state_dict()}
        return state_dict
    return hook


def _loading_tables(emb_ref: weakref.ref):
    """optimizer.load_state_dict() pre- and post-hooks: the tables go into HostTables, never through
    torch's load (which would copy each to the device whole)."""
    pending: list[dict] = []

    def before(optimizer, state_dict):
        emb = emb_ref()
        if emb is None:
            return None
        entry = dict(state_dict["state"].get(0, {}))
        pending[:] = [entry]
        whole = emb.table.shape
        rows = {k: (v.new_empty(0, emb.embedding_dim) if isinstance(v, torch.Tensor) and tuple(v.shape) == whole
                    else v) for k, v in entry.items()}
        return {**state_dict, "state": {**state_dict["state"], **({0: rows} if entry else {})}}

    def after(optimizer):
        emb = emb_ref()
        if emb is not None and pending:
            emb._set_optimizer_state(pending.pop())
    return before, after
