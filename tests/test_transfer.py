"""speedlib.transfer against plain PyTorch: a HostEmbedding trained with torch.optim equals
nn.Embedding trained as PyTorch does (SGD bitwise, Adam as SparseAdam, several lookups per
step, padding_idx, from_pretrained, clipping, nn.Embedding's options, GradScaler), on the CPU
and on every GPU backend; and the benchmark (benchmarks/bench_transfer.py), its plain-PyTorch
baselines and what it records.

The rest sits beside the module it tests: test_host_table.py (HostTable, every backend against
plain indexing), test_transfer_backends.py, test_transfer_kernel.py, test_transfer_auto.py,
test_host_embedding.py and test_embedding_ranks.py. The GPU backends are skipped without a GPU.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import types

import pytest
import torch
from embedding_bits import DIM, ROWS, _batches, _host, _loss, _train_host, _train_reference, _with_padding
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn import functional as F
from transfer_bits import ALL, GPU_BACKENDS, HAS_CUDA, _backend_params, _reference, _train_device, needs_cuda

from benchmarks import bench_transfer as bench
from speedbench import words
from speedbench.measure import instruments, workloads
from speedlib.transfer import HostEmbedding, HostTable
from speedlib.transfer.auto import Path

# --- CPU-hosted embedding training against nn.Embedding and torch.optim -------------------

def test_embedding_with_sgd_equals_nn_embedding_exactly():
    w = _reference(ROWS, DIM)
    make = functools.partial(torch.optim.SGD, lr=0.1)
    ref_w, ref_outs = _train_reference(w, make, _batches())
    emb, outs = _train_host(w, make, _batches())
    assert all(torch.equal(a, b) for a, b in zip(outs, ref_outs, strict=True))
    assert torch.equal(emb.table.cpu(), ref_w)
    assert torch.equal(emb.table.cpu()[ROWS // 2:], w[ROWS // 2:])  # untouched rows stay


def test_embedding_with_adam_equals_sparse_adam():
    w = _reference(ROWS, DIM)
    ref_w, _ = _train_reference(w, functools.partial(torch.optim.SparseAdam, lr=0.05), _batches(), sparse=True)
    emb, _ = _train_host(w, functools.partial(torch.optim.Adam, lr=0.05), _batches())
    # Not bitwise: SparseAdam adds eps before dividing by the bias correction, Adam after.
    torch.testing.assert_close(emb.table.cpu(), ref_w, rtol=1e-5, atol=1e-6)
    assert not torch.equal(emb.table.cpu(), w)


def test_embedding_with_adagrad_equals_sparse_adagrad():
    w = _reference(ROWS, DIM)
    make = functools.partial(torch.optim.Adagrad, lr=0.1, initial_accumulator_value=0.3)
    ref_w, _ = _train_reference(w, make, _batches(), sparse=True)
    emb, _ = _train_host(w, make, _batches())
    torch.testing.assert_close(emb.table.cpu(), ref_w, rtol=1e-6, atol=1e-7)
    # Untouched rows keep the initial accumulator, as in a fresh Adagrad.
    assert torch.equal(emb._state_tables["sum"].cpu()[ROWS // 2:], torch.full((ROWS // 2, DIM), 0.3))


@pytest.mark.parametrize("make", [
    functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=0.01),
    functools.partial(torch.optim.Adam, lr=0.05),
    functools.partial(torch.optim.AdamW, lr=0.05, weight_decay=0.1),
    functools.partial(torch.optim.RMSprop, lr=0.01, momentum=0.5, centered=True),
    functools.partial(torch.optim.Adagrad, lr=0.1),
], ids=["sgd-momentum", "adam", "adamw", "rmsprop", "adagrad"])
def test_embedding_touching_every_row_equals_dense_training(make):
    """When each step touches every row, touched-rows updates are dense updates."""
    w = _reference(ROWS, DIM)
    ref_w, ref_outs = _train_reference(w, make, _batches(coverage="full"))
    emb, outs = _train_host(w, make, _batches(coverage="full"))
    torch.testing.assert_close(emb.table.cpu(), ref_w, rtol=1e-6, atol=1e-6)
    for a, b in zip(outs, ref_outs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# Training on the GPU, every backend including 'pageable' delivering rows there.
ON_GPU = [pytest.param("pageable", marks=needs_cuda, id="pageable-to-cuda"), *_backend_params(GPU_BACKENDS)]


@pytest.mark.parametrize("backend", ON_GPU)
def test_embedding_on_gpu_backends_equals_pageable(backend):
    """Against 'pageable' trained on the CPU: Adam's GPU kernels round differently from the
    CPU's, so equal to a tolerance, not bitwise."""
    w = _reference(ROWS, DIM)
    make = functools.partial(torch.optim.Adam, lr=0.05)
    host, _ = _train_host(w, make, _batches())
    gpu, _ = _train_host(w, make, _batches(), backend=backend, device="cuda")
    assert host.table.device.type == "cpu" and gpu.table.device.type == "cuda"
    torch.testing.assert_close(gpu.table.cpu().cpu(), host.table.cpu(), rtol=1e-5, atol=1e-6)


# --- several lookups per step ----------------------------------------------------------------

def _sgns_batches(steps=4, batch=8, negatives=3, seed=5):
    """(centre, positive, negatives) word indices; contexts use rows < 20 only, so they repeat."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, ROWS, (batch,), generator=gen), torch.randint(0, ROWS // 2, (batch,), generator=gen),
             torch.randint(0, ROWS // 2, (batch, negatives), generator=gen)) for _ in range(steps)]


def _sgns_loss(centre, pos, neg):
    """Skip-gram with negative sampling: the positive context scores high, the negatives low."""
    return -(F.logsigmoid((centre * pos).sum(-1)) + F.logsigmoid(-(centre.unsqueeze(1) * neg).sum(-1)).sum(-1)).mean()


def _sgns_reference(w_in, w_out, make_opt, batches, shared, sparse=False):
    emb_in = nn.Embedding.from_pretrained(w_in.clone(), freeze=False, sparse=sparse)
    emb_out = emb_in if shared else nn.Embedding.from_pretrained(w_out.clone(), freeze=False, sparse=sparse)
    opt = make_opt(list(emb_in.parameters()) + ([] if shared else list(emb_out.parameters())))
    for centre, pos, neg in batches:
        opt.zero_grad()
        _sgns_loss(emb_in(centre), emb_out(pos), emb_out(neg)).backward()
        opt.step()
    return emb_in.weight.detach(), emb_out.weight.detach()


def _sgns_host(w_in, w_out, make_opt, batches, shared, backend="pageable", device=None, **kwargs):
    def build(w):
        return HostEmbedding(ROWS, DIM, make_opt, backend=backend, device=device or _train_device(backend), weight=w,
                             **kwargs)

    emb_in = build(w_in)
    emb_out = emb_in if shared else build(w_out)
    for centre, pos, neg in batches:
        _sgns_loss(emb_in(centre), emb_out(pos), emb_out(neg)).backward()  # emb_out: two lookups, one step
        for emb in {emb_in, emb_out}:
            emb.step()
    return emb_in.table.cpu().cpu(), emb_out.table.cpu().cpu()  # 'device' tables: .cpu() is a copy


@pytest.mark.parametrize("shared", [False, True], ids=["in-and-out-tables", "one-table"])
def test_word2vec_lookups_in_one_step_with_sgd_equal_nn_embedding(shared):
    """Positives and negatives looked up separately, one backward, one step: the gradients of a
    row used by both lookups add up, and every touched row moves once, as with nn.Embedding."""
    w_in, w_out = _reference(ROWS, DIM, seed=1), _reference(ROWS, DIM, seed=2)
    make = functools.partial(torch.optim.SGD, lr=0.5)
    batches = _sgns_batches()
    got, want = _sgns_host(w_in, w_out, make, batches, shared), _sgns_reference(w_in, w_out, make, batches, shared)
    if shared:  # three lookups of one row: autograd may add the three gradients in another order
        torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    else:  # two lookups: a + b == b + a, so the sums are bitwise those of nn.Embedding
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not torch.equal(got[1], w_out if not shared else w_in)


@pytest.mark.parametrize("shared", [False, True], ids=["in-and-out-tables", "one-table"])
def test_word2vec_lookups_in_one_step_with_adam_equal_sparse_adam(shared):
    """Adam's state makes a row updated twice in a step, or a gradient split over two updates,
    visibly different from SparseAdam's one update with the summed gradient."""
    w_in, w_out = _reference(ROWS, DIM, seed=1), _reference(ROWS, DIM, seed=2)
    batches = _sgns_batches()
    # eps enters SparseAdam before the bias correction and Adam after it. Here gradients that
    # nearly cancel make it matter (2e-4 apart with the default 1e-8), so both get an eps
    # too small to count; what remains is rounding (1e-7).
    got = _sgns_host(w_in, w_out, functools.partial(torch.optim.Adam, lr=0.05, eps=1e-12), batches, shared)
    want = _sgns_reference(w_in, w_out, functools.partial(torch.optim.SparseAdam, lr=0.05, eps=1e-12), batches, shared,
                           sparse=True)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ON_GPU)
def test_several_lookups_with_padding_on_gpu_backends_equal_pageable(backend):
    """The GPU-indexed backends find distinct rows and merge lookups on the GPU; compared with
    'pageable' on the CPU to a tolerance, as GPU kernels round differently."""
    w_in, w_out = _reference(ROWS, DIM, seed=1), _reference(ROWS, DIM, seed=2)
    make = functools.partial(torch.optim.Adam, lr=0.05)
    host = _sgns_host(w_in, w_out, make, _sgns_batches(), False, padding_idx=1)
    gpu = _sgns_host(w_in, w_out, make, _sgns_batches(), False, backend=backend, device="cuda", padding_idx=1)
    for g, h in zip(gpu, host, strict=True):
        torch.testing.assert_close(g, h, rtol=1e-5, atol=1e-6)
    assert torch.equal(gpu[1][1], w_out[1])


# --- padding_idx, from_pretrained, clipping -------------------------------------------------

@pytest.mark.parametrize("pad", [3, -1], ids=["pad-3", "pad-minus-1"])
def test_padding_idx_equals_nn_embedding(pad):
    w = _reference(ROWS, DIM)
    make = functools.partial(torch.optim.SGD, lr=0.1)
    batches = _with_padding(_batches(), pad % ROWS)
    ref_w, ref_outs = _train_reference(w, make, batches, padding_idx=pad)
    emb, outs = _train_host(w, make, batches, padding_idx=pad)
    assert emb.padding_idx == pad % ROWS
    assert all(torch.equal(a, b) for a, b in zip(outs, ref_outs, strict=True))  # lookups return the padding row's value
    assert torch.equal(emb.table.cpu(), ref_w)
    assert torch.equal(emb.table.cpu()[pad], w[pad])


def test_from_pretrained_unfrozen_trains_as_nn_embedding_from_pretrained():
    w, pad = _reference(ROWS, DIM), 2
    make = functools.partial(torch.optim.SGD, lr=0.1)
    batches = _with_padding(_batches(), pad)
    ref = nn.Embedding.from_pretrained(w.clone(), freeze=False, padding_idx=pad)
    opt = make(ref.parameters())
    for idx, target in batches:
        opt.zero_grad()
        _loss(ref(idx), target).backward()
        opt.step()
    emb = HostEmbedding.from_pretrained(w, make, freeze=True, padding_idx=pad, backend="pageable", device="cpu")
    assert not emb(batches[0][0]).requires_grad  # frozen: no gradient anywhere...
    emb.step()
    assert torch.equal(emb.table.cpu(), w)
    emb.freeze = False  # ...until unfrozen
    emb, _ = _train_host(None, None, batches, emb=emb)
    assert emb.padding_idx == pad and torch.equal(emb.table.cpu(), ref.weight.detach())


def test_touched_rows_clip_like_nn_embedding():
    """clip_grad_norm_ over the model's parameters and touched_rows() clips exactly what it
    clips with nn.Embedding: rows no lookup used have zero gradient and add nothing to the
    norm. Two overlapping lookups per step: the norm is of their summed gradient."""
    w, max_norm = _reference(ROWS, DIM), 0.5
    gen = torch.Generator().manual_seed(4)
    steps = [(torch.randint(0, 10, (6,), generator=gen), torch.randint(5, 15, (6,), generator=gen)) for _ in range(4)]
    torch.manual_seed(0)
    head = nn.Linear(DIM, 1)
    results = []
    for host in (False, True):
        lin = nn.Linear(DIM, 1)
        lin.load_state_dict(head.state_dict())
        if host:
            emb = HostEmbedding(ROWS, DIM, functools.partial(torch.optim.SGD, lr=0.5), backend="pageable", device="cpu",
                                weight=w)
            assert emb.touched_rows().grad is None  # before any backward: nothing to clip
            opt = torch.optim.SGD(lin.parameters(), lr=0.5)
        else:
            emb = nn.Embedding.from_pretrained(w.clone(), freeze=False)
            opt = torch.optim.SGD([*lin.parameters(), emb.weight], lr=0.5)
        norms = []
        for a, b in steps:
            opt.zero_grad()
            (lin(emb(a)).square().mean() + lin(emb(b)).square().mean()).backward()
            params = [*lin.parameters(), emb.touched_rows() if host else emb.weight]
            norms.append(torch.nn.utils.clip_grad_norm_(params, max_norm))
            opt.step()
            if host:
                emb.step()
        results.append((torch.stack(norms), emb.table.cpu() if host else emb.weight.detach(), lin.weight.detach()))
    (ref_norms, ref_w, ref_lin), (norms, got_w, got_lin) = results
    assert (ref_norms > max_norm).all()  # every step was clipped
    torch.testing.assert_close(norms, ref_norms, rtol=1e-6, atol=0)
    torch.testing.assert_close(got_w, ref_w, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got_lin, ref_lin, rtol=1e-6, atol=1e-7)


# --- drop-in gaps with nn.Embedding (issue 31): .weight, nn.Embedding's options, GradScaler, Adam ---

@pytest.mark.parametrize("backend", ALL)
def test_weight_initialisers_write_into_the_table_as_into_nn_embedding(backend):
    """`emb.weight.data.uniform_(...)`, `.normal_`, `.copy_` and nn.init change the rows the
    table holds, exactly as they change nn.Embedding's weight. The reference lives where the
    weight does ('device': the GPU), so both draw from the same generator."""
    emb = _host(backend=backend)
    ref = nn.Embedding(ROWS, DIM, device=emb.weight.device)
    inits = [lambda w: w.data.uniform_(-0.1, 0.1), lambda w: w.data.normal_(0, 0.02),
             lambda w: nn.init.xavier_uniform_(w),
             lambda w: w.data.copy_(torch.arange(ROWS * DIM).reshape(ROWS, DIM).float())]
    for init in inits:
        for w in (emb.weight, ref.weight):
            torch.manual_seed(7)
            init(w)
        assert torch.equal(emb.table.cpu().cpu(), ref.weight.detach().cpu())
        idx = torch.tensor([[3, 5], [5, 39]])
        assert torch.equal(emb(idx).detach().cpu(), ref(idx.to(ref.weight.device)).detach().cpu())
    assert emb.weight.shape == ref.weight.shape and emb.weight.dtype == ref.weight.dtype
    assert [p.shape for p in emb.parameters()] == []  # still no parameter for a model optimizer


@pytest.mark.parametrize("options", [
    {"max_norm": 1.0}, {"max_norm": 2.5, "norm_type": 1.0}, {"scale_grad_by_freq": True}, {"sparse": True},
    {"max_norm": 1.0, "scale_grad_by_freq": True, "padding_idx": 2},
], ids=["max-norm", "max-norm-l1", "scale-grad-by-freq", "sparse", "all-with-padding"])
def test_nn_embedding_options_train_as_in_nn_embedding(options):
    w, make = _reference(ROWS, DIM), functools.partial(torch.optim.SGD, lr=0.1)
    batches = _with_padding(_batches(), options["padding_idx"]) if "padding_idx" in options else _batches()
    ref = nn.Embedding(ROWS, DIM, _weight=w.clone(), **options)
    opt = make(ref.parameters())
    ref_outs = []
    for idx, target in batches:
        opt.zero_grad()
        out = ref(idx)
        ref_outs.append(out.detach().clone())
        _loss(out, target).backward()
        opt.step()
    emb, outs = _train_host(w, make, batches, **options)
    # A sparse gradient sums repeated indices in another order than a dense one: one ulp apart.
    tol = {"rtol": 1e-6, "atol": 1e-6} if options.get("sparse") else {"rtol": 0, "atol": 1e-7}
    for a, b in zip(outs, ref_outs, strict=True):
        torch.testing.assert_close(a, b, **tol)
    torch.testing.assert_close(emb.table.cpu(), ref.weight.detach(), **tol)
    assert not torch.equal(emb.table.cpu(), w)


def _amp_batches():
    """Partial-coverage batches and, at step 2, a target so large that the scaled loss overflows."""
    batches = _batches(steps=5)
    batches[2] = (batches[2][0], torch.full_like(batches[2][1], 3e38))
    return batches


def test_grad_scaler_steps_the_embedding_optimizer_as_any_other():
    """scaler.step(emb.optimizer) unscales, checks for infs and skips the overflowing step,
    exactly as for nn.Embedding + SGD under the same scaler."""
    w, make = _reference(ROWS, DIM), functools.partial(torch.optim.SGD, lr=0.1)
    ref = nn.Embedding.from_pretrained(w.clone(), freeze=False)
    ref_opt, emb = make(ref.parameters()), _host(w)
    scalers = [torch.amp.GradScaler("cpu", init_scale=1024.0) for _ in range(2)]
    for idx, target in _amp_batches():
        for (model, opt), scaler in zip([(ref, ref_opt), (emb, emb.optimizer)], scalers, strict=True):
            opt.zero_grad()
            scaler.scale(_loss(model(idx), target)).backward()
            scaler.step(opt)
            scaler.update()
    assert scalers[0].get_scale() == scalers[1].get_scale() < 1024.0  # the overflowing step was skipped
    assert torch.equal(emb.table.cpu(), ref.weight.detach())
    assert torch.isfinite(emb.table.cpu()).all()


def test_grad_scaler_with_unscale_then_emb_step_also_matches():
    w, make = _reference(ROWS, DIM), functools.partial(torch.optim.SGD, lr=0.1)
    ref = nn.Embedding.from_pretrained(w.clone(), freeze=False)
    ref_opt, emb = make(ref.parameters()), _host(w)
    scalers = [torch.amp.GradScaler("cpu", init_scale=1024.0) for _ in range(2)]
    for idx, target in _batches(steps=3):
        ref_opt.zero_grad()
        scalers[0].scale(_loss(ref(idx), target)).backward()
        scalers[0].step(ref_opt)
        scalers[0].update()
        scalers[1].scale(_loss(emb(idx), target)).backward()
        scalers[1].unscale_(emb.optimizer)
        scalers[1].step(emb.optimizer)  # after unscale_: no second unscale
        scalers[1].update()
    assert torch.equal(emb.table.cpu(), ref.weight.detach())


def test_adam_is_sparse_adam_whose_eps_is_scaled_by_the_bias_correction():
    """What HostEmbedding + Adam(eps) is exactly: SparseAdam whose eps at step t is
    eps * sqrt(1 - beta2**t) (SparseAdam adds eps before dividing by that square root, Adam
    after). With gradients ~1e-8 plain SparseAdam differs visibly; the rescaled one does not."""
    w, eps, beta2, lr = _reference(ROWS, DIM), 1e-8, 0.999, 0.05
    batches = _batches()

    def tiny(out, target):
        return _loss(out, target) * 1e-8  # gradients ~1e-8, near eps

    ref = nn.Embedding(ROWS, DIM, sparse=True, _weight=w.clone())
    plain = nn.Embedding(ROWS, DIM, sparse=True, _weight=w.clone())
    ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=lr, eps=eps)
    plain_opt = torch.optim.SparseAdam(plain.parameters(), lr=lr, eps=eps)
    emb = _host(w, functools.partial(torch.optim.Adam, lr=lr, eps=eps))
    for t, (idx, target) in enumerate(batches, start=1):
        ref_opt.param_groups[0]["eps"] = eps * (1 - beta2 ** t) ** 0.5
        for model, opt in ((ref, ref_opt), (plain, plain_opt), (emb, emb.optimizer)):
            opt.zero_grad()
            tiny(model(idx), target).backward()
            model.step() if model is emb else opt.step()
    torch.testing.assert_close(emb.table.cpu(), ref.weight.detach(), rtol=1e-6, atol=1e-6)
    assert (emb.table.cpu() - plain.weight.detach()).abs().max() > 1e-3  # the docs' old "1e-5" does not hold here


# --- the benchmark (benchmarks/bench_transfer.py) and its plain-PyTorch baselines ---------

def test_benchmark_module_imports_no_torch():
    """asv starts a process per benchmark, most of which only report what setup_cache
    measured: importing the module must not cost them torch (benchmarks.common)."""
    code = "import sys; from benchmarks import bench_transfer; print('torch' in sys.modules)"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU behaviour of the benchmark")
def test_benchmark_skips_what_a_cpu_cannot_run_and_pairs_the_rest(monkeypatch):
    """One process measures a class (setup_cache); its track_* processes report. What a CPU
    cannot run is NaN (asv's skip), never a failure; plain PyTorch's pageable path (the
    baseline), speedlib's 'pageable' and 'auto' take turns and their ratios are per round;
    EmbeddingStep's baseline is plain PyTorch's SparseAdam on the host. A small batch stands in
    for workloads.embedding()."""
    spec = workloads.EmbeddingBatch(rows=131072, dim=128, batch=4096)  # a 64 MiB table
    monkeypatch.setattr(bench, "_spec", lambda: spec)
    monkeypatch.setattr(bench, "BATCH_BYTES", spec.batch * spec.dim * 4)
    for cls in (bench.Transfer, bench.EmbeddingStep):
        monkeypatch.setattr(cls, "pairs", 3)
        monkeypatch.setattr(cls, "warmup", 0)

    floor = bench.FractionOfFloor()
    cache = floor.measure_all()
    for variant in bench.VARIANTS:
        assert math.isnan(floor.track_gather_fraction_of_floor(cache, variant))
        assert math.isnan(floor.track_scatter_fraction_of_floor(cache, variant))
    copy = bench.CopyBandwidth()
    assert math.isnan(copy.track_copy_bandwidth(copy.measure_all(), "h2d", "pinned"))
    device = bench.DeviceFootprint()
    assert math.isnan(device.track_device_footprint(device.measure_all(), "pageable"))
    assert bench.Transfer.baseline == "torch_pageable" and bench.EmbeddingStep.baseline == "sparse_adam_host"

    # Resident memory grows by the table only in a fresh process, as asv's setup_cache is:
    # in this one, memory earlier tests freed can take the table without growing it.
    code = ("import json; from benchmarks import bench_transfer as bench; from speedbench.measure import workloads\n"
            f"spec = workloads.EmbeddingBatch(rows={spec.rows}, dim={spec.dim}, batch={spec.batch})\n"
            "bench._spec = lambda: spec\n"
            "host = bench.Footprint(); cache = host.measure_all()\n"
            "print(json.dumps([host.track_host_footprint(cache, v) "
            "for v in ('uva', 'pageable', 'torch_pageable', 'auto')]))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    uva, *host_tables = json.loads(out.stdout.strip().splitlines()[-1])
    assert math.isnan(uva)
    table_bytes = spec.rows * spec.dim * 4
    assert all(0.75 * table_bytes < used < 1.25 * table_bytes for used in host_tables), host_tables

    transfer = bench.Transfer()
    cache = transfer.measure_all()
    assert not bench._tables  # the tables went with the class's measurement
    for op in bench.OPS:
        for order in bench.ORDERS:
            base = transfer.track_seconds(cache, op, order, "torch_pageable")["samples"]
            assert math.isnan(transfer.track_speedup(cache, op, order, "torch_pageable"))  # the CPU's baseline
            for variant in ("pageable", "auto"):
                seconds = transfer.track_seconds(cache, op, order, variant)["samples"]
                assert len(seconds) == len(base) == 3 and min(seconds + base) > 0
                gbps = transfer.track_bandwidth(cache, op, order, variant)["samples"]
                assert gbps == pytest.approx([spec.batch * spec.dim * 4 / s / 1e9 for s in seconds])
                ratios = transfer.track_speedup(cache, op, order, variant)["samples"]
                assert ratios == pytest.approx([b / s for b, s in zip(base, seconds, strict=True)])  # per round
            for variant in [*GPU_BACKENDS, "torch_pinned"]:
                assert math.isnan(transfer.track_seconds(cache, op, order, variant))
                assert math.isnan(transfer.track_speedup(cache, op, order, variant))

    steps = bench.EmbeddingStep()
    cache = steps.measure_all()
    assert math.isnan(steps.track_seconds(cache, "uva")) and math.isnan(steps.track_seconds(cache, "sparse_adam"))
    sparse = steps.track_seconds(cache, "sparse_adam_host")["samples"]
    for variant in ("pageable", "auto"):
        mine = steps.track_seconds(cache, variant)["samples"]
        ratios = steps.track_speedup(cache, variant)["samples"]
        assert len(mine) == len(sparse) == len(ratios) == 3 and min(mine + sparse) > 0
        # per round, never of medians
        assert ratios == pytest.approx([a / b for a, b in zip(sparse, mine, strict=True)])


def test_benchmark_looks_up_sparse_adam_indices_on_the_tables_device(monkeypatch):
    """sparse_adam's nn.Embedding is on the GPU and the indices arrive pinned on the host, as
    on a GPU machine. Without a GPU, fake tensors stand in: FakeTensorMode gives tensors a
    CUDA device without memory and refuses an op mixing devices, as CUDA kernels do. Autograd
    would start its CUDA worker (which needs a GPU), so backward is a no-op: the lookup is
    where devices meet."""
    monkeypatch.setattr(instruments, "device", lambda prefer=None: torch.device("cuda", 0))
    monkeypatch.setattr(instruments, "synchronize", lambda dev=None: None)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *args, **kwargs: self)  # fake tensors cannot pin
    monkeypatch.setattr(torch.Tensor, "backward", lambda self, *args, **kwargs: None)
    with FakeTensorMode(allow_non_fake_inputs=True):
        trainer = bench._EmbeddingTrainer("sparse_adam")  # two warm-up steps
        trainer.step()
    assert trainer.idx.device.type == "cpu"  # the indices still arrive on the host: moving them is timed


def test_fraction_of_floor_reports_the_gbps_its_percent_was_computed_from(monkeypatch):
    """FractionOfFloor keeps both terms of each %, GB/s, from the one measurement: gather over
    the host->device floor, write-back over device->host, each floor timed once in the same
    process. The % tracks are unchanged; a variant that cannot run is NaN in every track.
    Fakes stand in for the GPU: 12.5 GB/s over a 25 GB/s floor is 50 %."""
    floors, timed = {"h2d": 25e9, "d2h": 20e9}, []

    def copy(dev, direction, pinned):
        assert pinned and dev == "fake-gpu"
        timed.append(direction)
        return floors[direction]

    class FakeTable:
        def __init__(self, variant, spec, dev, indices):
            self.variant = variant

        def op(self, op):
            return lambda order: (op, order)

    def median_bandwidth(fn, dev):
        op, order = fn()
        assert order == "random"
        return {"gather": 12.5e9, "scatter": 5e9}[op]

    def runs_here(variant, dev):
        if variant == "cupy":
            raise NotImplementedError("CuPy is not installed")

    monkeypatch.setattr(bench.common, "gpu_only", lambda what: None)
    monkeypatch.setattr(bench, "_device", lambda: "fake-gpu")
    monkeypatch.setattr(bench, "_spec", lambda: None)
    monkeypatch.setattr(bench, "_host_indices", lambda spec, dev: {})
    monkeypatch.setattr(bench, "_runs_here", runs_here)
    monkeypatch.setattr(bench, "_Table", FakeTable)
    monkeypatch.setattr(bench, "_median_bandwidth", median_bandwidth)
    monkeypatch.setattr(instruments, "host_copy_bandwidth", copy)

    floor = bench.FractionOfFloor()
    cache = {("uva",): ("ok", floor.measure_one("uva")), ("cupy",): ("skip", "CuPy is not installed")}
    assert timed == ["h2d", "d2h"]  # one floor per direction, in the measuring process
    assert floor.track_gather_fraction_of_floor(cache, "uva") == pytest.approx(50.0)
    assert floor.track_scatter_fraction_of_floor(cache, "uva") == pytest.approx(25.0)
    assert floor.track_gather_bandwidth(cache, "uva") == pytest.approx(12.5)
    assert floor.track_h2d_floor(cache, "uva") == pytest.approx(25.0)
    assert floor.track_scatter_bandwidth(cache, "uva") == pytest.approx(5.0)
    assert floor.track_d2h_floor(cache, "uva") == pytest.approx(20.0)
    tracks = (floor.track_gather_fraction_of_floor, floor.track_scatter_fraction_of_floor, floor.track_gather_bandwidth,
              floor.track_scatter_bandwidth, floor.track_h2d_floor, floor.track_d2h_floor)
    assert all(math.isnan(track(cache, "cupy")) for track in tracks)
    # the GB/s are kind "bandwidth" (unit GB/s), the % still "fraction of floor", each in its own words
    from speedbench.results.load import metric_kind  # noqa: PLC0415 - pandas, only for this test

    for track in tracks[2:]:
        assert track.unit == "GB/s" and metric_kind("track", track.unit) == "bandwidth"
        assert words.metric(track.__name__.removeprefix("track_")) != track.__name__.removeprefix("track_")
    assert metric_kind("track", floor.track_gather_fraction_of_floor.unit) == "fraction of floor"


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU behaviour of the benchmark")
def test_fraction_of_floor_gbps_are_skips_on_a_cpu():
    """GPUs only, as the % are: a CPU records NaN (asv's skip) for every variant."""
    floor = bench.FractionOfFloor()
    cache = floor.measure_all()
    for variant in bench.VARIANTS:
        for track in (floor.track_gather_bandwidth, floor.track_scatter_bandwidth, floor.track_h2d_floor,
                      floor.track_d2h_floor):
            assert math.isnan(track(cache, variant))


def test_the_plain_pytorch_baselines_move_the_rows_speedlib_moves(monkeypatch):
    """bench_transfer's baselines are torch alone: the pageable one as it is, the pinned one's
    logic with stand-ins for what needs a GPU (pinning, the copy's event), on a batch shorter
    than its buffer; each gathers the rows a speedlib table gathers and writes back alike."""
    class Event:
        def record(self):
            self.recorded = True

        def synchronize(self):
            assert self.recorded

    class Stream:
        def synchronize(self):
            pass

    def unpinned(make):
        return lambda *shape, pin_memory=False, **kw: make(*shape, **kw)

    fake = types.SimpleNamespace(zeros=unpinned(torch.zeros), empty=unpinned(torch.empty),
                                 index_select=torch.index_select,
                                 cuda=types.SimpleNamespace(Event=Event, current_stream=Stream))
    weight = torch.randn(50, 4, generator=torch.Generator().manual_seed(2))
    idx = torch.tensor([7, 3, 7, 49, 0])
    reference = HostTable.from_tensor(weight, backend="pageable", device="cpu")
    pinned = bench._TorchPinned.__new__(bench._TorchPinned)  # its __init__ pins: the GPU test below runs it
    pinned.torch, pinned.device, pinned.copied = fake, torch.device("cpu"), None
    pinned.table, pinned.buffer = fake.zeros(50, 4, pin_memory=True), fake.empty(8, 4, pin_memory=True)
    pageable = bench._storage("torch_pageable", 50, 4, torch.device("cpu"), 8)
    for table in (pageable, pinned):
        table.table.copy_(weight)
        for _ in range(2):  # the second gather waits for the first's copy before refilling the buffer
            assert torch.equal(table.gather(idx), reference.gather(idx))
        values = torch.randn(3, 4)
        rows = torch.tensor([1, 4, 2])
        table.scatter_(rows, values)
        reference.scatter_(rows, values)
        assert torch.equal(table.table, reference.cpu())
        reference.copy_(weight)
    assert type(bench._storage("pageable", 5, 4, torch.device("cpu"), 2)).__name__ == "HostTable"


@needs_cuda
def test_the_plain_pytorch_pinned_baseline_gathers_and_writes_back_on_a_gpu():
    weight = torch.randn(300, 16)
    table = bench._storage("torch_pinned", 300, 16, torch.device("cuda"), 64)
    assert table.table.is_pinned() and table.buffer.is_pinned()
    table.table.copy_(weight)
    idx = torch.randint(0, 300, (64,)).pin_memory()
    first, second = table.gather(idx), table.gather(idx.flip(0))
    assert torch.equal(first.cpu(), weight[idx]) and torch.equal(second.cpu(), weight[idx.flip(0)])
    rows = torch.randperm(300)[:40]
    table.scatter_(rows, first[:40])
    weight[rows] = first[:40].cpu()
    assert torch.equal(table.table, weight)


def test_fraction_of_floor_prints_what_auto_chose_with_its_gather_bandwidth(capsys):
    """What 'auto' measured reaches `speedlib run --show-stderr` through a track (asv keeps a
    setup_cache's output only when it fails): the path kept, and every path's median."""
    table = HostTable(20, 4, device="cpu")
    table._impl.chosen = {"gather": Path("split", share=0.42)}
    table._impl.measured = {"gather": {Path("pinned"): 2e-3, Path("split", share=0.42): 1.25e-3}}
    line = bench._what_auto_chose(table)
    assert line == ("bench_transfer auto gather: split (42% of rows packed on the CPU, uva the rest) "
                    "(pinned 2 ms, split (42% of rows packed on the CPU, uva the rest) 1.25 ms)")
    floor = bench.FractionOfFloor()
    cache = {("auto",): ("ok", {"gather_bandwidth": 30.0, "chose": line})}
    assert floor.track_gather_bandwidth(cache, "auto") == 30.0
    assert capsys.readouterr().err.strip() == line
