"""HostEmbedding across processes (speedlib/transfer/embedding_ranks.py): two gloo ranks, each with half
of every batch, end with the table and optimizer state of one process trained on the whole batch."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap

import pytest
import torch
from embedding_bits import DIM, ROWS, _batches, _loss
from transfer_bits import _reference

from speedlib.transfer import HostEmbedding

_DDP_RANK = textwrap.dedent("""
    import datetime, functools, sys
    import torch, torch.distributed as dist
    from speedlib.transfer import HostEmbedding

    rank, init, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)  # two ranks share the machine's cores
    w, batches, max_norm = torch.load(folder + "/data.pt")
    make = functools.partial(torch.optim.SGD, lr=0.5, momentum=0.9)
    early = HostEmbedding(8, 2, make, backend="pageable", device="cpu")  # built before the process group
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    result = {}
    early(torch.tensor([1])).sum().backward()
    try:
        early.step()
    except RuntimeError as e:
        result["early"] = str(e)
    torch.manual_seed(rank)  # different random tables: construction makes them rank 0's
    result["seeded"] = HostEmbedding(50, 3, make, backend="pageable", device="cpu").table.cpu().clone()
    singles = [dist.new_group([0]), dist.new_group([1])]  # every rank creates every group, in one order
    alone = HostEmbedding(8, 2, make, backend="pageable", device="cpu", process_group=singles[rank])
    emb = HostEmbedding(w.shape[0], w.shape[1], make, backend="pageable", device="cpu", weight=w)
    for step, (idx, target) in enumerate(batches):
        idx, target = idx.tensor_split(2)[rank], target.tensor_split(2)[rank]
        out = emb(idx)
        (((out - target) ** 2).sum() / out.shape[0]).backward()  # the mean over the local batch
        if step % 2:  # clipping sees the gradient summed over the ranks, as under DDP
            result.setdefault("norms", []).append(float(torch.nn.utils.clip_grad_norm_([emb.touched_rows()], max_norm)))
        emb.step()
    if rank == 0:  # a single-rank group needs no collective, so one rank stepping alone cannot hang
        alone(torch.tensor([0])).sum().backward()
        alone.step()
    result["table"], result["momentum"] = emb.table.cpu().clone(), emb._state_tables["momentum_buffer"].cpu().clone()
    torch.save(result, f"{folder}/rank{rank}.pt")
    dist.destroy_process_group()
""")


def _run_ranks(script: str, tmp_path, world: int = 2, timeout: float = 120) -> list[dict]:
    """Start `world` ranks of `script` (args: rank, init method, directory), each saving
    rank<r>.pt; a rank that fails or hangs fails the test within `timeout` seconds."""
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), init, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:  # after a timeout, or a rank that failed while its peer waits
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, log) in enumerate(zip(procs, logs, strict=True)):
        assert p.returncode == 0, f"rank {r} failed:\n{log}"
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def test_ddp_ranks_train_one_table_as_one_process_on_the_global_batch(tmp_path):
    """Two gloo ranks, each with half of every batch (different rows, some shared): every
    rank ends with the table and momentum of one process trained on the whole batch."""
    w, batches, max_norm = _reference(ROWS, DIM), _batches(steps=4), 1.0
    torch.save((w, batches, max_norm), tmp_path / "data.pt")
    ranks = _run_ranks(_DDP_RANK, tmp_path)
    single = HostEmbedding(ROWS, DIM, functools.partial(torch.optim.SGD, lr=0.5, momentum=0.9), backend="pageable",
                           device="cpu", weight=w)
    norms = []
    for step, (idx, target) in enumerate(batches):
        _loss(single(idx), target).backward()
        if step % 2:
            norms.append(float(torch.nn.utils.clip_grad_norm_([single.touched_rows()], max_norm)))
        single.step()
    assert all(n > max_norm for n in norms)  # the clipping did something
    for r, got in enumerate(ranks):
        assert "initialised after this HostEmbedding was built" in got["early"], r
        assert torch.equal(got["seeded"], ranks[0]["seeded"]), r
        torch.testing.assert_close(got["table"], single.table.cpu(), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got["momentum"], single._state_tables["momentum_buffer"].cpu(), rtol=1e-6, atol=1e-6)
        assert got["norms"] == pytest.approx(norms, rel=1e-6)
    # The ranks apply the same update to the same rows: their tables are bitwise equal.
    assert torch.equal(ranks[0]["table"], ranks[1]["table"]) and torch.equal(ranks[0]["momentum"], ranks[1]["momentum"])
