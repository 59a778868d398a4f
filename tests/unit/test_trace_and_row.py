"""A run's trace and the row that names it are written together (jobs/train.py): no trace is
left that no row names, and a Ctrl-C while they are written waits for both."""

from __future__ import annotations

import signal

import pytest

from odc_bench.jobs import train
from odc_bench.jobs.train import execute
from odc_bench.plan.spec import resolve
from odc_bench.results.table import read_table
from tests.helpers import run_config


def _simulated():
    return resolve(run_config("backend=sim"))


def test_a_row_that_cannot_be_written_takes_its_trace_with_it(tmp_path, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(train, "append_row", disk_full)
    with pytest.raises(OSError, match="No space left"):
        execute(_simulated(), tmp_path)
    assert not list(tmp_path.rglob("*.csv.gz")), "no trace without its row"


def test_ctrl_c_while_the_trace_is_written_lands_once_its_row_is_written(tmp_path, monkeypatch):
    write_trace = train.write_trace

    def ctrl_c_after_the_trace(path, events):
        write_trace(path, events)
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(train, "write_trace", ctrl_c_after_the_trace)
    with pytest.raises(KeyboardInterrupt):
        execute(_simulated(), tmp_path)
    rows = read_table(tmp_path / "runs.csv")
    assert len(rows) == 1 and (tmp_path / rows["trace"][0]).is_file()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize(("last", "status", "noted"), [
    (float("nan"), "ok", True), (float("inf"), "ok", True), (3.2, "ok", False), (None, "ok", False),
    (float("nan"), "failed", False)], ids=["nan", "inf", "finite", "simulated", "failed"])
def test_a_run_whose_loss_ended_nan_or_infinite_is_noted(last, status, noted):
    """optim.lr=1e9 ended the tiny model's loss as nan, and the run printed and kept an ok row
    without a word: a convergence study reading the table took it among the others."""
    from odc_bench.record.row import diverged

    note = diverged({"run_id": "r1", "status": status, "loss_first": 7.6459, "loss_last": last})
    assert (note is not None) == noted
    assert note is None or note.startswith(f"run r1's training loss is {last} at its last minibatch (7.646 at its "
                                           f"first): the model diverged (a lower optim.lr trains it)")
