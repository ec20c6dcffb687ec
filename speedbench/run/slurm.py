"""`speedlib slurm`: the suite's chunks as a Slurm job array, then one job that merges them.

Writes into a shared directory (one every node can read and write):

  array.sh     one array task per chunk: `speedlib run --chunk NAME --archive
               archives/NAME.tar.gz` in a node-local scratch directory
  merge.sh     after every task has ended (--dependency=afterany): `speedlib merge` of the
               archives into the results tree, then `speedlib report`; exit 1 naming the
               chunks whose archive is missing
  submit.sh    the two sbatch commands, as `--submit` runs them
  archives/    one archive per chunk, written by the tasks
  logs/        Slurm's output files (slurm-<array>_<task>.out, slurm-<merge>.out)

The scripts need nothing a single-host `speedlib run` does not: git, this Python with
torch and asv, and the checkout (or, with --bundle, a git bundle restored into node-local
scratch, for nodes that cannot see the checkout). Every path in them is shell-quoted, and
no path appears in an #SBATCH line (Slurm parses those itself): the logs go to logs/
because the jobs are submitted from there.

Stdlib only at import: `speedlib --help` builds this command's parser.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from speedbench.chunks import ChunkError, load_chunks
from speedbench.results import outputs
from speedbench.results.atomic import disk_full, written_whole
from speedbench.results.common import printable as _printable
from speedbench.results.tree import BENCHMARKS, ResultsError, ResultsTree, check_writable
from speedbench.run.slurm_scripts import (  # re-exported: tests and callers use them as slurm.X
    FLOOR_MINUTES,
    MERGE_MINUTES,
    SLURM_HEADROOM,
    TASK_START_S,
    Request,
    Task,
    _array_command,
    _merge_command,
    _shared_bundle,
    array_script,
    merge_script,
    submit_script,
    time_limit_minutes,
)

__all__ = ["SlurmError", "Request", "Task", "prepare", "time_limit_minutes",
           "array_script", "merge_script", "submit_script", "write", "submit",
           "SLURM_HEADROOM", "TASK_START_S", "FLOOR_MINUTES", "MERGE_MINUTES"]

# What may stand in an #SBATCH line or a partition list: no spaces, quotes or shell syntax.
_SLURM_NAME = re.compile(r"[A-Za-z0-9_.,:+=/-]{1,200}")


class SlurmError(ValueError):
    """Input that cannot be turned into jobs; the message is one line saying why."""


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def _check_writable(directory: Path, what: str) -> None:
    """Make `directory` where the results tree's writable check lets it be made, or SlurmError."""
    try:
        check_writable(directory, f"{what} {_printable(str(directory))}", "name a directory you can write to")
        directory.mkdir(parents=True, exist_ok=True)
    except ResultsError as e:
        raise SlurmError(str(e)) from None
    except OSError as e:
        raise SlurmError(f"{what} {_printable(str(directory))} cannot be written ({e.strerror or e}): "
                         "name a directory you can write to") from None


def _check_options(req: Request) -> None:
    from speedbench.run import suite  # noqa: PLC0415 - pandas: `speedlib --help` builds this command's parser

    try:  # the name the tasks file results under, and what their environment would refuse
        suite.check_options(suite.RunOptions(machine=req.machine))
    except suite.SuiteError as e:
        raise SlurmError(str(e)) from None
    if req.gpus is not None and req.gres is not None:
        raise SlurmError("--gpus and --gres both request GPUs: give one of them")
    if req.gpus is not None and req.gpus < 1:
        raise SlurmError(f"--gpus must be a positive whole number, got {req.gpus}")
    for option, value in (("--gres", req.gres), ("--partition", req.partition), ("--account", req.account)):
        if value is not None and not _SLURM_NAME.fullmatch(value):
            raise SlurmError(f"{option} '{_printable(value)}' is not a Slurm name: letters, digits and . _ , : + = / -")
    for arg in req.extra_sbatch:
        if not arg.startswith("-") or "\n" in arg or "\r" in arg:
            raise SlurmError(f"--extra-sbatch '{_printable(arg)}' is not an sbatch option: give it as "
                             "--extra-sbatch=--qos=high, one option each")
    if req.bundle is not None and not req.bundle.is_file():
        raise SlurmError(f"--bundle {_printable(str(req.bundle))} is not a file: make one with "
                         "git bundle create speedlib.bundle main")


def _commit(req: Request) -> str:
    """The commit the tasks will measure: the bundle's main, or the checkout's HEAD (clean)."""
    if req.bundle is not None:
        heads = _git(req.root, "bundle", "list-heads", str(req.bundle.resolve()), "refs/heads/main")
        sha = heads.stdout.split()[0] if heads.returncode == 0 and heads.stdout.split() else ""
        if not re.fullmatch(r"[0-9a-f]{40,64}", sha):
            raise SlurmError(f"--bundle {_printable(str(req.bundle))} holds no branch main: make it with "
                             "git bundle create speedlib.bundle main")
        return sha
    from speedbench.run import suite  # noqa: PLC0415 - pandas: `speedlib --help` builds this command's parser

    try:
        sha = suite.resolve_commits(req.root, None)[0]
    except suite.SuiteError as e:
        raise SlurmError(f"{e} (or pass --bundle FILE)") from None
    try:
        dirty = suite._dirty(req.root)  # what `speedlib run` itself refuses
    except suite.SuiteError as e:
        raise SlurmError(str(e)) from None
    if dirty:
        raise SlurmError(f"uncommitted changes in the checkout ({_printable(dirty[0])}, ...): each task's speedlib run "
                         "would refuse them; commit first")
    return sha


def _price(req: Request) -> None:
    """req.tasks and req.minutes from the chunks' recorded times or estimates."""
    from speedbench.results.listing import combinations  # noqa: PLC0415 - pandas: `speedlib --help` builds this command's parser
    from speedbench.run import plan  # noqa: PLC0415 - as above

    try:
        chunks = load_chunks(req.root)
        selected = plan.select_chunks(chunks, req.chunks)
        listing = plan.benchmark_listing(req.root, req.into)
    except (ChunkError, OSError, SyntaxError) as e:
        raise SlurmError(str(e)) from None
    names = combinations(listing) if listing is not None else {}
    if req.machine is not None:
        recorded = plan.recorded_chunk_seconds(req.into, req.machine)
        per_combination, _ = plan.seconds_per_combination(chunks, names, req.into, req.machine)
    else:
        recorded, per_combination = {}, plan.SECONDS_PER_COMBINATION
        req.notes.append("no --machine: every chunk is priced by its estimate, not by a machine's recorded times")
    if req.gpus is None and req.gres is None:
        # The suite is about GPUs: on a CPU node every GPU-only comparison comes back "needs a GPU".
        req.notes.append("no GPU requested: the tasks run where Slurm puts them, a CPU node included, and GPU-only "
                         "comparisons are then skipped; add --gpus 1 (and --partition) for a GPU run, and give "
                         "the chunks that compare several GPUs (headline-parallel) their own submission with --gpus 2")
    for chunk in selected:
        if chunk.name not in recorded and plan.estimate_seconds(chunk, names)[1] == 0:
            where = (f"{_printable(str(listing))} lists no benchmark of it" if listing is not None else
                     f"there is no {BENCHMARKS} in {_printable(str(req.into))} or the checkout's results/")
            raise SlurmError(f"chunk {chunk.name} has no time estimate: {where}, and "
                             f"{req.machine or 'no --machine'} recorded no time for it; run "
                             f"speedlib run --chunk {chunk.name} once, or leave it out")
        seconds, source = plan.chunk_cost(chunk, names, req.into, req.machine or "", per_combination)
        req.tasks.append(Task(chunk.name, seconds, source))
    req.minutes = time_limit_minutes([t.seconds for t in req.tasks])


def prepare(req: Request, root: Path | None = None) -> Request:
    """Check everything and price the chunks; SlurmError (one line) for bad input."""
    from speedbench.run import suite  # noqa: PLC0415 - pandas: `speedlib --help` builds this command's parser

    _check_options(req)
    try:
        req.root = Path(root or suite.find_root()).resolve()
    except suite.SuiteError as e:
        raise SlurmError(str(e)) from None
    req.shared = req.shared.absolute()
    req.into = (req.into or ResultsTree.in_checkout(req.root).root).absolute()
    try:  # the one output rule: the scripts, archives and logs never go among the results
        outputs.directory_output(req.shared, "--shared", [req.into])
    except outputs.OutputRefused as e:
        raise SlurmError(str(e)) from None
    _check_writable(req.shared, "--shared")
    _check_writable(req.into, "--into")
    _price(req)  # a bad chunk name first: it needs no git
    req.commit = _commit(req)
    return req


def write(req: Request) -> dict[str, Path]:
    """The three scripts, logs/ and archives/ in the shared directory; the bundle copied there.
    Archives an earlier submission left for these chunks move to archives/earlier-<time>/:
    the merge must not take them for this run's. A SlurmError (one line) where the shared
    directory cannot take them: a folder that is a file, a full disk."""
    try:
        return _write(req)
    except OSError as e:
        named = e.filename2 or e.filename  # the name written over, else the file being written
        where = _printable(str(named)) if isinstance(named, (str, Path)) else f"into {_printable(str(req.shared))}"
        raise SlurmError(f"cannot write {where} ({e.strerror or e}){disk_full(e)}: "
                         "free some space, or give --shared a directory you can write to") from None


def _folder(path: Path) -> Path:
    """`path` as a directory, made if missing; a SlurmError where something else has its name."""
    try:
        path.mkdir(exist_ok=True)
    except FileExistsError:
        pass  # a file or a dangling link has the name: said below
    if not path.is_dir():
        raise SlurmError(f"{_printable(str(path))} is not a directory: speedlib slurm keeps its "
                         f"{path.name} there; move it away or give another --shared")
    return path


def _aside(archives: Path) -> Path:
    """A new directory archives/earlier-<time>[-N] for an earlier submission's archives: two
    submissions within one second each get their own (the second moved its archives over the
    first's, and one was lost)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("earlier-%Y%m%dT%H%M%S")
    for n in range(1, 10_000):
        aside = archives / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            aside.mkdir()
            return aside
        except FileExistsError:
            continue
    raise SlurmError(f"{_printable(str(archives))} holds 9999 directories named {stamp}*: move them away")


def _write(req: Request) -> dict[str, Path]:
    _folder(req.shared / "logs")
    archives = _folder(req.shared / "archives")
    stale = [archives / f"{t.chunk}.tar.gz" for t in req.tasks if (archives / f"{t.chunk}.tar.gz").exists()]
    if stale:
        aside = _aside(archives)
        for path in stale:
            path.rename(aside / path.name)  # a directory new to this call: nothing there to replace
        req.notes.append(f"moved {len(stale)} archive(s) of an earlier submission into {_printable(str(aside))}")
    if req.bundle is not None and req.bundle.resolve() != _shared_bundle(req).resolve():
        with req.bundle.open("rb") as src, written_whole(_shared_bundle(req)) as dst:
            shutil.copyfileobj(src, dst)
    written = {}
    for name, text in (("array.sh", array_script(req)), ("merge.sh", merge_script(req)),
                       ("submit.sh", submit_script(req))):
        path = req.shared / name
        # A new file renamed over the name: a link planted there is replaced, never followed
        # (its target neither rewritten nor made executable).
        with written_whole(path) as f:
            f.write(text.encode())
            os.fchmod(f.fileno(), 0o755)
        written[name] = path
    return written


def _sbatch(args: list[str], cwd: Path) -> str:
    try:
        out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmError(f"{' '.join(args[:2])} failed: {e}") from None
    job = out.stdout.strip().split(";")[0]
    if out.returncode != 0 or not re.fullmatch(r"\d+", job):
        said = (out.stderr.strip().splitlines() or [out.stdout.strip() or f"exit status {out.returncode}"])[-1]
        raise SlurmError(f"sbatch refused {Path(args[-1]).name}: {_printable(said)}")
    return job


def submit(req: Request) -> tuple[str, str]:
    """sbatch the array, then the merge after it; (array id, merge id)."""
    logs = req.shared / "logs"
    array = _sbatch(_array_command(req), logs)
    try:
        merge = _sbatch(_merge_command(req, array), logs)
    except SlurmError as e:
        raise SlurmError(f"{e}; the array job {array} was submitted: scancel {array}, or submit the merge with: "
                         f"cd {shlex.quote(str(logs))} && {shlex.join(_merge_command(req, array))}") from None
    return array, merge
