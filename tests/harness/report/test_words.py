"""Every name a benchmark puts on screen has words (speedbench.words): a reader once met
`forloop`, `on` and `gather_fraction_of_floor` with nothing saying what they are.

The benchmark modules are imported as asv imports them (no torch at import time, which
tests/harness/run/test_suite.py checks), and their classes' parameters read the way asv reads them.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path

import pytest

from speedbench import report, words
from speedbench.techniques import TECHNIQUES

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))


def benchmark_classes():
    """(technique, class name, {param name: values}, metrics) for every benchmark class."""
    for path in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        module = importlib.import_module(f"benchmarks.{path.stem}")
        for name, cls in vars(module).items():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__ or name.startswith("_"):
                continue
            names = list(getattr(cls, "param_names", None) or [])
            params = getattr(cls, "params", None) or []
            if names and params and not isinstance(params[0], (list, tuple)):
                params = [params]  # asv's one-parameter shorthand
            metrics = [m.removeprefix("track_").removeprefix("time_") for m in dir(cls)
                       if m.startswith(("track_", "time_"))]
            yield path.stem.removeprefix("bench_"), name, dict(zip(names, params, strict=True)), metrics


CLASSES = list(benchmark_classes())


def test_the_suite_is_read():
    assert len(CLASSES) > 20 and any(p.get("knob") for _, _, p, _ in CLASSES)


@pytest.mark.parametrize("technique, name, params, metrics", CLASSES, ids=[f"{t}.{n}" for t, n, _, _ in CLASSES])
def test_every_variant_knob_and_metric_has_words(technique, name, params, metrics):
    known = words.VARIANTS.get(technique, {})
    if technique != "dashboard":  # the viewer's own load time: no variants
        assert [v for v in params.get("variant", []) if v not in known] == []
    assert [k for k in params.get("knob", []) if k not in words.KNOBS] == []
    if technique == "tuning" and params.get("variant") == ["off", "on"] and "knob" not in params:
        assert words.KNOB_CLASSES.get(name) in words.KNOBS, f"{name}: which knob is on?"
    assert [m for m in metrics if m not in words.METRICS] == []


def test_a_glossary_names_what_is_on_the_page_in_its_order():
    line = words.glossary("tuning", ["off", "on", "on"], ["accumulation"], ["RetainedGraph", "TrainingStep"])
    assert line.startswith("off: the code as most people write it")
    assert line.count("on: the knob applied") == 1  # a name listed twice is said once
    assert "accumulation on: the same batch in 4 micro-batches" in line
    assert "retained_graph on: a detached running loss" in line
    assert words.glossary("contiguous", ["nobody"]) == ""  # unknown names are left out, not guessed


def test_a_benchmark_and_a_metric_read_in_words():
    assert words.benchmark("bench_amp.TrainingStep.track_seconds") == "amp, TrainingStep: seconds per step"
    assert words.metric("gather_fraction_of_floor") == "gather, % of the pinned host->device copy"
    assert words.metric("something_new") == "something_new"


def test_every_technique_says_which_variant_is_pytorchs_default():
    """A baseline is not always what a user gets without changing anything (Adam's default on
    CUDA is foreach, not the per-tensor loop the contiguous benchmarks compare with): every
    technique's glossary says which variant is, after the names it explains."""
    assert set(words.DEFAULTS) == set(report.TECHNIQUES)
    line = words.glossary("contiguous", ["forloop", "foreach"])
    assert line.startswith("forloop: ") and line.endswith(words.DEFAULTS["contiguous"])
    assert "foreach when every parameter is on CUDA and forloop otherwise" in line
    assert "fused is never picked by itself" in line
    # cuDNN's default TF32 convolutions with float32 matmuls: bench_amp's `default`, measured on GPUs
    assert words.DEFAULTS["amp"].startswith("PyTorch's default: default on GPUs, which the suite measures there")
    assert "fp32 on CPUs" in words.DEFAULTS["amp"]
    assert words.DEFAULTS["transfer"].startswith("PyTorch's default: torch_pageable")
    assert "zero_grad" in words.DEFAULTS["tuning"]  # grad = None, the knob's "on", is the default since 2.0
    assert words.glossary("contiguous", ["nobody"]) == ""  # still nothing where nothing is named


def test_every_variant_says_whose_code_it_runs():
    """A baseline is plain PyTorch and says so wherever it is named: every plain variant's
    words say "plain PyTorch", and no other variant's do (speedbench.techniques lists which)."""
    for technique, variants in words.VARIANTS.items():
        plain = set(TECHNIQUES[technique].plain)
        for variant, said in variants.items():
            claims = re.search(r"(?<!not )plain PyTorch", said) is not None  # "not plain PyTorch" is history
            assert claims == (variant in plain), f"{technique}.{variant}: {said}"


def test_old_transfer_names_keep_their_history():
    """Results at old commits keep their variant names: `pinned` was speedlib's own backend,
    and the baseline those results were measured against; what each ran at which commit is on
    the technique's page (tests/harness/report/test_techniques.py holds the page to it)."""
    pinned = words.VARIANTS["transfer"]["pinned"]
    assert "not plain PyTorch" in pinned and "docs/techniques/transfer.md" in pinned
    assert "old results only" in words.VARIANTS["transfer"]["staged"]
    assert "old results only" in words.VARIANTS["transfer"]["index_select"]
    assert "'PyTorch pinned'" in words.VARIANTS["transfer"]["torch_pinned"]
