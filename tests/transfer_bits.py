"""Tables of random bits and index patterns shared by the host-table tests (test_transfer_kernel,
test_transfer_auto): a copy that went through arithmetic or a float conversion would change
some of these bits, so comparing them bitwise checks that rows were moved, not recomputed."""

from __future__ import annotations

import pytest
import torch

needs_cuda = pytest.mark.gpu(reason="these backends move rows to a CUDA device; this machine has none")
try:
    import triton  # noqa: F401
    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (CPU-only torch builds lack it)")


def bits(rows: int, dim: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """A table of random bit patterns: NaNs with payloads, infinities, subnormals."""
    raw = torch.randint(0, 256, (rows, dim * dtype.itemsize), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
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
