"""What the host-table tests share: each backend as a pytest param, skipped where this machine
cannot run it, and the device it moves rows to (test_host_table, test_transfer_backends,
test_transfer, test_host_embedding); and tables of random bits and index patterns
(test_transfer_kernel, test_transfer_auto): a copy that went through arithmetic or a float
conversion would change some of these bits, so comparing them bitwise checks that rows were
moved, not recomputed."""

from __future__ import annotations

import pytest
import torch

from speedlib.transfer import BACKENDS

needs_cuda = pytest.mark.gpu(reason="these backends move rows to a CUDA device; this machine has none")
try:
    import triton  # noqa: F401 - imported only to learn whether Triton is installed
    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (CPU-only torch builds lack it)")
HAS_CUDA = torch.cuda.is_available()
GPU_BACKENDS = [b for b in BACKENDS if b not in ("pageable", "auto")]  # auto is pageable on a CPU device


def _cupy_ok() -> bool:
    try:
        import cupy  # noqa: F401, PLC0415 - optional and heavy: imported only to learn whether it is installed
    except ImportError:
        return False
    return True


def thp_setting() -> str:
    """The kernel's transparent huge page mode (the bracketed word of
    /sys/kernel/mm/transparent_hugepage/enabled: always, madvise or never), or "" unreadable."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return ""


needs_huge_pages = pytest.mark.skipif(thp_setting() not in ("always", "madvise"),
                                      reason="transparent huge pages are off on this host: no 2 MiB table to test")


def _backend_params(backends):
    """Each backend as a pytest param, skipped with its reason where this machine cannot run it."""
    out = []
    for b in backends:
        marks = []
        if b != "pageable":
            marks.append(needs_cuda)
        if b == "cupy" and not _cupy_ok():
            marks.append(pytest.mark.skip(reason="CuPy is not installed"))
        out.append(pytest.param(b, marks=marks, id=b))
    return out


ALL = _backend_params(BACKENDS)


def _device(backend: str) -> torch.device:
    # A table names its CUDA device with the index ('cuda:0'), as tensors made there do.
    return torch.device("cuda", torch.cuda.current_device()) if HAS_CUDA else torch.device("cpu")


def _train_device(backend: str) -> torch.device:
    """Where an embedding trained against a CPU reference runs: the CPU for 'pageable' even on
    GPU machines, so that comparisons with nn.Embedding and torch.optim on the CPU can be
    bitwise (GPU kernels round differently) and its outputs meet CPU targets. Training on a
    GPU is compared with a tolerance in the *_on_gpu_backends_* tests, 'pageable' included."""
    return torch.device("cpu") if backend == "pageable" else _device(backend)


def _reference(rows=1000, dim=16, dtype=torch.float32, seed=0):
    return torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed)).to(dtype)


def bits(rows: int, dim: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """A table of random bit patterns: NaNs with payloads, infinities, subnormals."""
    raw = torch.randint(0, 256, (rows, dim * dtype.itemsize), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(seed))
    return raw.view(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8),
                                                                       b.contiguous().view(torch.uint8))


PATTERNS = {
    "random, with repeats": lambda n, rows, g: torch.randint(0, rows, (n,), generator=g),
    "one row over and over": lambda n, rows, g: torch.full((n,), rows // 2),
    "sorted": lambda n, rows, g: torch.randint(0, rows, (n,), generator=g).sort().values,
    "descending, distinct": lambda n, rows, g: torch.randperm(rows, generator=g)[:n].sort(descending=True).values,
    "first and last rows": lambda n, rows, g: torch.tensor([0, rows - 1] * (n // 2) + [0] * (n % 2)),
}


def indices(pattern: str, n: int, rows: int, seed: int = 1) -> torch.Tensor:
    return PATTERNS[pattern](n, rows, torch.Generator().manual_seed(seed)).to(torch.int64)
