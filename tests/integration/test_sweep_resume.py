"""A sweep killed midway loses no completed row; re-running it runs only the missing runs."""

import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from odc_bench.files import claimed
from odc_bench.results.table import read_table
from tests.helpers import REPO, odc_bench, run_spec


def _rows(results_dir) -> pd.DataFrame:
    return read_table(results_dir / "runs.csv")


def _temporaries(results_dir) -> list:
    return [p for p in results_dir.rglob("*.tmp")]


@pytest.mark.slow
def test_killed_sweep_resumes_without_losing_or_repeating_a_run(tmp_path, monkeypatch, capsys):
    results_dir, sweep_dir = tmp_path / "results", tmp_path / "multirun"
    args = ["sweep=smoke", f"results_dir={results_dir}", f"hydra.sweep.dir={sweep_dir}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # Its own process group, like a sweep started from a shell: the kill takes Hydra, the
    # forkserver and every rank at once, in the middle of the second run.
    proc = subprocess.Popen([sys.executable, "-m", "odc_bench", *args], cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    try:
        while not (results_dir / "runs.csv").exists():
            assert proc.poll() is None, f"the sweep ended before its first row: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "no row after 240 s"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = _rows(results_dir)
    assert 1 <= len(before) < 3, "the kill must land after the first row and before the last"
    assert (before["status"] == "ok").all()
    assert not _temporaries(results_dir)

    monkeypatch.chdir(tmp_path)
    status = odc_bench(*args)
    rerun, err = capsys.readouterr()
    assert status == 0, err
    after = _rows(results_dir)
    assert len(after) == 3 and after["run_id"].is_unique, "every run exactly once"
    assert (after["status"] == "ok").all()
    kept = after.set_index("run_id").loc[before["run_id"]]
    assert list(kept["timestamp"]) == list(before["timestamp"]), "completed rows are kept, not redone"
    for run_id in before["run_id"]:
        assert f"run {run_id} already in" in rerun, "a completed run is skipped"
    assert rerun.count("already in") == len(before), "only the completed runs are skipped"
    for trace in after["trace"]:
        assert pd.read_csv(results_dir / trace).shape[0] > 0
    assert not _temporaries(results_dir)
    assert not list(results_dir.glob(".*.running")), "the killed sweep's claim was taken over, then let go"


def test_a_run_under_way_in_another_command_is_skipped_not_run_twice(tmp_path, monkeypatch, capsys):
    """The same command started twice on one results folder ran the run twice at once: the two
    wrote into the same checkpoint folder (the second failed in DCP's FileNotFoundError) and
    both appended an ok row."""
    results_dir = tmp_path / "results"
    args = ["backend=sim", f"results_dir={results_dir}"]
    run_id = run_spec(*args).run_id
    monkeypatch.chdir(tmp_path)
    with claimed(results_dir / f".{run_id}.running", "pid 1 on elsewhere, since 10:00:00") as elsewhere:
        assert elsewhere is None
        assert odc_bench(*args) == 0
        said = capsys.readouterr().out
        assert (f"odc_bench: run {run_id} is under way in another command (pid 1 on elsewhere, since 10:00:00) on "
                f"{results_dir}; skipped") in said
        assert not (results_dir / "runs.csv").exists()
    assert odc_bench(*args) == 0
    assert len(_rows(results_dir)) == 1 and not list(results_dir.glob(".*.running"))
