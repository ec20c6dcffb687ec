"""Tables that live in host memory: gather rows to the GPU, scatter them back, train them.

`HostTable(rows, dim, backend=...)` keeps a rows x dim table where the backend says and
moves rows between it and `device`:

  auto      the default. The table is page-locked in place (exactly its bytes, as 'uva'), and
            each direction is moved by whichever of its paths measured fastest at first use
            on this machine: pinned, uva (rows in the caller's or in index order), or both at
            once (the CPU packing part of a batch while the GPU reads the rest). Remembered
            per device, table shape and batch size for the process, like cudnn.benchmark;
            `table.chosen` says which path runs. A file mapping, or a table the OS will not
            lock, has the pinned path alone; on a CPU device it is 'pageable'.
            speedlib/transfer/auto.py says why and how.
  pageable  a plain CPU tensor; rows are indexed on the CPU and copied synchronously.
            Runs without a GPU.
  pinned    a plain CPU tensor. Rows are indexed on the CPU into a pinned staging buffer (two
            take turns) and copied with one non_blocking copy, as PyTorch's pinned path does.
            Only the staging buffers are pinned, not the table.
  cupy      CuPy pinned memory, indexed by CuPy kernels running on the GPU: SpeedTorch's
            approach, kept as it is so that SpeedTorch's claims can be checked. Pinned memory
            is mapped into the GPU's address space (unified addressing), so the kernel reads
            and writes host rows over the bus: no CPU indexing.
  uva       zero-copy without CuPy: ordinary host memory, page-locked in place with
            cudaHostRegister (exactly the table's bytes: torch's pinned allocator rounds up to
            a power of two, 8 GiB for a 5.1 GB table) and described to torch as CUDA memory
            (the CUDA array interface). A Triton kernel reads (and writes) whole rows of it
            over the bus, consecutive threads on consecutive words; `sort_indices=True` reads
            rows in index order and restores the caller's order in the same pass. Where the
            kernel cannot be built, torch's index_select / index_copy_ do it (with a warning).
            Unlocked when the table is freed. `huge_pages`, `whole_lines`, `bytes_in_flight`:
            experimental (issue 52's hypotheses, not measured on a GPU yet; 'auto' has none).
  device    the whole table in GPU memory: the upper bound, when it fits.

`gather(indices)` returns a tensor on `device` shaped `indices.shape + (dim,)`, ordered on
the current CUDA stream like any other kernel's output. `scatter_(indices, values)` writes
rows back (and returns once they are in the table). **Duplicate indices: the last occurrence
wins**, as in Python and NumPy assignment; `index_copy_` alone leaves the winner unspecified
on both CPU and GPU, so every backend first makes duplicates carry the same row
(`last_write_wins`). Bad input fails before anything is written: out-of-range indices raise
`IndexError`, non-integer indices or values of another dtype `TypeError`, a shape or device
mismatch `ValueError`. Indices may be int32 or int64 everywhere.

`HostTable.from_file(path)` maps a 2-D `.npy` file instead of allocating (the 'auto',
'pageable' and 'pinned' backends, which index on the CPU): a table larger than RAM, as
SpeedTorch users loaded embeddings with `numpy.load(..., mmap_mode=...)`. Rows are paged in on
demand and writes land in the file through the page cache; `flush()` forces them to disk.

`HostEmbedding` trains such a table with any dense `torch.optim` optimizer; see its docstring.

The package, one module per part: table.py (`HostTable` and its input checks), backends.py (the
storage backends), auto.py (the default backend's measured choice of path), kernel.py (the 'uva'
backend's row-copy kernel), embedding.py (`HostEmbedding`: the module and its lookups), with its
training step (embedding_step.py), optimizer state (embedding_state.py) and the part that keeps
several processes' tables in step (embedding_ranks.py).
"""

from speedlib.transfer.backends import BACKENDS
from speedlib.transfer.embedding import HostEmbedding
from speedlib.transfer.table import HostTable, last_write_wins

__all__ = ["BACKENDS", "HostTable", "HostEmbedding", "last_write_wins"]
