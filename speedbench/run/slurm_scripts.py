"""What `speedlib slurm` writes: the request and its time limits, and the text of array.sh,
merge.sh and submit.sh. Stdlib only at import: `speedlib --help` builds this command's parser."""

from __future__ import annotations

import datetime as _dt
import math
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

# A task's time limit: its chunk's cost (plan.chunk_cost: the time recorded on this machine,
# else the estimate, which carries plan.HEADROOM already) times SLURM_HEADROOM, plus the
# task's start (restoring a bundle, importing torch, the pre-flight check, registering the
# asv machine), never under FLOOR_MINUTES. A limit only caps: a task ends when its chunk does.
SLURM_HEADROOM = 1.5
TASK_START_S = 180.0
FLOOR_MINUTES = 10
MERGE_MINUTES = 30  # unpacking archives and one report: minutes at most


@dataclass
class Task:
    chunk: str
    seconds: float  # what the chunk should take here, for one commit
    source: str  # where that figure comes from


@dataclass
class Request:
    shared: Path
    chunks: list[str] = field(default_factory=lambda: ["all"])
    gpus: int | None = None
    gres: str | None = None
    partition: str | None = None
    account: str | None = None
    machine: str | None = None
    into: Path | None = None  # default: the checkout's results/
    bundle: Path | None = None
    extra_sbatch: list[str] = field(default_factory=list)
    python: str = sys.executable
    # filled in by prepare()
    root: Path | None = None
    commit: str = ""
    tasks: list[Task] = field(default_factory=list)
    minutes: int = FLOOR_MINUTES
    notes: list[str] = field(default_factory=list)


def time_limit_minutes(seconds: list[float]) -> int:
    """One --time for the whole array, in minutes: Slurm gives every task of an array the
    same limit, so it is the longest chunk's (cost x SLURM_HEADROOM + TASK_START_S, at least
    FLOOR_MINUTES). One array per time class would let short chunks backfill sooner, but
    would split the merge's dependency over several jobs; a limit above what a task needs
    costs nothing once it runs."""
    longest = max(seconds, default=0.0)
    return max(FLOOR_MINUTES, math.ceil((longest * SLURM_HEADROOM + TASK_START_S) / 60))


# --- the scripts ------------------------------------------------------------------------

def _directives(req: Request, name: str, minutes: int) -> list[str]:
    lines = [f"#SBATCH --job-name={name}", f"#SBATCH --time={minutes}"]
    if req.partition:
        lines.append(f"#SBATCH --partition={req.partition}")
    if req.account:
        lines.append(f"#SBATCH --account={req.account}")
    return lines


def _checkout_lines(req: Request, pin_head: bool) -> list[str]:
    """Shell lines that leave the shell in a checkout of req.commit with $PYTHON set, in
    $SCRATCH (node-local, removed on exit), with HOME and TMPDIR of its own: tasks on one
    node then never share asv's machine file or its forkserver sockets."""
    q = shlex.quote
    lines = [
        f"PYTHON=\"${{SPEEDLIB_PYTHON:-}}\"; [ -n \"$PYTHON\" ] || PYTHON={q(req.python)}",
        *_private_scratch_lines(),
        'mkdir "$SCRATCH/tmp" "$SCRATCH/home"',
        '# a HOME of its own; packages installed with pip --user stay visible',
        'export PYTHONUSERBASE="${PYTHONUSERBASE:-$("$PYTHON" -m site --user-base)}"',
        'export HOME="$SCRATCH/home" TMPDIR="$SCRATCH/tmp"',
        f"COMMIT={req.commit}",
    ]
    if req.bundle is not None:
        lines += [
            f"BUNDLE={q(str(_shared_bundle(req)))}",
            '# offline nodes: the checkout comes from the git bundle, into node-local scratch',
            'CHECKOUT="$SCRATCH/checkout"',
            'mkdir "$CHECKOUT" && cd "$CHECKOUT"',
            'git init -q -b main && git fetch -q "$BUNDLE" main && git reset -q --hard FETCH_HEAD',
            'export PYTHONPATH="$CHECKOUT${PYTHONPATH:+:$PYTHONPATH}"',
        ]
    else:
        lines += [f"CHECKOUT={q(str(req.root))}", 'cd "$CHECKOUT"']
    if pin_head:
        lines += [
            'if [ "$(git rev-parse HEAD)" != "$COMMIT" ]; then',
            '  echo "speedlib slurm: $CHECKOUT is at $(git rev-parse --short HEAD), not $COMMIT as submitted:'
            ' its results would be filed under the wrong commit" >&2',
            '  exit 2',
            'fi',
        ]
    return lines


def _private_scratch_lines() -> list[str]:
    """Shell lines that make $SCRATCH a new directory of this task's own, or exit 2. Never one
    found under a predictable name: in a shared /tmp another user can make it first, and its
    home/.gitconfig (core.fsmonitor) then runs a command as this task's user. mktemp makes a
    new one, mode 0700; its owner and mode are checked before anything goes into it."""
    return [
        'SCRATCH_IN="${SLURM_TMPDIR:-${TMPDIR:-/tmp}}"',
        'SCRATCH="$(mktemp -d "$SCRATCH_IN/slurm-speedlib-${SLURM_JOB_ID:-$$}.XXXXXXXX")" || {',
        '  echo "speedlib slurm: cannot make a scratch directory in $SCRATCH_IN" >&2; exit 2; }',
        'if [ -L "$SCRATCH" ] || [ ! -d "$SCRATCH" ] || [ "$(stat -c \'%u %a\' "$SCRATCH")" != "$(id -u) 700" ]; then',
        '  echo "speedlib slurm: $SCRATCH is not a private directory of this user (mode 0700): not used" >&2',
        '  exit 2',
        'fi',
        "trap 'rm -rf \"$SCRATCH\"' EXIT",
    ]


def _shared_bundle(req: Request) -> Path:
    return req.shared / "speedlib.bundle"


def _header(req: Request, what: str) -> list[str]:
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return ["#!/bin/bash", f"# {what}", f"# Written by speedlib slurm on {when}, commit {req.commit[:12]}."]


def array_script(req: Request) -> str:
    q = shlex.quote
    lines = _header(req, "speedlib slurm: one suite chunk per array task (speedlib run --chunk).")
    lines += _directives(req, "speedlib-chunks", req.minutes)
    lines.insert(3, f"# --time: Slurm gives every task of an array one limit, so this is the longest chunk's: "
                    f"its cost x {SLURM_HEADROOM} + {TASK_START_S:.0f} s to start, at least {FLOOR_MINUTES} min.")
    for i, task in enumerate(req.tasks):
        lines.insert(4 + i, f"#   task {i}: {task.chunk}: {task.seconds / 60:.1f} min ({task.source})")
    lines.append(f"#SBATCH --array=0-{len(req.tasks) - 1}")
    if req.gpus is not None:
        lines.append(f"#SBATCH --gpus={req.gpus}")
    if req.gres is not None:
        lines.append(f"#SBATCH --gres={req.gres}")
    lines += ["set -euo pipefail", f"CHUNKS=({' '.join(q(t.chunk) for t in req.tasks)})",
              'CHUNK="${CHUNKS[$SLURM_ARRAY_TASK_ID]}"', f"SHARED={q(str(req.shared))}",
              'ARCHIVE="$SHARED/archives/$CHUNK.tar.gz"']
    lines += _checkout_lines(req, pin_head=True)
    run = ['"$PYTHON"', "-m", "speedlib", "run", "--chunk", '"$CHUNK"', "--archive", '"$ARCHIVE"',
           "--results-dir", '"$SCRATCH/results"']
    if req.machine:
        run += ["--machine", q(req.machine)]
    lines += ['echo "speedlib slurm: task $SLURM_ARRAY_TASK_ID: chunk $CHUNK at ${COMMIT:0:8} on $(hostname),'
              ' archive -> $ARCHIVE"',
              "status=0", " ".join(run) + " || status=$?",
              '# 3: some benchmarks failed, the rest and the archive were written (speedlib run --help)',
              'echo "speedlib slurm: chunk $CHUNK: speedlib run exited with status $status"', "exit $status"]
    return "\n".join(lines) + "\n"


def merge_script(req: Request) -> str:
    q = shlex.quote
    lines = _header(req, "speedlib slurm: merge the chunks' archives once every array task has ended.")
    lines += _directives(req, "speedlib-merge", MERGE_MINUTES)
    lines += ["set -uo pipefail", f"CHUNKS=({' '.join(q(t.chunk) for t in req.tasks)})",
              f"SHARED={q(str(req.shared))}", f"INTO={q(str(req.into))}"]
    lines += _checkout_lines(req, pin_head=False)
    lines += [
        "archives=() missing=()",
        'for i in "${!CHUNKS[@]}"; do',
        '  archive="$SHARED/archives/${CHUNKS[$i]}.tar.gz"',
        '  if [ -s "$archive" ]; then archives+=("$archive"); else missing+=("${CHUNKS[$i]} (task $i)"); fi',
        "done",
        "status=0",
        'if [ "${#archives[@]}" -gt 0 ]; then',
        '  "$PYTHON" -m speedlib merge "${archives[@]}" --into "$INTO" || status=$?',
        '  if [ "$status" -eq 0 ]; then "$PYTHON" -m speedlib report --results "$INTO" || status=$?; fi',
        "fi",
        'if [ "${#missing[@]}" -gt 0 ]; then',
        # the shared directory is an argument, never part of printf's format: a % in its path stays text
        '  for m in "${missing[@]}"; do',
        '    printf "speedlib slurm: no archive from chunk %s: its task log is in %s/logs\\n" "$m" "$SHARED" >&2',
        "  done",
        '  echo "speedlib slurm: ${#missing[@]} of ${#CHUNKS[@]} chunk(s) missing; the others were merged" >&2',
        "  exit 1",
        "fi",
        'if [ "$status" -eq 0 ]; then echo "speedlib slurm: every chunk merged into $INTO"; fi',
        "exit $status",
    ]
    return "\n".join(lines) + "\n"


def _array_command(req: Request) -> list[str]:
    return ["sbatch", "--parsable", *req.extra_sbatch, str(req.shared / "array.sh")]


def _merge_command(req: Request, array_id: str) -> list[str]:
    return ["sbatch", "--parsable", f"--dependency=afterany:{array_id}", str(req.shared / "merge.sh")]


def submit_script(req: Request) -> str:
    q = shlex.quote
    array = " ".join(q(a) for a in _array_command(req))
    merge = " ".join(q(a) for a in _merge_command(req, "ARRAY")).replace("afterany:ARRAY", 'afterany:"$array"')
    return "\n".join([
        "#!/bin/bash", "# What speedlib slurm --submit runs: the array, then the merge after it.",
        "set -euo pipefail", f"cd {q(str(req.shared / 'logs'))}  # Slurm's output files land here",
        f"array=$({array})", 'array="${array%%;*}"', f"merge=$({merge})", 'merge="${merge%%;*}"',
        'echo "array job $array, merge job $merge: squeue -j $array,$merge"']) + "\n"
