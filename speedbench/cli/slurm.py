"""`speedlib slurm`: its arguments and what it prints; the job array itself is speedbench.run.slurm."""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path

from speedbench.results.common import printable
from speedbench.run import slurm


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("slurm", help="run the suite on a Slurm cluster: one array task per chunk, then a merge job",
                       description="Write a Slurm job array (one suite chunk per task, each archived into "
                                   "SHARED/archives/) and a job that merges the archives into the results once "
                                   "every task has ended; print them, or submit both with --submit.",
                       epilog="exit status: 0 written (and submitted); 2 bad input or sbatch refused, one line",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shared", required=True, metavar="DIR",
                   help="a directory every node can write: scripts, archives/ and logs/ go there")
    p.add_argument("--chunk", action="extend", nargs="+", metavar="NAME",
                   help="chunks to run, one task each (benchmarks/chunks.py; a group prefix such as headline; "
                        "default: all)")
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument("--gpus", type=int, metavar="N", help="GPUs per task (#SBATCH --gpus=N); none unless asked")
    gpu.add_argument("--gres", metavar="SPEC", help="a generic resource per task instead, e.g. gpu:h100:1")
    p.add_argument("--partition", help="Slurm partition for both jobs")
    p.add_argument("--account", help="Slurm account for both jobs")
    p.add_argument("--machine", help="the asv machine name the tasks file results under, and whose recorded chunk "
                                     "times set the time limit (default: each task names its hardware; estimates)")
    p.add_argument("--into", metavar="DIR", help="the results tree the merge job writes (default: the checkout's "
                                                 "results/)")
    p.add_argument("--bundle", metavar="FILE", help="a git bundle with branch main (git bundle create speedlib.bundle "
                                                    "main): each task restores the checkout from it into node-local "
                                                    "scratch, for nodes that cannot see this checkout")
    p.add_argument("--extra-sbatch", action="append", default=[], metavar="ARG",
                   help="another sbatch option for the array, as --extra-sbatch=--qos=high (repeatable)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--submit", action="store_true", help="submit both jobs with sbatch and print their ids")
    how.add_argument("--dry-run", action="store_true", help="write and print the scripts, submit nothing (default)")
    p.set_defaults(func=_cmd_slurm)
    return p


def _cmd_slurm(args: argparse.Namespace, argv=()) -> int:
    req = slurm.Request(shared=Path(args.shared), chunks=args.chunk or ["all"], gpus=args.gpus, gres=args.gres,
                  partition=args.partition, account=args.account, machine=args.machine,
                  into=Path(args.into) if args.into else None, bundle=Path(args.bundle) if args.bundle else None,
                  extra_sbatch=list(args.extra_sbatch))
    try:
        if args.submit and shutil.which("sbatch") is None:
            raise slurm.SlurmError("--submit needs sbatch, and there is none on PATH: run this on a Slurm login node, "
                             "or leave out --submit to write the scripts only")
        slurm.prepare(req)
        written = slurm.write(req)
        for note in req.notes:
            print(f"speedlib slurm: {note}", file=sys.stderr)
        if not args.submit:
            for name in ("array.sh", "merge.sh"):
                print(f"### {written[name]}\n{written[name].read_text()}")
            print(f"speedlib slurm: {len(req.tasks)} task(s), --time {req.minutes} min each; nothing submitted: "
                  f"speedlib slurm --submit ..., or bash {shlex.quote(str(written['submit.sh']))}")
            return 0
        array, merge = slurm.submit(req)
    except slurm.SlurmError as e:
        print(f"speedlib slurm: {e}", file=sys.stderr)
        return 2
    logs = req.shared / "logs"
    print(f"speedlib slurm: submitted array job {array} ({len(req.tasks)} chunk(s), --time {req.minutes} min each) "
          f"and merge job {merge} (after it, into {printable(str(req.into))})")
    print(f"  watch:    squeue -j {array},{merge}")
    for i, task in enumerate(req.tasks):
        print(f"  task {i}:   {task.chunk}: log {printable(str(logs))}/slurm-{array}_{i}.out")
    print(f"  merge:    log {printable(str(logs))}/slurm-{merge}.out; archives in "
          f"{printable(str(req.shared / 'archives'))}")
    print(f"  cancel:   scancel {array} {merge}")
    return 0
