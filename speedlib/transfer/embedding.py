"""`HostEmbedding`: an embedding whose table and optimizer state live in a `HostTable`.

Imported through `speedlib.transfer` (or `speedlib.HostEmbedding`); what keeps several
ranks' tables and gradients in step is in speedlib/transfer/embedding_ranks.py, the training step
in embedding_step.py, the optimizer state and state_dict in embedding_state.py.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from speedlib.transfer.backends import GPU_INDEXED
from speedlib.transfer.embedding_ranks import RankSync, world_size
from speedlib.transfer.embedding_state import OptimizerState
from speedlib.transfer.embedding_step import RowStep, step_hooks
from speedlib.transfer.table import HostTable

_TIE_MESSAGE = (
    "HostEmbedding's table (emb.weight) was used in a computation that needs its gradient, which it "
    "would not get: only lookups emb(indices) train the table, so a layer tied to emb.weight (or to an "
    "nn.Parameter made from it) would silently stay untied. To tie an output layer, look the whole "
    "table up: F.linear(h, emb(torch.arange(emb.num_embeddings))) trains it as tying does (the whole "
    "table travels to the device each step), or score sampled candidate rows emb(candidate_ids). "
    "To use the values as a constant, take emb.weight.as_subclass(torch.Tensor).clone()")


class _TableWeight(torch.Tensor):
    """`HostEmbedding.weight`: the table's own memory as a tensor, so that in-place
    initialisation (`.data.uniform_`, `.normal_`, `.copy_`, `nn.init.*`) writes the rows.

    It is no leaf of any graph: nn.Embedding's weight would receive a gradient from every
    computation that uses it, this one cannot. So an operation under grad mode that mixes it
    (or a tensor derived from it: results keep this type) with tensors requiring grad raises
    instead of training silently without it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.is_grad_enabled() and _needs_grad(args, kwargs):
            raise RuntimeError(_TIE_MESSAGE)
        return super().__torch_function__(func, types, args, kwargs)


def _needs_grad(args, kwargs) -> bool:
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    with torch._C.DisableTorchFunctionSubclass():  # reading requires_grad is itself a torch function
        return any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves)


class HostEmbedding(RankSync, RowStep, OptimizerState, nn.Module):
    """An embedding whose table and optimizer state live in a `HostTable`, trained with any
    dense `torch.optim` optimizer.

    optimizer: called with a list of one tensor, returns the optimizer, e.g.
    `functools.partial(torch.optim.Adam, lr=1e-3)`; reach it as `.optimizer` (for LR schedulers).
    Stepping it (`emb.optimizer.step()`, a loop stepping every optimizer, or
    `scaler.step(emb.optimizer)` under AMP's GradScaler, which unscales, checks for infs and
    skips as for any optimizer) is `emb.step()`: step hooks gather the touched rows and their
    state before the update and write them back after it.
    weight: a tensor to copy into the table, or a `HostTable` to train in place (no copy,
    e.g. `HostTable.from_file`; it brings its own backend, device and dtype, so leave those
    unset). Without one, rows start N(0, 1) as in `nn.Embedding`. A table is trained by one
    non-frozen HostEmbedding at a time (a second one raises ValueError); frozen ones may
    share it. For tied weights, look one HostEmbedding up several times per step.

    A training step is any number of lookups, backward, `emb.step()`:
      1. each forward gathers the distinct rows its indices use onto the device as a leaf
         tensor of its own, so lookups of one step need not know about each other;
      2. when backward reaches a leaf, its gradient is added by row into the step's
         gradient (a post-accumulate-grad hook), so a row several lookups share gets the sum
         of their gradients, as `nn.Embedding` would;
      3. step() gathers the same rows of every optimizer state tensor, runs the optimizer's
         own step on them (each touched row updated once), and writes rows and state back.
    Word2vec's `emb(pos)`, `emb(neg)`, one backward, one step() is therefore one step.
    **Update semantics: only rows that received a gradient change, with their own state**, as
    in `torch.optim.SparseAdam`; scalar state (Adam's step count) is shared by all rows, also
    as in SparseAdam. So SGD without momentum or weight decay equals `nn.Embedding` + SGD
    exactly; Adam(eps) is exactly SparseAdam whose eps at step t is eps * sqrt(1 - beta2**t)
    (SparseAdam adds eps before dividing by that bias correction, Adam after), so it is close
    to SparseAdam with the same eps only where gradients are far above eps; momentum and
    weight decay act on touched rows only (lazy updates).
    A row's state starts as what the optimizer's step leaves after a zero gradient: the
    initial state for SGD, Adam, AdamW, RMSprop, Adagrad (its initial_accumulator_value),
    Adadelta and Adamax.

    Lookups that never see a backward (evaluation without `torch.no_grad()`, a loss that is
    dropped) touch nothing: no gradient reaches their rows, so step() leaves those rows and
    their state alone, and their leaves are freed with their outputs. step() with no gradient
    at all changes nothing; in one process it raises if no lookup tracked gradients since
    the last step (a forward under no_grad followed by step() is a bug). `zero_grad()`
    drops the gradients gathered so far without applying them. A gradient that arrives after step()
    (from an output looked up before it) is applied at the next step() to the rows' current
    values, as a dense parameter's would be.

    padding_idx: as in `nn.Embedding` (negative values count from the end): lookups return
    that row, it gets no gradient and is never written, not even by momentum or weight
    decay; random initialisation sets it to zeros. freeze=True: lookups return rows that do
    not require grad, and step() writes nothing (it drops pending gradients); the setter
    `emb.freeze = False` unfreezes. See `from_pretrained`. max_norm, norm_type,
    scale_grad_by_freq: as in `nn.Embedding` (max_norm rewrites looked-up rows in the table);
    sparse=True is the update this class always does, sparse=False is refused. A tensor
    `weight` sets the dtype unless `dtype` is given. `emb.weight`: the table's memory, for
    in-place initialisation and reading; see the property.

    Gradient clipping: `emb.touched_rows()` after the last backward returns the dense tensor
    holding this step's rows, whose `.grad` is their summed gradient, so
    `clip_grad_norm_([*model.parameters(), emb.touched_rows()], max_norm)` then `emb.step()`
    clips as for `nn.Embedding` (rows no lookup touched have zero gradient and add nothing
    to the norm). The same holds for any code that reads or scales gradients before step().

    DistributedDataParallel: the table holds no `nn.Parameter`, so DDP never sees it; this
    module does the part DDP would. With `process_group` (default: the default group when
    torch.distributed is initialised with more than one rank at construction), construction
    makes every rank's table equal to rank 0's (chunks that differ are copied from it, as
    DDP broadcasts parameters), and step() (or touched_rows()) all-gathers every rank's rows
    and gradients, sums them by row, divides by the world size like DDP's averaging, and
    every rank applies the same update to the union of rows: one process on the global
    batch, when the loss is a mean over the local batch. Construction, step() and
    touched_rows() are collectives then: call them on every rank. Gloo communicates CPU
    tensors, NCCL CUDA tensors. An embedding built before init_process_group refuses to step
    on more than one rank; pass a single-rank group (`dist.new_group([rank])`) to train each
    rank's table on its own.

    Memory-mapped tables: train a `HostTable.from_file` table (or pass a `.npy` path or
    `numpy.memmap` to `from_pretrained`) and its rows are updated in the file. Optimizer
    state tables are ordinary RAM, the size of the table each (Adam: two), and are saved
    through `state_dict()`.

    `state_dict()` holds the table (`weight`) alone, as nn.Embedding's: it loads strictly
    into the same model built with a plain nn.Embedding, and back. The optimizer state is
    saved beside it, like any optimizer's: `emb.optimizer.state_dict()` (it carries the
    per-row state tables as host tensors) or `emb.optimizer_state_dict()`, loaded with
    `emb.optimizer.load_state_dict()` or `emb.load_optimizer_state_dict()`, before or after
    `load_state_dict()`; training on is then bitwise the uninterrupted run. A weight loaded
    without its optimizer state (when the optimizer keeps any) makes the next step raise,
    naming the missing state, until it is loaded or `emb.reset_optimizer_state()` starts the
    optimizer afresh on purpose. A state_dict of an older speedlib with `optimizer.<name>`
    entries restores them    (an embedding without an optimizer ignores them). Device placement is fixed at
    construction: `.to()` on the module does not move the table. `model.double()`, `.half()`
    and `.to(dtype)` make the lookups return the module's dtype; the table and its optimizer
    state keep theirs.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer] | None,
                 *, backend: str | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, weight: torch.Tensor | HostTable | None = None,
                 padding_idx: int | None = None, freeze: bool = False,
                 process_group=None, max_norm: float | None = None, norm_type: float = 2.0,
                 scale_grad_by_freq: bool = False, sparse: bool | None = None):
        super().__init__()
        self._check_embedding_options(max_norm, sparse)
        if optimizer is None:
            if not freeze:
                raise ValueError("optimizer=None is for frozen embeddings only (freeze=True): "
                                 "training needs an optimizer")
        elif not callable(optimizer):
            raise TypeError("optimizer must be a callable taking a list of tensors, "
                            "e.g. functools.partial(torch.optim.Adam, lr=1e-3)")
        pad = self._padding_index(padding_idx, num_embeddings)
        if isinstance(weight, HostTable):
            if (backend, device, dtype) != (None, None, None):
                raise ValueError("a HostTable weight brings its own backend, device and dtype: leave those unset")
            if weight.shape != (num_embeddings, embedding_dim):
                raise ValueError(f"weight must have shape {(num_embeddings, embedding_dim)}, got {weight.shape}")
            self.table = weight
        else:
            if weight is not None and tuple(weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError(f"weight must have shape {(num_embeddings, embedding_dim)}, got {tuple(weight.shape)}")
            if dtype is None:  # as nn.Embedding.from_pretrained, the table takes the weight's dtype
                dtype = weight.dtype if weight is not None else torch.float32
            self.table = HostTable(num_embeddings, embedding_dim, dtype=dtype,
                                   backend=backend or "auto", device=device)
            if weight is not None:
                self.table.copy_(weight)
            else:
                self._init_normal()
                if pad is not None:  # as nn.Embedding's reset_parameters does
                    self.table.copy_(torch.zeros(1, embedding_dim, dtype=self.table.dtype), pad)
        self.padding_idx = pad
        if max_norm is not None and not self.table.writable:
            raise ValueError(f"max_norm renormalises looked-up rows in the table, which maps {self.table.file!r} "
                             "read-only: open it with mode 'r+', or leave max_norm unset")
        self.max_norm, self.norm_type, self.scale_grad_by_freq = max_norm, norm_type, bool(scale_grad_by_freq)
        self.sparse = True  # its update is always sparse=True's (only touched rows change)
        # The rows of the current step. A plain tensor, not an nn.Parameter, so that a model
        # optimizer built from model.parameters() does not update them a second time.
        self._rows_weight = torch.empty(0, embedding_dim, dtype=self.table.dtype, device=self.table.device,
                                        requires_grad=True)
        self.optimizer = None if optimizer is None else optimizer([self._rows_weight])
        if optimizer is not None and not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer(...) must return a torch.optim.Optimizer, got {type(self.optimizer).__name__}")
        self._stepping = False  # emb.step() is running the optimizer
        self._output_dtype: torch.dtype | None = None  # the lookups' dtype after model.double() etc. (see _apply)
        if self.optimizer is not None:
            before, after = step_hooks(weakref.ref(self))
            self.optimizer.register_step_pre_hook(before)
            self.optimizer.register_step_post_hook(after)
        self._freeze = False
        self.freeze = freeze  # the setter checks that the table can be trained
        self._state_tables: dict[str, HostTable] = {}
        self._rows: torch.Tensor | None = None  # the rows holding gradient this step (sorted, distinct)
        self._tracked = False  # a lookup tracked gradients since the last step
        self._generation = 0  # counts table changes: a lookup's rows are stale once the table has changed
        self._rows_generation = 0  # the generation whose values _rows_weight holds
        self._combined = False  # this step's gradients are already summed over the ranks
        # Some optimizers (Adagrad) create their state in the constructor, shaped like the
        # empty rows tensor: give those their tables now, before a step needs them.
        fresh = self.optimizer.state.get(self._rows_weight, {}) if self.optimizer else {}
        for key, value in fresh.items():
            if isinstance(value, torch.Tensor) and value.shape == self._rows_weight.shape:
                self._state_tables[key] = self._new_state_table(key)
        # What load_state_dict restores for entries a state_dict lacks.
        self._fresh_state = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in fresh.items()}
        self._state_keys, self._awaiting_state, self._state_loaded = [], False, False
        if self.optimizer is not None:
            self._watch_optimizer_state()
        self._group_given = process_group is not None
        if process_group is None and world_size() > 1:
            process_group = torch.distributed.group.WORLD
        self._group = None
        if process_group is not None and torch.distributed.get_world_size(process_group) > 1:
            self._group = process_group
            self._copy_rank0_table()

    @classmethod
    def from_pretrained(cls, embeddings, optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer] | None = None,
                        *, freeze: bool = True, padding_idx: int | None = None, backend: str | None = None,
                        device: torch.device | str | None = None, process_group=None, max_norm: float | None = None,
                        norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                        sparse: bool | None = None) -> HostEmbedding:
        """An embedding holding `embeddings`, like `nn.Embedding.from_pretrained` (frozen by default).

        embeddings: a 2-D tensor or NumPy array, copied into a table of `backend` (default
        'auto') with its dtype; a `HostTable`, used as is; or a `.npy` path or
        `numpy.memmap`, mapped rather than copied (`HostTable.from_file`: 'auto', 'pageable'
        or 'pinned'; a path opens read-only when frozen, read-write otherwise).
        The padding row keeps its pretrained value, as in nn.Embedding.
        """
        import numpy as np  # noqa: PLC0415 - speedlib needs torch alone: the module must import without NumPy

        if isinstance(embeddings, (str, os.PathLike, np.memmap)):
            embeddings = HostTable.from_file(embeddings, mode="r" if freeze else "r+", backend=backend or "auto",
                                             device=device)
            backend = device = None
        elif isinstance(embeddings, np.ndarray):
            embeddings = torch.from_numpy(embeddings)
        if isinstance(embeddings, HostTable):
            shape, dtype = embeddings.shape, None
        elif isinstance(embeddings, torch.Tensor):
            if embeddings.dim() != 2:
                raise ValueError(f"embeddings must be 2-D (rows x dim), got shape {tuple(embeddings.shape)}")
            shape, dtype = tuple(embeddings.shape), embeddings.dtype
        else:
            raise TypeError("embeddings must be a tensor, a NumPy array, a HostTable, or a .npy path / numpy.memmap, "
                            f"got {type(embeddings).__name__}")
        return cls(*shape, optimizer, backend=backend, device=device, dtype=dtype, weight=embeddings,
                   padding_idx=padding_idx, freeze=freeze, process_group=process_group, max_norm=max_norm,
                   norm_type=norm_type, scale_grad_by_freq=scale_grad_by_freq, sparse=sparse)

    @staticmethod
    def _check_embedding_options(max_norm, sparse) -> None:
        if sparse is not None and not sparse:
            raise ValueError("sparse=False asks for nn.Embedding's dense update, which changes every row each step; "
                             "HostEmbedding updates only the rows a batch touched (sparse=True's semantics, as with "
                             "SparseAdam), since a dense update would move the whole table to the device every "
                             "step: leave sparse unset or pass sparse=True")
        if max_norm is not None and not (isinstance(max_norm, (int, float)) and max_norm > 0):
            raise ValueError(f"max_norm must be positive (rows with a larger norm are scaled down to it), "
                             f"got {max_norm!r}")

    @staticmethod
    def _padding_index(padding_idx, rows: int) -> int | None:
        if padding_idx is None:
            return None
        if not isinstance(padding_idx, int) or isinstance(padding_idx, bool):
            raise TypeError(f"padding_idx must be an int or None, got {padding_idx!r}")
        if not -rows <= padding_idx < rows:
            raise ValueError(f"padding_idx must be within num_embeddings: -{rows} <= padding_idx < {rows}, "
                             f"got {padding_idx}")
        return padding_idx % rows  # negative counts from the end, as in nn.Embedding

    def _init_normal(self, chunk: int = 1 << 20) -> None:
        # N(0, 1) like nn.Embedding, generated a chunk at a time: a 10M-row table needs no
        # second full-size temporary.
        rows, dim = self.table.shape
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            self.table.copy_(torch.randn(n, dim, dtype=self.table.dtype), start)

    @property
    def num_embeddings(self) -> int:
        return self.table.shape[0]

    @property
    def embedding_dim(self) -> int:
        return self.table.shape[1]

    @property
    def weight(self) -> torch.Tensor:
        """The table's memory as a (rows, dim) tensor, for in-place initialisation and reading
        (`emb.weight.data.uniform_(-0.1, 0.1)`, `nn.init.normal_(emb.weight)`, `.copy_(w)`).
        Not a parameter: only lookups train the table, and using it where a gradient would be
        needed (tying another layer to it) raises, naming the tie that works."""
        if not self.table.writable:
            # A write through a view of a read-only mapping would crash the process, not raise.
            raise ValueError(f"the table maps {self.table.file!r} read-only, so it has no writable weight: read "
                             "rows with emb.table.gather(indices), or open the file with mode 'r+'")
        # Writes through the view change rows that pending gradients and lookups gathered:
        # step() and backward re-gather them (as nn.Embedding's step sees its weight as it is).
        self._generation += 1
        return self.table._storage().as_subclass(_TableWeight)

    def __setattr__(self, name: str, value) -> None:
        if name == "weight":  # nn.Module would otherwise report "attribute 'weight' already exists"
            raise AttributeError("HostEmbedding.weight cannot be replaced: it is the host table itself. Write new "
                                 "values into it with emb.weight.data.copy_(w), or build the embedding with weight=w "
                                 "(HostEmbedding.from_pretrained(w, ...))")
        super().__setattr__(name, value)

    @property
    def freeze(self) -> bool:
        """True: lookups only (no gradients), step() writes nothing."""
        return self._freeze

    @freeze.setter
    def freeze(self, value: bool) -> None:
        if not value and self.optimizer is None:
            raise ValueError("this embedding was built without an optimizer (optimizer=None), so it can only be frozen")
        if not value and not self.table.writable:
            raise ValueError(f"the table maps {self.table.file!r} read-only and cannot be trained: "
                             "open it with mode 'r+' (numpy.load(path, mmap_mode='r+'))")
        if not value:
            # Two trainers of one table would each write back rows gathered before the
            # other's step(), silently losing its update.
            other = self.table._trainer() if self.table._trainer is not None else None
            if other is not None and other is not self and not other.freeze:
                raise ValueError("this HostTable is already trained by another HostEmbedding, and two would each "
                                 "overwrite the other's updates: look one HostEmbedding up several times per step "
                                 "(emb(a), emb(b), one backward, one emb.step()), or freeze the other first")
            self.table._trainer = weakref.ref(self)
        self._freeze = bool(value)

    def extra_repr(self) -> str:
        extra = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        extra += ", freeze=True" if self.freeze else ""
        extra += "" if self.max_norm is None else f", max_norm={self.max_norm}, norm_type={self.norm_type}"
        extra += ", scale_grad_by_freq=True" if self.scale_grad_by_freq else ""
        return (f"{self.num_embeddings}, {self.embedding_dim}{extra}, backend={self.table.backend!r}, "
                f"device={self.table.device}, optimizer={type(self.optimizer).__name__ if self.optimizer else None}")

    def forward(self, indices) -> torch.Tensor:
        out = self._lookup(indices)
        # After model.double() / .half() the lookups come out in the module's dtype, as
        # nn.Embedding's would; the gradient goes back to the table's dtype through the cast.
        return out if self._output_dtype is None else out.to(self._output_dtype)

    def _apply(self, fn, recurse: bool = True):
        """model.double(), .half(), .to(dtype): the table keeps its dtype (it is host memory,
        maybe a file) and so does the optimizer state; the lookups' output follows the module."""
        try:
            dtype = fn(torch.zeros((), dtype=self.table.dtype)).dtype
        except (RuntimeError, AssertionError):  # a device this process lacks: the module's own tensors will say so
            dtype = self.table.dtype
        self._output_dtype = None if dtype == self.table.dtype else dtype
        return super()._apply(fn, recurse)

    def _lookup(self, indices) -> torch.Tensor:
        idx = self.table._indices(indices)
        track = not self.freeze and torch.is_grad_enabled()
        if not track and self.max_norm is None:
            return self.table.gather(idx)
        if self.table.backend in GPU_INDEXED:  # these index on the GPU: find the distinct rows there too
            idx = idx.to(self.table.device, non_blocking=True)
        rows, inverse = torch.unique(idx.reshape(-1), sorted=True, return_inverse=True)
        values = self.table.gather(rows)
        if self.max_norm is not None:
            self._renorm(rows, values)
        inverse = inverse.to(self.table.device, non_blocking=True).reshape(idx.shape)
        if not track:
            return F.embedding(inverse, values)
        self._tracked = True
        leaf = values.requires_grad_()
        # Nothing here keeps the leaf: a lookup that never sees a backward is freed with its
        # output. One that does hands its gradient over in the hook.
        generation = self._generation
        leaf.register_post_accumulate_grad_hook(lambda t: self._accumulate(rows, t, generation))
        # Distinct rows have the frequencies of the indices they stand for, so scaling by
        # the frequency of `inverse` is nn.Embedding's scaling by index frequency.
        return F.embedding(inverse, leaf, scale_grad_by_freq=self.scale_grad_by_freq)

    def _renorm(self, rows: torch.Tensor, values: torch.Tensor) -> None:
        """nn.Embedding's max_norm: looked-up rows whose norm exceeds it are scaled down, in the
        table too (with torch's own renorm kernel, so the values are nn.Embedding's)."""
        before = values.clone()
        torch.embedding_renorm_(values, torch.arange(rows.numel(), device=values.device), self.max_norm, self.norm_type)
        changed = (values != before).any(1)
        if changed.any():  # write back only what changed: a memory-mapped table stays clean otherwise
            self.table._write_unique(rows[changed.to(rows.device)], values[changed])
            self._generation += 1  # rows gathered before (pending gradients, other lookups) are stale

    # --- one step: _accumulate, touched_rows, zero_grad, step, _prepare_step, _finish_step,
    # _swap_rows_weight (from RowStep, embedding_step.py) ---

    # --- several processes: _process_group, _combine, _copy_rank0_table (from RankSync, embedding_ranks.py) ---

    # --- state: _new_state_table, optimizer_state_dict, load_optimizer_state_dict and the
    # state_dict methods (from OptimizerState, embedding_state.py) ---
