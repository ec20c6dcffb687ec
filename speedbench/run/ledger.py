"""benchmarks/versions.json: each benchmark's hand-set version, and why it is what it is
(`speedlib versions`).

asv keeps a result under its benchmark's `version` and sets aside every result of another
one. A benchmark class says its version itself (`version = "1"` in its body), and this
ledger holds, per benchmark class, each version's reason and the fingerprints of the code
accepted as that version (speedbench.run.fingerprint): the one it had when the version was
set, and any later code judged to measure the same thing, each with its reason. It also
keeps the current fingerprint's pieces, so that a change is named piece by piece.

The check (`speedlib versions`, run by the tests) fails where a class's code no longer
matches a fingerprint of its version: the author then bumps the version (`--bump`, the
measurement changed: older results stop being compared with newer ones) or records why the
new code measures the same thing (`--same`). A comment, a docstring or a lint pass changes no
fingerprint, so it needs neither. Results recovered from before versions were set by hand
(asv's hashes of the source) are listed under the version they were judged to measure
(`asv`: hash -> the code that produced it).
"""

from __future__ import annotations

import ast
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from speedbench.results.atomic import write_whole
from speedbench.run.fingerprint import FingerprintError, SourceTree, changes, fingerprint

__all__ = ["LEDGER", "Finding", "FingerprintError", "LedgerError", "check", "declared_versions",
           "describe", "load", "record", "save"]

LEDGER = Path("benchmarks") / "versions.json"


class LedgerError(Exception):
    """A ledger or a benchmark source that cannot be read or changed as asked."""


@dataclass
class Finding:
    """What the check found for one benchmark class; `ok` where nothing needs doing.
    `misfiles`: its results would be filed under a version that does not describe them (its
    code changed since the version was recorded, or class and ledger disagree); a class the
    ledger does not know yet gets asv's hash of its source, which misfiles nothing."""

    benchmark: str
    ok: bool
    says: str
    changed: list[str] = field(default_factory=list)
    misfiles: bool = False


def load(root: Path) -> dict:
    """The ledger of the checkout at `root` ({} where there is none yet); LedgerError, one
    line, where it is not a regular file (a FIFO held every command that checks versions, a
    run included), cannot be read, or is not the ledger's shape (`_shape`)."""
    path = Path(root) / LEDGER
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            raise LedgerError(f"{LEDGER} is a link to nothing ({os.readlink(path)}): restore it from git") from None
        return {"benchmarks": {}}
    except OSError as e:
        raise LedgerError(f"{LEDGER} cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        raise LedgerError(f"{LEDGER} is not a regular file (a directory, FIFO or device): restore it from git")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LedgerError(f"{LEDGER} cannot be read: {e}") from e
    except RecursionError:
        raise LedgerError(f"{LEDGER} cannot be read: nested deeper than any ledger is") from None
    why = _shape(data)
    if why:
        raise LedgerError(f"{LEDGER} {why}: restore it from git, or fix that entry by hand")
    return data


def _shape(data) -> str | None:
    """Why `data` is not a ledger `record` and the check can use, or None: every entry an object
    with its version a string, its versions objects holding a why and fingerprints (digest ->
    why), its pieces (name -> digest) an object."""
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), dict):
        return "holds no 'benchmarks' table"

    def strings(value) -> bool:
        return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())

    for name, entry in data["benchmarks"].items():
        where = f"entry {name!r}"
        if not isinstance(entry, dict):
            return f"{where} is not an object"
        if not isinstance(entry.get("version"), str):
            return f"{where} has no version string"
        versions = entry.get("versions")
        if not isinstance(versions, dict) or entry["version"] not in versions:
            return f"{where} does not list its version {entry['version']!r} under 'versions'"
        for version, about in versions.items():
            if not (isinstance(about, dict) and strings(about.get("fingerprints")) and strings(about.get("asv", {}))
                    and isinstance(about.get("why", ""), str)):
                return f"{where}: version {version!r} is not an object with fingerprints (digest -> why)"
        if not strings(entry.get("pieces", {})):
            return f"{where}: its pieces are not an object of digests"
    return None


def save(root: Path, data: dict) -> None:
    text = json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    write_whole(Path(root) / LEDGER, text.encode("utf-8"))


def declared_versions(tree: SourceTree) -> dict[str, str | None]:
    """Each benchmark class's own `version = "..."` (None where its body sets none: an
    inherited or default version would be asv's hash of the source again)."""
    out = {}
    for benchmark in tree.benchmark_classes():
        module, _, name = benchmark.rpartition(".")
        node = tree.module(f"benchmarks.{module}").defs[name][0]
        out[benchmark] = _own_version(node)
    return out


def _own_version(node: ast.ClassDef) -> str | None:
    for item in node.body:
        if (isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "version" for t in item.targets)
                and isinstance(item.value, ast.Constant) and isinstance(item.value.value, str)):
            return item.value.value
    return None


def check(root: Path) -> list[Finding]:
    """One finding per benchmark class of the checkout at `root`, against its ledger."""
    tree = SourceTree.directory(root)
    ledger = load(root)["benchmarks"]
    findings = []
    for benchmark, version in declared_versions(tree).items():
        entry = ledger.get(benchmark)
        if version is None:
            findings.append(Finding(benchmark, False, "sets no version of its own: record it (speedlib versions "
                                                      f"--bump {benchmark} --why ...), which adds it to the class"))
            continue
        if entry is None:
            findings.append(Finding(benchmark, False, f"is not in {LEDGER}: record it (speedlib versions --bump "
                                                      f"{benchmark} --why ...)"))
            continue
        if entry.get("version") != version:
            findings.append(Finding(benchmark, False, f"says version {version!r}, {LEDGER} {entry.get('version')!r}: "
                                                      "set one of them by `speedlib versions --bump`", misfiles=True))
            continue
        now = fingerprint(tree, benchmark)
        accepted = entry.get("versions", {}).get(version, {}).get("fingerprints", {})
        if now.digest in accepted:
            findings.append(Finding(benchmark, True, f"version {version}"))
            continue
        changed = changes(entry.get("pieces", {}), now.pieces)
        findings.append(Finding(benchmark, False, f"measures with other code than version {version} was recorded "
                                                  f"with: bump it (speedlib versions --bump {benchmark} --why ...) "
                                                  "or say why it measures the same (--same)", changed, misfiles=True))
    return findings


def record(root: Path, benchmarks: list[str], why: str, bump: bool, at: str | None = None) -> list[str]:
    """Record the current code of `benchmarks` (every one the check finds wrong, where
    empty): `bump` sets the next version (in the class and here), else the current
    version accepts this code as measuring the same thing. With `at` (a commit; not with
    `bump`), the code of that commit is what the current version accepts, as it was
    judged to measure the same thing (results measured with it are then recovered by
    `speedlib versions --recover`). Returns one line per change."""
    if not why.strip():
        raise LedgerError("say why (--why): it is what a reader of the ledger has to go on")
    if not why.isprintable():  # a newline or an escape would restyle every terminal that shows the ledger
        raise LedgerError("--why must be one line of printable text (no newline, tab or control character)")
    if at is not None and bump:
        raise LedgerError("--at names older code that measures what a version does: use it with --same")
    tree = SourceTree.directory(root)
    older = SourceTree.commit(root, at) if at is not None else None
    declared = declared_versions(tree)
    data = load(root)
    ledger = data["benchmarks"]
    if not benchmarks:
        if older is not None:
            raise LedgerError("--at needs the benchmarks whose older code is judged the same, by name")
        benchmarks = [f.benchmark for f in check(root) if not f.ok]
        if not benchmarks:
            return []
    unknown = [b for b in benchmarks if b not in declared]
    if unknown:
        shown = ", ".join(b if len(b) <= 80 else f"{b[:60]}... ({len(b)} characters)" for b in unknown[:3])
        raise LedgerError(f"no benchmark class {shown}{', ...' if len(unknown) > 3 else ''} (known: module.Class, e.g. "
                          f"{next(iter(declared), 'bench_amp.TrainingStep')})")
    said = []
    for benchmark in benchmarks:
        if older is not None:
            if ledger.get(benchmark, {}).get("version") is None:
                raise LedgerError(f"{benchmark} has no version in {LEDGER} yet for older code to be judged the same as")
            entry = ledger[benchmark]
            then = fingerprint(older, benchmark)
            entry["versions"][entry["version"]]["fingerprints"][then.digest] = f"the code at {at}: {why.strip()}"
            said.append(f"{benchmark}: version {entry['version']} accepts the code at {at}")
            continue
        now = fingerprint(tree, benchmark)
        entry = ledger.setdefault(benchmark, {"versions": {}})
        current = entry.get("version")
        if bump or current is None:
            version = _next(current, declared[benchmark])
            _set_class_version(root, benchmark, version)
            entry["versions"][version] = {"why": why.strip(), "fingerprints": {now.digest: why.strip()}}
            said.append(f"{benchmark}: version {version} ({'was ' + current if current else 'new'})")
        else:
            version = current
            if declared[benchmark] != version:
                raise LedgerError(f"{benchmark} says version {declared[benchmark]!r} and {LEDGER} {version!r}: "
                                  "--same keeps a version, so first make them agree (--bump)")
            entry["versions"][version]["fingerprints"][now.digest] = why.strip()
            said.append(f"{benchmark}: version {version} accepts this code")
        entry["version"] = version
        entry["pieces"] = now.pieces
    save(root, data)
    return said


def _next(current: str | None, declared: str | None) -> str:
    """The version after `current` (numbers count up; "1" for a new benchmark)."""
    if current is None:
        return declared if declared else "1"
    if not current.isdigit():
        raise LedgerError(f"version {current!r} is not a number: bump it by hand in the class and the ledger")
    return str(int(current) + 1)


_VERSION_LINE = re.compile(r'^(\s+version\s*=\s*)(["\'])[^"\']*\2', re.MULTILINE)


def _set_class_version(root: Path, benchmark: str, version: str) -> None:
    """Write `version = "<version>"` into the class's own body (added as its first
    statement after the docstring where it has none)."""
    module, _, name = benchmark.rpartition(".")
    path = Path(root) / "benchmarks" / f"{module}.py"
    if path.is_symlink() or not path.is_file():  # written through a link, the bump would land outside the checkout
        raise LedgerError(f"{path} is a link or not a regular file: set the version in {name} by hand")
    text = path.read_text(encoding="utf-8")
    node = next((n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is None:
        raise LedgerError(f"no class {name} in {path}")
    lines = text.splitlines(keepends=True)
    start, end = node.body[0].lineno - 1, node.end_lineno
    body = "".join(lines[start:end])
    if _own_version(node) is not None:
        body, n = _VERSION_LINE.subn(lambda m: f'{m.group(1)}"{version}"', body, count=1)
        if n != 1:
            raise LedgerError(f"{path}: {name}'s version is not one line `version = \"...\"`: change it by hand")
        lines[start:end] = [body]
    else:
        first = node.body[0]
        after_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        at = first.end_lineno if after_doc else first.lineno - 1
        indent = " " * first.col_offset
        line = f'{indent}version = "{version}"  # bumped when what it measures changes: benchmarks/versions.json\n'
        lines[at:at] = ["\n", line] if after_doc else [line]
    write_whole(path, "".join(lines).encode("utf-8"))


def describe(findings: list[Finding]) -> str:
    """The check's findings in words: the failing ones in full, the rest counted."""
    out = []
    for f in findings:
        if not f.ok:
            out.append(f"{f.benchmark} {f.says}")
            out += [f"    {c}" for c in f.changed]
    ok = sum(f.ok for f in findings)
    out.append(f"{ok} of {len(findings)} benchmark classes measure what their version was recorded with")
    return "\n".join(out)

