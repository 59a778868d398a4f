"""The collective engine against a single-process reference, through the real worker and launcher."""

from functools import partial

import pandas as pd
import pytest

from odc_bench.app import Job
from odc_bench.plan.spec import Planner, resolve
from odc_bench.record.schema import COLUMNS
from odc_bench.run import local
from odc_bench.run.local import run_local
from odc_bench.run.worker import RankJob, rank_entry
from tests.helpers import compose_config, odc_bench, run_config
from tests.helpers.reference import relative_error, train_single_process

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_two_rank_fsdp2_steps_equal_a_single_process_step(backend):
    """FSDP2 on the shared-memory process group (the CPU default) and on gloo."""
    spec = resolve(run_config("num_minibatches=2", "warmup_minibatches=0", "world_size=2",
                                  "minibatch_size=2", "optim.weight_decay=0.1", f"engine.backend={backend}"))
    results = local.run_local(spec, collect_params=True)
    expected, _ = train_single_process(spec)
    assert relative_error(results[0]["params"], expected) < 1e-5


def test_default_job_writes_a_row_and_trace_and_resumes(results_dir, monkeypatch, capsys):
    monkeypatch.chdir(results_dir.parent)
    assert odc_bench(f"results_dir={results_dir}", "num_minibatches=3", "warmup_minibatches=1") == 0
    first = capsys.readouterr().out
    table = pd.read_csv(results_dir / "runs.csv")
    assert list(table.columns) == COLUMNS and len(table) == 1
    row = table.iloc[0]
    assert row["status"] == "ok" and row["engine"] == "collective" and row["world_size"] == 2
    assert row["samples_per_s"] > 0 and 0 <= row["bubble_rate"] < 1 and row["peak_mem_mb"] > 0
    trace = pd.read_csv(results_dir / row["trace"])
    assert set(trace["rank"]) == {0, 1}
    assert {"fwd", "bwd", "microbatch", "sync", "optimizer", "minibatch"} <= set(trace["kind"])
    assert "samples_per_s" in first
    assert odc_bench(f"results_dir={results_dir}", "num_minibatches=3", "warmup_minibatches=1") == 0
    assert "skipped" in capsys.readouterr().out
    assert len(pd.read_csv(results_dir / "runs.csv")) == 1


def failing_rank_entry(rank: int, job: RankJob) -> None:
    """rank_entry, except that rank 1 raises before it trains (the ranks import it by name)."""
    if rank == 1:
        raise RuntimeError("rank 1 cannot go on")
    rank_entry(rank, job)


def test_a_failing_rank_is_recorded_as_a_failed_run(results_dir, monkeypatch):
    # jobs.train imports the launcher when a run starts: the module's name is the one to replace.
    monkeypatch.setattr(local, "run_local", partial(run_local, entry=failing_rank_entry))
    cfg = compose_config(f"results_dir={results_dir}", "num_minibatches=2", "warmup_minibatches=0")
    with pytest.raises(SystemExit) as exit_info:
        Job(Planner())(cfg)
    assert exit_info.value.code == 1
    row = pd.read_csv(results_dir / "runs.csv").iloc[0]
    assert row["status"] == "failed" and row["error"] == "rank 1 failed: RuntimeError: rank 1 cannot go on"
