"""The 'uva' backend's row-copy kernel: whole rows of a host-mapped table read by consecutive threads.

Why a kernel of our own: torch's `index_select` on the mapped table reached 32.6 % of the
pinned host->device copy bandwidth on an H100 (2026-11-23). Reads of host memory cross the bus
as PCIe requests, and a row is fetched at full width only when consecutive threads read
consecutive bytes of it, so that every request is a whole aligned 128-byte line (DGL's
`gather_pinned_tensor_rows` and the PyTorch-Direct paper, VLDB 2021, reach near the PCIe limit
that way). Here each program copies a block of rows; along a row, consecutive lanes take
consecutive words (int32 where the row's bytes and addresses allow), so a 512-byte row is
four full lines. Where a row's words are a multiple of 16 and the addresses 16-byte aligned
(Triton specialises on both at launch), each lane's load is one 16-byte vector: Triton 3.8
emits `ld.global.v4.b32` for the suite's 512-byte rows (tests/test_transfer_kernel.py compiles
the kernel for sm_90 on the CPU and counts them).
Rows are copied as words, never as numbers: the result is bitwise the source's, whatever the
dtype (bfloat16 included).

One kernel serves both directions: dst[dst_rows[i]] = src[src_rows[i]], either index list
optional (then i itself). Gather: src = the table, src_rows = the indices. Write-back: dst = the
table, dst_rows = the indices. With `sort=True` the indices are sorted first (neighbouring
rows read together, fewer distinct pages per block), and the permutation goes on the other
side, which restores the caller's order in the same pass: no extra copy.

`Shape` holds issue 52's hypotheses about the kernel, each a variant that
bench_transfer.RooflineHypotheses measures; none is anyone's default until a GPU has shown it
pays (`Shape()` is the kernel as it always was):
  lines      gathers read whole aligned 128-byte lines: the line holding a row's first byte to
             the one holding its last, the neighbours' bytes read and dropped (a second kernel,
             `build(lines=True)`). A row narrower than a line then costs a whole line on the bus
             but one request; a row of whole lines reads as before. Write-back never does it (a
             whole line would write its neighbours' bytes, racing their own writes).
  in_flight  bytes each program reads before it writes them (its tile), with warps to match
             (`_warps`): the bytes in flight per SM are this times the programs resident there.
             None: 4096 words a program (16 KiB of int32 words), Triton's 4 warps.

Written in Triton, which ships with CUDA builds of torch, and compiled on first use. Where the
first launch fails (no Triton, no C compiler for its launcher, a GPU Triton does not support)
`copy_rows` says why once, with a warning, and uses torch's index_select / index_copy_ from
then on: same results, the old speed. Once the kernel has run, errors are raised, and so are
a hypothesis's (a `Shape` other than the default never falls back: it is measured or it fails).
`KERNEL` says which one ran last. Tests run the Triton kernels on the CPU through Triton's
interpreter (TRITON_INTERPRET=1 when `build()` is called).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import warnings

import torch

# What ran the last copy: "triton", "torch" (the fallback) or None (nothing yet).
KERNEL: str | None = None
_unusable: list[str] = []  # why the Triton kernel cannot run here, once known
_ran: list[bool] = []  # [True] once the kernel has built and run here

LINE = 128  # bytes: the GPU's cache line; a warp's reads within one line leave the GPU as one request


@dataclasses.dataclass(frozen=True)
class Shape:
    """How the kernel moves rows (see the module docstring); `Shape()` is the default kernel."""

    lines: bool = False
    in_flight: int | None = None

    def __post_init__(self):
        if not isinstance(self.lines, bool):
            raise TypeError(f"lines must be True or False, got {self.lines!r}")
        n = self.in_flight
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1024 or n & (n - 1)):
            raise ValueError(f"bytes in flight must be a power of two of at least 1024, got {n!r}")


DEFAULT = Shape()


def build(lines: bool = False):
    """The Triton kernel (`lines`: the whole-line gather), decorated now (so the interpreter is
    chosen by the environment of this call). Raises ImportError without Triton."""
    import triton  # noqa: PLC0415 - optional: CPU-only torch builds have no Triton
    import triton.language as tl  # noqa: PLC0415 - optional, as triton

    if lines:
        @triton.jit
        def copy_lines_kernel(src, src_rows, dst, dst_rows, n, words, src_words, span,
                              HAS_DST_ROWS: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_WORDS: tl.constexpr,
                              LINE_WORDS: tl.constexpr):
            r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
            live = r < n
            s = tl.load(src_rows + r, mask=live, other=0)
            d = tl.load(dst_rows + r, mask=live, other=0) if HAS_DST_ROWS else r.to(tl.int64)
            first = s * words  # the row's first word in src
            line = tl.multiple_of(first // LINE_WORDS * LINE_WORDS, LINE_WORDS)  # the line holding it
            for w0 in range(0, span, BLOCK_WORDS):
                a = line[:, None] + (w0 + tl.arange(0, BLOCK_WORDS))[None, :]
                # Whole lines are read (never past the table's end); only the row's own words are kept.
                v = tl.load(src + a, mask=live[:, None] & (a < src_words))
                keep = live[:, None] & (a >= first[:, None]) & (a < first[:, None] + words)
                tl.store(dst + d[:, None] * words + (a - first[:, None]), v, mask=keep)

        return copy_lines_kernel

    @triton.jit
    def copy_rows_kernel(src, src_rows, dst, dst_rows, n, words,
                         HAS_SRC_ROWS: tl.constexpr, HAS_DST_ROWS: tl.constexpr,
                         BLOCK_ROWS: tl.constexpr, BLOCK_WORDS: tl.constexpr):
        r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        live = r < n
        s = tl.load(src_rows + r, mask=live, other=0) if HAS_SRC_ROWS else r.to(tl.int64)
        d = tl.load(dst_rows + r, mask=live, other=0) if HAS_DST_ROWS else r.to(tl.int64)
        for w0 in range(0, words, BLOCK_WORDS):
            w = w0 + tl.arange(0, BLOCK_WORDS)
            m = live[:, None] & (w[None, :] < words)
            v = tl.load(src + s[:, None] * words + w[None, :], mask=m)
            tl.store(dst + d[:, None] * words + w[None, :], v, mask=m)

    return copy_rows_kernel


_kernel = functools.cache(build)


def _words(t: torch.Tensor, width: int) -> torch.Tensor:
    """t's rows as integer words of `width` bytes (bytes moved, not numbers)."""
    word = {4: torch.int32, 2: torch.int16, 1: torch.uint8}[width]
    return t.view(torch.uint8).view(word) if t.element_size() != width else t.view(word)


def _width(*tensors: torch.Tensor) -> int:
    """The widest word (4, 2 or 1 bytes) dividing a row and every tensor's start address."""
    row_bytes = tensors[0].shape[1] * tensors[0].element_size()
    for width in (4, 2):
        if row_bytes % width == 0 and all(t.data_ptr() % width == 0 for t in tensors):
            return width
    return 1


def _warps(in_flight: int | None) -> int | None:
    """Warps for a program reading `in_flight` bytes: at most 256 bytes a thread (64 registers of
    words) beyond 32 KiB, Triton's 4 below it; None: Triton's default."""
    return None if in_flight is None else max(4, min(16, in_flight // 8192))


def _span(src: torch.Tensor, words: int, width: int) -> int:
    """Words the whole-line gather reads for one row: the lines from the one holding its first
    word to the one holding its last, at the worst offset a row of the table can have. Rows
    start at multiples of `words` from the table's start: where that is line-aligned they sit
    at offsets that are multiples of gcd(words, words a line), else at any word."""
    line = LINE // width
    step = math.gcd(words, line) if src.data_ptr() % LINE == 0 else 1
    return -(-(line - step + words) // line) * line


def _prepared(src: torch.Tensor, dst: torch.Tensor, shape: Shape = DEFAULT) -> tuple:
    """(src words, dst words, words a row, words a pass, rows a program, extra kernel arguments,
    launch options): speedlib's own part of a launch, done before it, so that an error in it is
    raised, never taken for Triton's."""
    width = _width(src, dst)
    s, d = _words(src, width), _words(dst, width)
    words = s.shape[1]
    extra, options = (), {}
    if shape.lines:
        span = _span(src, words, width)
        block_words = min(1024, 1 << (span - 1).bit_length())
        extra = (s.numel(), span)
    else:
        block_words = min(1024, 1 << (words - 1).bit_length())  # a whole row per pass where it fits
    per_program = 4096 if shape.in_flight is None else max(1, shape.in_flight // width)
    block_rows = max(1, per_program // block_words)  # ~4096 words in flight per program by default
    if shape.in_flight is not None:
        options = {"num_warps": _warps(shape.in_flight)}
    return s, d, words, block_words, block_rows, extra, options


def _launch(kernel, prepared: tuple, src_rows, dst_rows, n: int, lines: bool = False) -> None:
    s, d, words, block_words, block_rows, extra, options = prepared
    grid = ((n + block_rows - 1) // block_rows,)
    # Triton launches on the current device's current stream, not the tensors': make them the
    # table's, or a table on another GPU would be written by this one.
    on = d.device if d.device.type == "cuda" else None
    with torch.cuda.device(on) if on is not None else contextlib.nullcontext():
        if lines:
            kernel[grid](s, src_rows, d, dst_rows if dst_rows is not None else d, n, words, *extra,
                         HAS_DST_ROWS=dst_rows is not None, BLOCK_ROWS=block_rows, BLOCK_WORDS=block_words,
                         LINE_WORDS=LINE // s.element_size(), **options)
        else:
            kernel[grid](s, src_rows if src_rows is not None else s, d, dst_rows if dst_rows is not None else d, n,
                         words, HAS_SRC_ROWS=src_rows is not None, HAS_DST_ROWS=dst_rows is not None,
                         BLOCK_ROWS=block_rows, BLOCK_WORDS=block_words, **options)


def _torch_copy(src, src_rows, dst, dst_rows) -> None:
    rows = src if src_rows is None else torch.index_select(src, 0, src_rows)
    if dst_rows is None:
        dst.copy_(rows)
    else:
        dst.index_copy_(0, dst_rows, rows)


def copy_rows(src: torch.Tensor, dst: torch.Tensor, *, src_rows: torch.Tensor | None = None,
              dst_rows: torch.Tensor | None = None, shape: Shape = DEFAULT, kernel=None) -> None:
    """dst[dst_rows[i]] = src[src_rows[i]] for every i, whole rows, bitwise.

    src, dst: 2-D contiguous tensors of one dtype and row width on one device; index lists
    int64 on that device, checked by the caller; repeated dst_rows carry the same bytes.
    shape: the kernel's variant (`Shape`); `lines` needs src_rows (it reads through them).
    kernel: a `build(shape.lines)` result to use (tests pass the interpreted one); by default
    the compiled kernel, or, for the default shape only, torch's indexing where it cannot be
    built here. A kernel that built and ran once is trusted: a later error is raised, not
    hidden by the fallback."""
    global KERNEL
    if shape.lines and src_rows is None:
        raise ValueError("the whole-line kernel reads rows through src_rows; this copy has none")
    n = (src_rows if src_rows is not None else dst_rows if dst_rows is not None else src).shape[0]
    if n == 0:
        return
    if kernel is not None or shape != DEFAULT:  # a kernel given (tests), or a hypothesis: never a fallback
        prepared = _prepared(src, dst, shape)
        _launch(kernel if kernel is not None else _kernel(shape.lines), prepared, src_rows, dst_rows, n, shape.lines)
        KERNEL = "triton"
        return
    if not _unusable:
        prepared = _prepared(src, dst)  # speedlib's own part, outside the guard: its errors are raised
        try:  # the first launch is where Triton compiles and builds its launcher
            _launch(_kernel(), prepared, src_rows, dst_rows, n)
        except torch.cuda.OutOfMemoryError:
            raise  # the GPU was full, which says nothing about whether the kernel can run
        except Exception as e:
            if _ran:
                raise  # a kernel that built and ran here once is trusted: this is a real error
            _unusable.append(f"{type(e).__name__}: {e}")
            warnings.warn(f"speedlib.transfer 'uva': the Triton row-copy kernel cannot run here ({_unusable[0]}); "
                          "using torch's index_select / index_copy_ (same results, without the whole-row reads)",
                          RuntimeWarning, stacklevel=5)  # the caller of HostTable.gather / scatter_
        else:
            _ran[:] = [True]
            KERNEL = "triton"
            return
    _torch_copy(src, src_rows, dst, dst_rows)
    KERNEL = "torch"


def gather(table: torch.Tensor, idx: torch.Tensor, *, sort: bool = False, shape: Shape = DEFAULT,
           kernel=None) -> torch.Tensor:
    """table[idx] as a new tensor on table's device; with sort, rows are read in index order."""
    out = torch.empty(idx.shape[0], table.shape[1], dtype=table.dtype, device=table.device)
    if sort:
        rows, where = torch.sort(idx)  # row rows[j] belongs at out[where[j]]
        copy_rows(table, out, src_rows=rows, dst_rows=where, shape=shape, kernel=kernel)
    else:
        copy_rows(table, out, src_rows=idx, shape=shape, kernel=kernel)
    return out


def scatter(table: torch.Tensor, idx: torch.Tensor, values: torch.Tensor, *, sort: bool = False,
            shape: Shape = DEFAULT, kernel=None) -> None:
    """table[idx[i]] = values[i]; idx distinct. With sort, rows are written in index order."""
    values = values.contiguous()
    shape = dataclasses.replace(shape, lines=False)  # writes cover the row alone: see the module docstring
    if sort:
        rows, where = torch.sort(idx)  # values[where[j]] goes to row rows[j]
        copy_rows(values, table, src_rows=where, dst_rows=rows, shape=shape, kernel=kernel)
    else:
        copy_rows(values, table, dst_rows=idx, shape=shape, kernel=kernel)
