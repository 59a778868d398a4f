"""The progress display: what it shows on a terminal, its time estimate, silence elsewhere."""

import io
import pickle
import re

import pytest
from hydra.core.utils import JobReturn, JobStatus
from rich.console import Console

from odc_bench.cli.outcomes import outcome_of, print_summary, run_counts
from odc_bench.cli.progress import ProgressCallback
from odc_bench.cli.slurm import describe
from odc_bench.jobs import progress
from odc_bench.jobs.train import execute, kept_checkpoints
from odc_bench.plan.identity import checkpoint_folder
from odc_bench.plan.spec import resolve
from odc_bench.run.local import run_local
from tests.helpers import compose_config, run_config


def _terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=160), out


def _shown(out: io.StringIO) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_terminal_shows_runs_done_current_run_and_its_minibatches():
    console, out = _terminal()
    bar = progress.start(3, console)
    try:
        bar.run_finished("skipped")
        bar.run_started("minibatch_size=2")
        bar.run_minibatches(2, 4)
        bar._progress.refresh()
    finally:
        progress.stop()
    shown = _shown(out)
    assert "runs" in shown and "1/3" in shown and "1 skipped" in shown
    assert "minibatch_size=2" in shown and "2/4" in shown


def test_remaining_time_counts_only_runs_that_executed(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    bar = progress.SweepProgress(4, Console(file=io.StringIO()))
    bar.run_started("a")
    bar.run_finished("skipped")
    assert bar.remaining_s() is None, "no executed run yet: no estimate"
    bar.run_started("b")
    clock.t += 10
    bar.run_finished("ok")
    assert bar.remaining_s() == pytest.approx(20.0), "two runs left at 10 s each; the skip took no time"
    bar.run_started("c")
    clock.t += 4
    assert bar.remaining_s() == pytest.approx(16.0), "minus the running one's elapsed time"


def test_remaining_time_of_parallel_runs_follows_the_sweep_pace(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    bar = progress.SweepProgress(5, Console(file=io.StringIO()))
    bar.run_finished("skipped")
    clock.t += 30
    bar.run_finished("ok")  # SLURM jobs end without run_started: the launcher only sees them finish
    bar.run_finished("failed")
    assert bar.remaining_s() == pytest.approx(2 * 30 / 2), "15 s per executed run, two runs left"


def test_without_a_terminal_each_minibatch_is_one_plain_line_on_stdout_and_no_bar(capsys):
    out = io.StringIO()
    bar = progress.start(2, Console(file=out))
    bar.run_started("engine=odc")
    for done in (0, 1, 1, 3):  # the launcher polls: a minibatch may finish between two polls, or none
        bar.run_minibatches(done, 3)
    bar.run_started("resumed")
    bar.run_minibatches(2, 3)  # a run resumed after minibatch 2: one line, not one per minibatch done before
    progress.say("run abc: resumed from minibatch 1 of 3, checkpoint step-1 (x)")
    bar.run_finished("ok")
    progress.stop()
    assert out.getvalue() == "", "no bar, no control characters"
    lines = capsys.readouterr().out.splitlines()
    assert [ln.rsplit(",", 1)[0] for ln in lines[:4]] == [*(f"engine=odc: minibatch {k}/3" for k in (1, 2, 3)),
                                                          "resumed: minibatch 2/3"]
    assert lines[4] == "run abc: resumed from minibatch 1 of 3, checkpoint step-1 (x)"


def test_on_a_terminal_a_line_to_say_prints_above_the_bar(capsys):
    console, out = _terminal()
    bar = progress.start(1, console)
    try:
        bar.run_started("x")
        bar.run_minibatches(1, 3)
        progress.say("run abc: resumed from minibatch 1 of 3, checkpoint step-1 (x)")
    finally:
        progress.stop()
    assert "resumed from minibatch 1 of 3" in _shown(out) and capsys.readouterr().out == ""


def test_hydra_callback_knows_the_sweep_size_and_counts_outcomes():
    cfg = compose_config("sweep=smoke", hydra=True)
    cfg.hydra.overrides.task.append("minibatch_size=1,2")  # as `python -m odc_bench sweep=smoke minibatch_size=1,2`
    callback = ProgressCallback()
    callback.on_multirun_start(cfg)
    try:
        bar = progress.current()
        assert bar is not None and bar.total == 2, "the command line narrowed the smoke sweep to two runs"
        assert callback.varying == {"minibatch_size"}
        for value in ({"status": "ok"}, None):
            job = JobReturn(status=JobStatus.COMPLETED)
            job.return_value = value
            callback.on_job_start(cfg)
            callback.on_job_end(cfg, job)
        assert bar.finished == {"ok": 1, "failed": 0, "skipped": 1}
    finally:
        callback.on_multirun_end(cfg)
    assert progress.current() is None


@pytest.mark.slow
def test_local_run_reports_its_minibatches():
    spec = resolve(run_config("num_minibatches=3", "warmup_minibatches=1", "minibatch_size=1",
                                  "dataset.length_scale=0.00390625"))
    console, _ = _terminal()
    bar = progress.start(1, console)
    try:
        bar.run_started("tiny")
        run_local(spec, on_progress=bar.run_minibatches)
        done = bar._progress.tasks[1]
        assert (done.completed, done.total) == (3, 3), "rank 0's minibatch counter, read from the store"
    finally:
        progress.stop()


def test_a_benchmark_job_returning_several_rows_counts_as_one_outcome_and_one_run(capsys):
    done = JobReturn(status=JobStatus.COMPLETED, _return_value=[{"op": "gather"}, {"op": "memcpy"}])
    assert outcome_of(done) == "ok"
    failed = JobReturn(status=JobStatus.COMPLETED, _return_value={"status": "failed"})
    assert outcome_of(failed) == "failed"
    # It counted as one run per measurement: "sweep of 1 config, 15 runs with their repeats: 15 ok".
    assert run_counts([done, done]) == {"ok": 2, "failed": 0}
    print_summary([done, done], [])
    assert capsys.readouterr().out == "odc_bench: sweep of 2 runs: 2 ok, 0 failed\n"
    assert describe(done) == "ok: 2 measurements in primitives.csv"


def _steps(folder, *steps: int) -> None:
    """Checkpoint folders as latest() finds them: DCP's metadata, here of an empty state."""
    from torch.distributed.checkpoint.metadata import Metadata

    for step in steps:
        (folder / f"step-{step}").mkdir(parents=True)
        (folder / f"step-{step}" / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata={})))


def test_a_run_says_it_resumes_and_ctrl_c_says_which_checkpoints_stayed(tmp_path, capsys):
    spec = resolve(run_config("engine=odc", "num_minibatches=6", "checkpoint.every=2", f"results_dir={tmp_path}"))
    folder = checkpoint_folder(spec.config, spec.run_id)
    _steps(folder, 2, 4)
    (folder / "step-6.partial").mkdir()  # a save the stop cut short: not a checkpoint

    def stopped(_spec):  # the launcher meets Ctrl-C while the ranks run
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as stop:
        execute(spec, tmp_path, launch=stopped)
    said = capsys.readouterr().out
    assert f"run {spec.run_id}: resumed from minibatch 4 of 6, checkpoint step-4 ({folder})" in said
    assert str(stop.value) == (f"the run under way was stopped and wrote no row; its checkpoints step-2, step-4 stay "
                               f"in {folder}: the same command resumes it from minibatch 4")
    assert not (tmp_path / "runs.csv").exists()
    never = resolve(run_config("engine=odc", "num_minibatches=6", "checkpoint.resume=never", f"results_dir={tmp_path}"))
    with pytest.raises(KeyboardInterrupt) as again:
        execute(never, tmp_path, launch=stopped)
    assert "resumed" not in capsys.readouterr().out, "checkpoint.resume=never: no resume to tell"
    assert str(again.value).endswith(f"stay in {folder}: checkpoint.resume=never: the same command starts again "
                                     f"from minibatch 0")
    assert kept_checkpoints(tmp_path / "none") == "", "no checkpoint: cli.interrupted's own line"


@pytest.mark.slow
def test_a_run_prints_on_an_ascii_terminal(tmp_path):
    """A job label cut with an ellipsis ended a run printing to a latin-1 or ASCII terminal (LANG=en_US
    on older systems) in a UnicodeEncodeError."""
    import os
    import subprocess
    import sys

    from tests.helpers import REPO

    argv = ["engine=odc", "model.num_layers=2", "minibatch_size=2", "num_minibatches=3", "warmup_minibatches=0",
            "dataset.length_scale=0.005", "threads_per_rank=1", f"results_dir={tmp_path / 'r'}"]
    proc = subprocess.run([sys.executable, "-m", "odc_bench", *argv], cwd=tmp_path, capture_output=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO), PYTHONIOENCODING="ascii"), timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-800:]
    assert proc.stdout.isascii() and b"...: minibatch " in proc.stdout
