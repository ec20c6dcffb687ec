"""What a benchmark measures, as a fingerprint of its code (benchmarks/versions.json holds them).

asv keeps results under a benchmark's `version`, and speedlib sets it by hand
(benchmarks/versions.json says why each one changed). This module is the check that keeps
those hand-set versions honest: a benchmark class's fingerprint covers the code it runs,
read from source without importing anything (so it works on any commit's tree):

- the class itself (its methods, params and attributes) and its base classes;
- every top-level function, class and assignment it names, followed through imports into
  `benchmarks/` and `speedbench/` (the workloads, the timer, the paired turns), transitively.
  Imports are followed, never hashed: a function that moves to another module keeps its
  fingerprint. `speedlib/` and third-party code are left out: asv tracks the library across
  commits, and torch is recorded in the environment.

Each piece of code is normalised first, so that what cannot change a measurement does not
change a fingerprint: comments and formatting (the AST has none), docstrings and other bare
strings, import statements, type annotations, `strict=` on `zip()` (a length check: equal
values or no result), and a class's own `version`. Anything else that changes is named by `changes()`, which says which
pieces differ.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# The packages whose code a fingerprint follows; every other import is external.
FOLLOWED = ("benchmarks", "speedbench")
# Method prefixes asv takes for benchmarks (asv_runner.benchmarks).
BENCHMARK_PREFIXES = ("time_", "timeraw_", "track_", "mem_", "peakmem_")


class FingerprintError(Exception):
    """A tree whose benchmarks cannot be read (a syntax error, a missing module)."""


@dataclass(frozen=True)
class Fingerprint:
    """A benchmark's fingerprint and the pieces it was computed from: {label: hash}, a
    label being `module.name` of a top-level definition (where it lives in this tree)."""

    digest: str
    pieces: dict[str, str]


class SourceTree:
    """The Python files of one state of a checkout: a directory, or a commit of a git repository."""

    def __init__(self, read: Callable[[str], str | None], listing: Callable[[str], list[str]], description: str):
        self._read = read  # a path under the root -> its text, or None
        self._listing = listing  # a package's directory -> the stems of its .py files
        self.description = description
        self._modules: dict[str, _Module | None] = {}

    @classmethod
    def directory(cls, root: Path) -> SourceTree:
        """The working tree at `root` (what a test or `speedlib versions` checks)."""
        root = Path(root)

        def read(path: str) -> str | None:
            f = root / path
            return _decoded(f.read_bytes(), path, str(root)) if f.is_file() else None

        return cls(read, lambda package: sorted(p.stem for p in (root / package).glob("*.py")), str(root))

    @classmethod
    def commit(cls, repo: Path, commit: str) -> SourceTree:
        """The tree of `commit` in the repository at `repo`, read from git (no worktree)."""
        listed = _git(repo, "ls-tree", "-r", commit, "--", *FOLLOWED).splitlines()
        blobs = {}
        for line in listed:  # "<mode> blob <sha>\t<path>"
            meta, _, path = line.partition("\t")
            if path.endswith(".py") and meta.split()[1] == "blob":
                blobs[path] = meta.split()[2]
        store = _Blobs.of(repo)

        def read(path: str) -> str | None:
            return store.text(blobs[path]) if path in blobs else None

        def listing(package: str) -> list[str]:
            return sorted(p[len(package) + 1:-3] for p in blobs if p.rpartition("/")[0] == package)

        return cls(read, listing, f"commit {commit[:8]}")

    def module(self, name: str) -> _Module | None:
        """The module `name` of a followed package, or None where it is not in this tree."""
        if name not in self._modules:
            self._modules[name] = None
            if name.split(".")[0] in FOLLOWED:
                base = name.replace(".", "/")
                for path, package in ((f"{base}.py", False), (f"{base}/__init__.py", True)):
                    try:
                        text = self._read(path)
                    except (OSError, UnicodeDecodeError) as e:
                        raise FingerprintError(f"{self.description}: {path} cannot be read as UTF-8 text: {e}") from e
                    if text is not None:
                        self._modules[name] = _parsed(name, path, text, package, self.description)
                        break
        return self._modules[name]

    def benchmark_classes(self) -> list[str]:
        """`module.Class` of every benchmark class in benchmarks/bench_*.py (public, with a
        method asv takes for a benchmark, its own or a base's), in file order."""
        names = []
        for stem in self._listing("benchmarks"):
            mod = self.module(f"benchmarks.{stem}") if stem.startswith("bench_") else None
            for node in mod.tree.body if mod else ():
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and _is_benchmark(self, mod, node):
                    names.append(f"{stem}.{node.name}")
        return names


def _git(repo: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, check=True).stdout.decode("utf-8")
    except subprocess.CalledProcessError as e:
        said = e.stderr.decode("utf-8", "replace").strip().splitlines()
        raise FingerprintError(f"git {' '.join(args[:2])} failed: {said[0] if said else e}") from e


class _Blobs:
    """File texts from one repository by blob hash, through one `git cat-file --batch` (a
    walk over history reads thousands of files, most of them unchanged between commits)."""

    _open: dict[Path, _Blobs] = {}

    def __init__(self, repo: Path):
        self._git = subprocess.Popen(["git", "cat-file", "--batch"], cwd=repo, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        self._texts: dict[str, str] = {}

    @classmethod
    def of(cls, repo: Path) -> _Blobs:
        key = Path(repo).resolve()
        if key not in cls._open or cls._open[key]._git.poll() is not None:
            cls._open[key] = cls(key)
        return cls._open[key]

    def text(self, sha: str) -> str:
        if sha not in self._texts:
            self._git.stdin.write(f"{sha}\n".encode())
            self._git.stdin.flush()
            header = self._git.stdout.readline().split()
            if len(header) != 3:
                raise FingerprintError(f"git cannot read blob {sha}")
            data = self._git.stdout.read(int(header[2]) + 1)[:-1]  # the object, then a newline
            self._texts[sha] = _decoded(data, f"blob {sha}", "git")
        return self._texts[sha]


# Parsed modules by (name, text): trees of many commits share most of their files.
_PARSED: dict[tuple[str, str, bool], _Module] = {}


def _decoded(data: bytes, path: str, where: str) -> str:
    """`data` as UTF-8 text, else FingerprintError (one line): asv could not import it either."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FingerprintError(f"{where}: {path} is not UTF-8 text (byte {e.start})") from None


def _parsed(name: str, path: str, text: str, package: bool, where: str) -> _Module:
    key = (name, text, package)
    if key not in _PARSED:
        try:
            _PARSED[key] = _Module(name, ast.parse(text, filename=path), package)
        except SyntaxError as e:
            raise FingerprintError(f"{where}: {path} does not parse: {e}") from e
        except (ValueError, MemoryError, RecursionError) as e:  # a NUL byte; nesting past what the parser holds
            raise FingerprintError(f"{where}: {path} does not parse: {type(e).__name__} {str(e)[:100]}") from None
    return _PARSED[key]


class _Module:
    """One parsed module: what its top level binds, and how."""

    def __init__(self, name: str, tree: ast.Module, package: bool):
        self.name, self.tree, self.package = name, tree, package
        self.defs: dict[str, list[ast.stmt]] = {}
        self.imports: dict[str, tuple[str, str | None]] = {}  # name -> (module, attribute or None)
        self.lazy: dict[str, str] = {}  # name -> module (speedbench._api.lazy's map)
        for node in tree.body:
            self._bind(node)

    def _bind(self, node: ast.stmt) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.defs.setdefault(node.name, []).append(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            self.imports.update(_imports(node, self))
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        self.defs.setdefault(name.id, []).append(node)
            if isinstance(node, ast.Assign) and _is_lazy_call(node.value):
                self._read_lazy(node.value.args[1])
        elif isinstance(node, (ast.If, ast.Try)):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    self._bind(child)
            for handler in getattr(node, "handlers", []):
                for child in handler.body:
                    self._bind(child)

    def _read_lazy(self, mapping: ast.expr) -> None:
        if not isinstance(mapping, ast.Dict):
            return
        for key, value in zip(mapping.keys, mapping.values, strict=True):
            if isinstance(key, ast.Constant) and isinstance(value, (ast.Tuple, ast.List)):
                where = key.value if key.value.startswith(FOLLOWED) else f"{self.name}.{key.value}"
                for item in value.elts:
                    if isinstance(item, ast.Constant) and isinstance(item.value, str):
                        self.lazy[item.value] = where


def _is_lazy_call(value: ast.expr) -> bool:
    """`lazy(__name__, {...})`: a package __init__ that names its API (speedbench._api)."""
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "lazy"
            and len(value.args) == 2)


def _imports(node: ast.Import | ast.ImportFrom, where: _Module) -> dict[str, tuple[str, str | None]]:
    """What an import statement binds: name -> (module, None) for a module, (module, attr)
    for a name taken from one."""
    out: dict[str, tuple[str, str | None]] = {}
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname:
                out[alias.asname] = (alias.name, None)
            else:
                top = alias.name.split(".")[0]
                out[top] = (top, None)
        return out
    base = node.module or ""
    if node.level:
        parts = where.name.split(".")
        parent = parts if where.package else parts[:-1]
        parent = parent[: len(parent) - (node.level - 1)] if node.level > 1 else parent
        base = ".".join([*parent, *([base] if base else [])])
    for alias in node.names:
        out[alias.asname or alias.name] = (base, alias.name)
    return out


def _is_benchmark(tree: SourceTree, mod: _Module, node: ast.ClassDef) -> bool:
    """Whether a class (or one of its bases in the tree) defines a method asv benchmarks."""
    seen = set()
    todo = [(mod, node)]
    while todo:
        m, cls = todo.pop()
        if id(cls) in seen:
            continue
        seen.add(id(cls))
        for item in cls.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith(BENCHMARK_PREFIXES):
                return True
        for base in cls.bases:
            for target in _resolve_expr(tree, m, base, {}):
                if isinstance(target, _Def) and isinstance(target.node, ast.ClassDef):
                    todo.append((target.module, target.node))
    return False


@dataclass(frozen=True)
class _Def:
    module: _Module
    name: str
    node: ast.stmt


def _resolve(tree: SourceTree, mod: _Module, name: str, depth: int = 0) -> list[_Def | _Module]:
    """What `name` is in module `mod`: its top-level definitions, a module, or [] (external
    or unknown)."""
    if depth > 20:
        return []
    if name in mod.defs:
        return [_Def(mod, name, node) for node in mod.defs[name]]
    if name in mod.imports:
        module, attr = mod.imports[name]
        if attr is None:
            target = tree.module(module)
            return [target] if target else []
        source = tree.module(module)
        if source is not None:
            found = _resolve(tree, source, attr, depth + 1)
            if found:
                return found
        sub = tree.module(f"{module}.{attr}")
        return [sub] if sub else []
    if name in mod.lazy:
        source = tree.module(mod.lazy[name])
        return _resolve(tree, source, name, depth + 1) if source else []
    if mod.package:
        sub = tree.module(f"{mod.name}.{name}")
        return [sub] if sub else []
    return []


def _resolve_expr(tree: SourceTree, mod: _Module, expr: ast.expr, local: dict) -> list[_Def | _Module]:
    """What a Name or a dotted Attribute chain refers to, through modules, where followed."""
    chain = []
    while isinstance(expr, ast.Attribute):
        chain.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return []
    if expr.id in local:
        module, attr = local[expr.id]
        found = [tree.module(module)] if attr is None else []
        if attr is not None:
            source = tree.module(module)
            found = _resolve(tree, source, attr) if source else []
            if not found and tree.module(f"{module}.{attr}"):
                found = [tree.module(f"{module}.{attr}")]
        found = [f for f in found if f is not None]
    else:
        found = _resolve(tree, mod, expr.id)
    for attr in reversed(chain):
        modules = [f for f in found if isinstance(f, _Module)]
        if not modules:
            break  # an attribute of a definition: the whole definition is already in
        found = [r for m in modules for r in _resolve(tree, m, attr)]
    return found


def _references(node: ast.AST) -> Iterator[ast.expr]:
    """Every Name and outermost dotted Attribute chain read in `node`; `getattr(x, "name", ...)`
    with a constant name reads as `x.name` (a module's optional attribute, asked for so)."""
    for n in ast.walk(node):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr" and len(n.args) >= 2
                and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str)):
            yield ast.Attribute(value=n.args[0], attr=n.args[1].value, ctx=ast.Load())
    inner = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and id(n) not in inner:
            value = n.value
            while isinstance(value, ast.Attribute):
                inner.add(id(value))
                value = value.value
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and id(n) not in inner:
            yield n
        elif isinstance(n, ast.Name):
            yield n


def _local_imports(node: ast.AST, mod: _Module) -> dict[str, tuple[str, str | None]]:
    out: dict[str, tuple[str, str | None]] = {}
    for n in ast.walk(node):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update(_imports(n, mod))
    return out


class _Normalise(ast.NodeTransformer):
    """Remove what cannot change a measurement (see the module's docstring)."""

    def _body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        kept = []
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value,
                                                                                                  str):
                continue  # a docstring or a string used as a comment
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                continue  # a binding: what it binds is followed instead
            kept.append(stmt)
        return kept

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field in ("body", "orelse", "finalbody"):
            if isinstance(getattr(node, field, None), list):
                setattr(node, field, self._body(getattr(node, field)))
        return super().generic_visit(node)

    def visit_ClassDef(self, node):
        # a benchmark's `version` names what it measures; it is not part of it
        node.body = [s for s in node.body if not _sets_version(s)]
        return self.generic_visit(node)

    def visit_FunctionDef(self, node):
        node.returns = None
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_arg(self, node):
        node.annotation = None
        return node

    def visit_AnnAssign(self, node):
        node.annotation = ast.Constant(None)  # a dataclass field stays a field; its type is not checked at run time
        return self.generic_visit(node)

    def visit_Call(self, node):
        if isinstance(node.func, ast.Name) and node.func.id == "zip":
            node.keywords = [k for k in node.keywords if k.arg != "strict"]
        return self.generic_visit(node)


def _sets_version(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id == "version")


def normalised(node: ast.AST) -> str:
    """The code of one definition as it counts for a fingerprint."""
    clean = _Normalise().visit(copy.deepcopy(node))
    return ast.dump(clean, annotate_fields=False, include_attributes=False)


_HASHES: dict[int, tuple[ast.AST, str]] = {}  # id(node) -> (node, hash): parsed modules are shared


def _piece_hash(node: ast.AST) -> str:
    if id(node) not in _HASHES or _HASHES[id(node)][0] is not node:
        _HASHES[id(node)] = (node, hashlib.sha256(normalised(node).encode()).hexdigest()[:16])
    return _HASHES[id(node)][1]


def fingerprint(tree: SourceTree, benchmark: str) -> Fingerprint:
    """The fingerprint of the benchmark class `module.Class` (module under benchmarks/ or
    written without the package) in `tree`."""
    module_name, _, class_name = benchmark.rpartition(".")
    if not module_name.startswith("benchmarks."):
        module_name = f"benchmarks.{module_name}"
    mod = tree.module(module_name)
    if mod is None or class_name not in mod.defs:
        raise FingerprintError(f"{tree.description}: no benchmark {benchmark}")
    pieces: dict[str, str] = {}
    seen: set[int] = set()
    todo = [_Def(mod, class_name, node) for node in mod.defs[class_name]]
    while todo:
        d = todo.pop()
        if id(d.node) in seen:
            continue
        seen.add(id(d.node))
        label = f"{d.module.name}.{d.name}"
        while label in pieces:  # a name bound twice in one module (an assignment, then a change)
            label += "'"
        pieces[label] = _piece_hash(d.node)
        local = _local_imports(d.node, d.module)
        for ref in _references(d.node):
            for target in _resolve_expr(tree, d.module, ref, local):
                if isinstance(target, _Def) and id(target.node) not in seen:
                    todo.append(target)
    # the pieces' code, not where each lives: a definition that moves keeps the fingerprint
    digest = hashlib.sha256("\n".join(sorted(pieces.values())).encode()).hexdigest()
    return Fingerprint(digest, dict(sorted(pieces.items())))


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """In words, which pieces differ between two fingerprints' {label: hash}: a piece that
    only moved is no change; one that moved and changed is named where it is now."""
    both = set(before.values()) & set(after.values())
    gone = {label: h for label, h in before.items() if h not in both}
    new = {label: h for label, h in after.items() if h not in both}
    out = []
    for label in sorted(new):
        if label in gone:
            out.append(f"changed {label}")
            continue
        moved = [old for old in gone if old.rsplit(".", 1)[-1] == label.rsplit(".", 1)[-1] and old not in new]
        out.append(f"changed {label} (was {moved[0]})" if len(moved) == 1 else f"added {label}")
        if len(moved) == 1:
            del gone[moved[0]]
    out += [f"removed {label}" for label in sorted(gone) if label not in new]
    return out
