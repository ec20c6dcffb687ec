"""How `speedlib merge` combines trees in memory, entry by entry: added, identical, a conflict or
displaced (the rules are speedbench.results.merge's docstring; that module writes the result)."""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path

from speedbench.results.merge_sources import _bad, _loads, _Machine, _Raw, _Tree, printable, records
from speedbench.results.tree import BENCHMARKS, DISPLACED, ENVIRONMENT_DIR, MACHINE_FILE

# machine.json's fields that name the hardware (asv machine --cpu/--arch/--num_cpu/--ram)
_HARDWARE = ("arch", "cpu", "num_cpu", "ram")


def _when(ms) -> str:
    try:
        return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).isoformat(timespec="seconds")
    except (TypeError, ValueError, OverflowError, OSError):
        return "at an unknown time"


def _same(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # NaN equals NaN


def _row_field(obj: dict, row: list, column: str):
    """One column of a row of asv result object `obj` (None where absent)."""
    cols = obj["result_columns"]
    i = cols.index(column) if column in cols else len(row)
    return row[i] if i < len(row) else None


def _later(a, b) -> bool:
    """Whether start time `a` is later than `b` (an unknown one is earliest)."""
    num = (int, float)
    return isinstance(a, num) and (not isinstance(b, num) or a > b)


@dataclass
class _Merge:
    into: _Tree
    prefer: str | None
    conflicts: list[str] = field(default_factory=list)
    hardware: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    changed: set[tuple[str, str]] = field(default_factory=set)  # (machine or '', path) to write
    added: dict[tuple, list[int]] = field(default_factory=dict)  # (machine, file) -> [added, replaced]
    origin: dict[tuple, str] = field(default_factory=dict)
    appended: dict[tuple[str, str], int] = field(default_factory=dict)  # (machine, jsonl) -> lines

    def source_of(self, key: tuple) -> str:
        return self.origin.get(key, self.into.label)

    def displace(self, machine: str, record: dict, why: str) -> None:
        side = self.into.machines[machine].lines.setdefault(DISPLACED, [])
        if _displaced_key(record) not in {_displaced_key(_loads(line)) for line in side}:  # wherever it came from
            side.append(json.dumps(record, sort_keys=True).encode())
            self.changed.add((machine, DISPLACED))
        self.said.append(f"{why}; the displaced entry is kept in {printable(machine)}/{DISPLACED}")

    def check_hardware(self, name: str, src: _Machine, label: str) -> None:
        from speedbench.results import machines  # noqa: PLC0415 - it loads pandas

        have = self.into.machines.get(name)
        if have is None:
            return
        if have.info and src.info:
            differ = [f for f in _HARDWARE if f in have.info and f in src.info and have.info[f] != src.info[f]]
            if differ:
                f = differ[0]
                self.hardware.append(
                    f"machine {printable(name)}: {printable(self.source_of(('info', name)))} has {f} "
                    f"{printable(str(have.info[f]))} and {label} {printable(str(src.info[f]))}")
                return
        mine = [machines.hardware(r) for r in records(have)]
        for theirs in map(machines.hardware, records(src)):
            other = machines.clash(mine, theirs)
            if other is not None:
                self.hardware.append(
                    f"machine {printable(name)}: {printable(self.source_of(('env', name)))} recorded "
                    f"{printable(machines.describe(other))} and {label} {printable(machines.describe(theirs))}")
                return

    def listing(self, src: _Tree) -> None:
        """benchmarks.json follows the newest listing, as asv rewrites it on every run: entries
        in both take the newer one's, entries in one only are kept (a benchmark removed since
        still needs its entry for its old results to load). Never a conflict: a result file
        keeps each benchmark's version, so results of a replaced version load, marked."""
        if src.listing is None:
            return
        have = self.into.listing
        if have is None:
            self.into.listing, self.into.listing_raw = dict(src.listing), src.listing_raw
            self.changed.add(("", BENCHMARKS))  # as it was written, unless a later source adds to it
            self.origin["listing"] = src.label
            return
        mine, theirs = _listing_start(self.into), _listing_start(src)
        newer = _later(theirs, mine)
        merged = {**have, **src.listing} if newer else {**src.listing, **have}
        if _same(merged, have):
            return
        added = len(merged.keys() - have.keys())
        replaced = sum(1 for k in have if not _same(have[k], merged[k]))
        self.into.listing = merged
        self.into.listing_raw = src.listing_raw if _same(merged, src.listing) else None  # else asv's format
        self.changed.add(("", BENCHMARKS))
        if newer:
            was, self.origin["listing"] = self.source_of("listing"), src.label
            self.said.append(f"{BENCHMARKS} follows the newer listing of {src.label} (its results last started "
                             f"{_when(theirs)}, those of the listing of {printable(was)} {_when(mine)}): "
                             f"{replaced} entr(y/ies) replaced, "
                             f"{added} added, {len(have.keys() - src.listing.keys())} kept from the older listing "
                             "only; results of replaced versions stay, marked as of an earlier version")
        else:
            self.said.append(f"{BENCHMARKS}: {added} entr(y/ies) added from the older listing of {src.label} "
                             f"(its results last started {_when(theirs)}); the rest stays as the newer listing has it")

    def machine(self, name: str, src: _Machine, label: str) -> None:
        if name not in self.into.machines:
            self.into.machines[name] = _Machine()
        have = self.into.machines[name]
        if have.info is None and src.info is not None:
            have.info, have.info_raw = src.info, src.info_raw
            self.origin[("info", name)] = label
            self.changed.add((name, MACHINE_FILE))
        for file, obj in src.results.items():
            if file not in have.results:
                have.results[file], have.raw[file] = obj, src.raw[file]
                self.changed.add((name, file))
                self.said.append(f"added {printable(name)}/{printable(file)} ({len(obj['results'])} benchmark(s)) "
                                 f"from {label}")
                for bench in obj["results"]:
                    self.origin[(name, file, bench)] = label
            elif self.result_file(name, file, have.results[file], obj, label):
                have.raw.pop(file, None)  # rewritten in asv's format
        for inner, obj in src.side.items():
            self.side_file(name, inner, have, obj, src.raw[inner], label)
        if src.lines.keys() - {DISPLACED} and not any(k.startswith(f"{ENVIRONMENT_DIR}/") for k in have.lines):
            self.origin[("env", name)] = label
        for inner, lines in src.lines.items():
            added = _append(have.lines, inner, lines)
            if added:
                self.changed.add((name, inner))
                if inner != DISPLACED:
                    self.appended[(name, inner)] = self.appended.get((name, inner), 0) + added

    def side_file(self, name: str, inner: str, have: _Machine, obj: dict, raw: _Raw, label: str) -> None:
        """A per-commit side file (SIDE_DIRS) is one entry: added, identical, or a conflict
        that --prefer newer settles by its `started_at` like a result."""
        old = have.side.get(inner)
        if old is not None and _same(old, obj):
            return
        key, where = (name, inner), f"{printable(name)}/{printable(inner)}"
        if old is None:
            have.side[inner], have.raw[inner], self.origin[key] = obj, raw, label
            self.changed.add(key)
            self.said.append(f"added {where} from {label}")
            return
        was, t_old, t_new = self.source_of(key), old.get("started_at"), obj.get("started_at")
        if self.prefer != "newer":
            self.conflicts.append(f"{where}: {printable(was)} started {_when(t_old)}, {label} started {_when(t_new)}")
            return
        keep_new = _later(t_new, t_old)
        gone, gone_from, gone_at = (old, was, t_old) if keep_new else (obj, label, t_new)
        if keep_new:
            have.side[inner], have.raw[inner], self.origin[key] = obj, raw, label
            self.changed.add(key)
        self.displace(name, {"file": inner, "entry": gone, "source": Path(gone_from).name},
                      f"displaced {where} from {printable(gone_from)} (started {_when(gone_at)}) by the newer one")

    def result_file(self, name: str, file: str, have: dict, obj: dict, label: str) -> bool:
        """Merge result object `obj` into `have`; whether `have` changed."""
        where = f"{printable(name)}/{printable(file)}"
        for key in ("commit_hash", "env_name", "result_columns"):
            if not _same(have.get(key), obj.get(key)):
                raise _bad(f"{where} in {label} differs from the one it merges with in {key}: not one commit's "
                           "results in one environment")
        counts = self.added.setdefault((name, file), [0, 0])
        dirty = False
        for bench, row in obj["results"].items():
            old = have["results"].get(bench)
            if old is None:
                have["results"][bench] = row
                self.origin[(name, file, bench)] = label
                counts[0] += 1
                dirty = True
                continue
            if _same(old, row):
                continue
            was = self.source_of((name, file, bench))
            t_old, t_new = _row_field(have, old, "started_at"), _row_field(obj, row, "started_at")
            version, other = _row_field(have, old, "version"), _row_field(obj, row, "version")
            # Two versions of the benchmark's code are two measurements, not one twice: asv's
            # file holds one, so the later run stays (as asv's own rerun would leave it).
            if self.prefer != "newer" and _same(version, other):
                self.conflicts.append(
                    f"machine {printable(name)}, commit {printable(have['commit_hash'][:8])}, benchmark "
                    f"{printable(bench)} (version {printable(str(version))[:12]}): {printable(was)} started "
                    f"{_when(t_old)}, {label} started {_when(t_new)}")
                continue
            keep_new = _later(t_new, t_old)
            gone, gone_from, gone_at = (old, was, t_old) if keep_new else (row, label, t_new)
            if keep_new:
                have["results"][bench] = row
                self.origin[(name, file, bench)] = label
                counts[1] += 1
                dirty = True
            self.displace(name, {"file": file, "commit_hash": have["commit_hash"], "env_name": have["env_name"],
                                 "benchmark": bench, "result_columns": have["result_columns"], "row": gone,
                                 "source": Path(gone_from).name},
                          f"displaced {printable(name)} {printable(have['commit_hash'][:8])} {printable(bench)} from "
                          f"{printable(gone_from)} (started {_when(gone_at)}) by the newer one"
                          + ("" if _same(version, other) else ", of another version of the benchmark"))
        durations = {**have.get("durations", {})}
        newer = _later(obj.get("date"), have.get("date"))
        for key, value in obj.get("durations", {}).items():
            if key not in durations or (newer and durations[key] != value):
                durations[key] = value
        if not _same(durations, have.get("durations", {})):
            have["durations"], dirty = durations, True
        if newer:
            have["date"], dirty = obj["date"], True
        if dirty:
            self.changed.add((name, file))
        return dirty


def _displaced_key(record) -> str:
    """A displaced entry's identity: the same entry displaced again, from a source by another
    name, is not written twice."""
    if not isinstance(record, dict):
        return ""
    return json.dumps({k: v for k, v in record.items() if k != "source"}, sort_keys=True)


def _listing_start(tree: _Tree):
    """When `tree`'s listing was last measured with: the latest start of its results of the
    versions it lists (asv writes the listing of the run it discovers); None if unknown."""
    starts = [_row_field(obj, row, "started_at") for m in tree.machines.values() for obj in m.results.values()
              for bench, row in obj["results"].items()
              if isinstance(tree.listing.get(bench), dict)
              and _row_field(obj, row, "version") == tree.listing[bench].get("version")]
    known = [s for s in starts if isinstance(s, (int, float)) and not isinstance(s, bool)]
    return max(known) if known else None


def _append(store: dict[str, list[bytes]], inner: str, lines: list[bytes]) -> int:
    """Add the lines of `lines` not yet in store[inner]; how many were added."""
    have = store.setdefault(inner, [])
    seen = {line.strip() for line in have}
    new = []
    for line in lines:
        if line.strip() not in seen:
            seen.add(line.strip())
            new.append(line)
    have += new
    return len(new)
