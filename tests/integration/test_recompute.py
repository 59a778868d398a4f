"""Real runs with activation checkpointing (backend.recompute): both engines train as without
it, on less memory, and their traces time the same units."""

from collections import Counter

import pandas as pd
import pytest

from odc_bench.jobs.train import execute
from odc_bench.plan.spec import resolve
from tests.helpers import run_config

pytestmark = pytest.mark.slow

BASE = ("num_minibatches=2", "warmup_minibatches=0", "minibatch_size=2")


def _run(tmp, *overrides):
    spec = resolve(run_config(*BASE, *overrides, f"results_dir={tmp}"))
    row = execute(spec, tmp)
    assert row["status"] == "ok", row["error"]
    events = pd.read_csv(tmp / row["trace"])
    spans = Counter(map(tuple, events.loc[events["kind"].isin(["fwd", "bwd"]),
                                          ["rank", "minibatch", "microbatch", "unit", "kind"]].values))
    return row, spans


def test_both_engines_train_as_without_checkpointing_on_less_memory(tmp_path):
    plain, plain_spans = _run(tmp_path, "engine=odc")
    for engine, mode in (("odc", "full"), ("collective", "op")):
        row, spans = _run(tmp_path, f"engine={engine}", "backend.recompute=true", f"backend.recompute_mode={mode}")
        assert row["run_id"] != plain["run_id"]
        assert row["loss_first"] == pytest.approx(plain["loss_first"], rel=1e-6)
        assert row["loss_last"] == pytest.approx(plain["loss_last"], rel=1e-6)
        assert row["loss_last"] != pytest.approx(row["loss_first"], rel=1e-4), "the runs trained"
        assert row["peak_mem_mb"] < 0.8 * plain["peak_mem_mb"], (engine, mode)
        assert row["mem_estimate_mb"] <= plain["mem_estimate_mb"]
        assert spans == plain_spans and set(spans.values()) == {1}, "one forward and one backward span per unit"
