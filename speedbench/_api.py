"""Each package's public API, imported on first use.

A package's `__init__` names what it offers; the module behind a name is imported only when
the name is read, so a process that needs one part (the CLI's parser, a benchmark, the
dashboard) loads neither torch nor pandas for the others.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy(package: str, api: Mapping[str, tuple[str, ...]]) -> tuple[list[str], Callable[[str], object]]:
    """`__all__` and a module `__getattr__` for `package`, from {module: names it exports}; a
    module is named within the package, or in full (a name another package holds)."""
    where = {name: module for module, names in api.items() for name in names}

    def __getattr__(name: str) -> object:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = where[name] if where[name].startswith("speedbench.") else f"{package}.{where[name]}"
        return getattr(importlib.import_module(module), name)

    return sorted(where), __getattr__
