"""HostEmbedding across processes: the part DistributedDataParallel would do for a parameter.

The table holds no `nn.Parameter`, so DDP never sees it; `HostEmbedding` inherits these
methods, which make every rank's table equal to rank 0's at construction and combine the
ranks' touched rows and gradients before a step (see HostEmbedding's docstring).
"""

from __future__ import annotations

import torch

from speedlib.transfer.backends import GPU_INDEXED


def world_size() -> int:
    """The default process group's size, 1 when torch.distributed is not in use."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class RankSync:
    """HostEmbedding's collectives; a mixin, it reads the embedding's table, rows and group."""

    def _process_group(self):
        if self._group is None and not self._group_given and world_size() > 1:
            raise RuntimeError("torch.distributed was initialised after this HostEmbedding was built, so its ranks "
                               "would train diverging tables: build it after init_process_group (or pass "
                               "process_group=dist.new_group([rank]) to train each rank's table on its own)")
        return self._group

    def _comm_device(self) -> torch.device:
        """Where collectives take tensors: the GPU for NCCL, the CPU for gloo."""
        backend = str(torch.distributed.get_backend(self._group))
        if "nccl" not in backend:
            return torch.device("cpu")
        if self.table.device.type == "cuda":
            return self.table.device
        return torch.device("cpu") if "gloo" in backend else torch.device("cuda", torch.cuda.current_device())

    def _combine(self, group) -> None:
        """Replace this rank's rows and gradient by the union of every rank's, the gradients
        summed by row and divided by the world size (DDP's average)."""
        dist = torch.distributed
        comm, world, dim = self._comm_device(), dist.get_world_size(group), self.embedding_dim
        w = self._rows_weight
        rows = (self._rows.to(comm, torch.int64) if self._rows is not None
                else torch.empty(0, dtype=torch.int64, device=comm))
        grad = w.grad.to(comm) if w.grad is not None else torch.zeros(0, dim, dtype=w.dtype, device=comm)
        # all_gather needs one size on every rank: share the counts, pad to the largest.
        counts = [torch.zeros(1, dtype=torch.int64, device=comm) for _ in range(world)]
        dist.all_gather(counts, torch.tensor([rows.numel()], device=comm), group=group)
        counts = [int(c) for c in counts]
        most = max(counts)
        if most == 0:  # no rank has a gradient: nothing to gather, nothing to update
            self.zero_grad()
            self._combined = True
            return
        rows = torch.cat([rows, rows.new_zeros(most - rows.numel())])
        grad = torch.cat([grad, grad.new_zeros(most - grad.shape[0], dim)])
        all_rows = [torch.empty_like(rows) for _ in range(world)]
        all_grads = [torch.empty_like(grad) for _ in range(world)]
        dist.all_gather(all_rows, rows, group=group)
        dist.all_gather(all_grads, grad, group=group)
        all_rows = [r[:n] for r, n in zip(all_rows, counts, strict=True)]
        union, where = torch.unique(torch.cat(all_rows), sorted=True, return_inverse=True)
        summed = torch.zeros(union.numel(), dim, dtype=grad.dtype, device=comm)
        start = 0
        for r, g in zip(all_rows, all_grads, strict=True):  # rank by rank, in the same order on every rank
            summed.index_add_(0, where[start:start + r.numel()], g[:r.numel()])
            start += r.numel()
        summed.div_(world)
        self._combined = True
        self._rows = union.to(self.table.device if self.table.backend in GPU_INDEXED else "cpu")
        weight = self.table.gather(self._rows).requires_grad_()  # this rank may not have looked these rows up
        weight.grad = summed.to(weight.device)
        self._swap_rows_weight(weight)

    def _copy_rank0_table(self, chunk_bytes: int = 64 << 20) -> None:
        """Make this rank's table equal to rank 0's, as DDP broadcasts parameters; only the
        chunks that differ are written, so ranks mapping one file write nothing."""
        dist = torch.distributed
        comm, (rows, dim) = self._comm_device(), self.table.shape
        chunk = max(1, chunk_bytes // (dim * self.table.dtype.itemsize))
        src = dist.get_global_rank(self._group, 0)
        differs = torch.zeros(1, device=comm)
        for start in range(0, rows, chunk):
            idx = torch.arange(start, min(rows, start + chunk))
            mine = self.table.gather(idx)
            theirs = mine.to(comm, copy=True)
            dist.broadcast(theirs, src=src, group=self._group)
            theirs = theirs.to(mine.device)
            if not torch.equal(theirs, mine):
                if self.table.writable:
                    self.table._write_unique(idx, theirs)
                else:
                    differs.fill_(1)
        dist.all_reduce(differs, op=dist.ReduceOp.MAX, group=self._group)  # every rank raises, or none
        if differs.item():
            raise ValueError("the ranks' read-only tables differ from rank 0's: map the same file on every rank")
