"""speedlib: PyTorch training-speed techniques, each proven equivalent to its baseline.

The public names are imported lazily so that `import speedlib` (and `speedlib --help`)
does not pay for importing torch until a technique is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "ContiguousParams": "speedlib.contiguous",
    "FlatParameter": "speedlib.contiguous",
    "InvalidBufferError": "speedlib.contiguous",
    "HostTable": "speedlib.transfer",
    "HostEmbedding": "speedlib.transfer",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    # the redundant aliases mark them re-exported, for type checkers (at run time __getattr__ serves them)
    from speedlib.contiguous import ContiguousParams as ContiguousParams
    from speedlib.contiguous import FlatParameter as FlatParameter
    from speedlib.contiguous import InvalidBufferError as InvalidBufferError
    from speedlib.transfer import HostEmbedding as HostEmbedding
    from speedlib.transfer import HostTable as HostTable


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'speedlib' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
