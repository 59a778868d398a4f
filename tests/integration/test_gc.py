"""Python's garbage collector runs between minibatches, never inside one: its pauses fall on
every rank at once and no model of the engines could account for them (run/worker.py)."""

from __future__ import annotations

import gc
import json
from functools import partial
from pathlib import Path

import pytest

from odc_bench.run import trace
from odc_bench.run.local import run_local
from odc_bench.run.worker import RankJob, rank_entry
from tests.integration.test_reliability import _spec


def gc_watching_entry(folder: str, rank: int, job: RankJob) -> None:
    """rank_entry that writes when each of the collector's runs started (bind `folder` with
    functools.partial: the ranks unpickle it by name)."""
    starts: list[float] = []

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            starts.append(trace.now())

    gc.callbacks.append(note)
    try:
        rank_entry(rank, job)
    finally:
        gc.callbacks.remove(note)
        (Path(folder) / f"rank{rank}.json").write_text(json.dumps(starts))


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["odc", "collective"])
def test_the_collector_runs_between_minibatches_only(engine, tmp_path):
    spec = _spec(engine, "timeout_s=60")
    results = run_local(spec, entry=partial(gc_watching_entry, str(tmp_path)))
    for r, result in enumerate(results):
        starts = json.loads((tmp_path / f"rank{r}.json").read_text())
        spans = [(e["t0"], e["t1"]) for e in result["events"] if e["kind"] == "minibatch"]
        gaps = [(e["t0"], e["t1"]) for e in result["events"] if e["kind"] == "gc"]
        assert len(spans) == len(gaps) == len(spec.minibatches)
        inside = [t for t in starts if any(t0 <= t <= t1 for t0, t1 in spans)]
        assert inside == [], f"rank {r}: {len(inside)} collections inside minibatches"
        assert sum(any(t0 <= t <= t1 for t0, t1 in gaps) for t in starts) >= len(gaps), \
            "one collection after every minibatch"
