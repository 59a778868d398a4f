"""`python -m odc_bench.results collect`: one tidy table from many results folders."""

import subprocess
import sys

import pandas as pd
import pytest

from odc_bench.results.__main__ import main
from odc_bench.results.collect import collect
from odc_bench.results.table import append_row
from tests.helpers import REPO


def _row(run_id, status, timestamp, **extra):
    return dict(run_id=run_id, status=status, timestamp=timestamp, trace=f"traces/{run_id}.csv", **extra)


def _tables(tmp_path):
    local, cluster = tmp_path / "local", tmp_path / "slurm" / "sweep1"
    append_row(local / "runs.csv", _row("a", "failed", "2026-01-01T10:00:00", error="rank 1 died"))
    append_row(local / "runs.csv", _row("a", "ok", "2026-01-01T11:00:00", samples_per_s=1.0))
    append_row(cluster / "runs.csv", _row("a", "ok", "2026-01-02T09:00:00", samples_per_s=2.0))
    append_row(cluster / "runs.csv", _row("b", "ok", "2026-01-01T12:00:00", samples_per_s=3.0))
    return local, cluster


def test_collect_keeps_every_run_of_every_config_as_a_repeat(tmp_path):
    local, cluster = _tables(tmp_path)
    out = tmp_path / "merged" / "all.csv"
    rows = collect([tmp_path], out)
    a = rows[rows["run_id"] == "a"]
    assert list(a["status"]) == ["failed", "ok", "ok"], "a failure and two repeats, oldest first"
    assert list(a["samples_per_s"].dropna()) == [1.0, 2.0]
    assert list(a["attempt"]) == [0, 1, 2], "attempts count the run's rows across every table"
    assert list(rows.loc[rows["run_id"] == "a", "trace"])[2] == "../slurm/sweep1/traces/a.csv", \
        "trace paths follow the merged table"
    on_disk = pd.read_csv(out)
    assert len(on_disk) == 4
    pd.testing.assert_frame_equal(pd.read_parquet(out.with_suffix(".parquet")), on_disk, check_dtype=False)


def test_collect_does_not_depend_on_the_order_of_its_arguments(tmp_path):
    local, cluster = _tables(tmp_path)
    one = collect([local, cluster], tmp_path / "one.csv")
    other = collect([cluster, local, local], tmp_path / "other.csv")
    pd.testing.assert_frame_equal(one, other)


def test_what_collect_writes_is_a_results_table_every_command_reads(tmp_path, capsys):
    _tables(tmp_path)
    out = tmp_path / "all.csv"
    collect([tmp_path], out)
    assert main(["collect", str(out), "--out", str(tmp_path / "again.csv")]) == 0
    assert len(pd.read_csv(tmp_path / "again.csv")) == 4


def test_a_row_another_table_holds_too_is_one_measurement_and_said(tmp_path, capsys):
    import shutil

    local, cluster = _tables(tmp_path)
    # A simulated run's repeats within one second: equal rows of one table, each a repeat.
    for _ in range(2):
        append_row(local / "runs.csv", _row("s", "ok", "2026-01-01T13:00:00", samples_per_s=5.0))
    shutil.copytree(local, tmp_path / "backup")  # a copy of a folder beside it
    notes: list[str] = []
    rows = collect([tmp_path], tmp_path / "merged" / "all.csv", notes)
    assert len(rows) == 6, "the copy's rows counted once, each repeat kept"
    assert list(rows["run_id"]).count("s") == 2
    assert len(notes) == 1 and notes[0].startswith("4 row(s) of ") and "(a copy): each counted once" in notes[0]
    # A collected table beside the folders it came from: its attempts are renumbered, its rows the same.
    assert main(["compare", str(tmp_path), str(tmp_path / "merged" / "all.csv")]) == 0
    assert "are also in another table" in capsys.readouterr().err
    again = collect([tmp_path / "merged" / "all.csv", local, cluster], tmp_path / "again.csv")
    assert len(again) == 6


@pytest.mark.slow
def test_collect_cli_writes_the_table(tmp_path):
    append_row(tmp_path / "r" / "runs.csv", _row("a", "ok", "2026-01-01T10:00:00"))
    out = tmp_path / "all.csv"
    ok = subprocess.run([sys.executable, "-m", "odc_bench.results", "collect", str(tmp_path / "r"), "--out", str(out)],
                        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "1 runs (1 ok)" in ok.stdout and pd.read_csv(out)["run_id"].tolist() == ["a"]


@pytest.mark.parametrize("command", ["collect", "compare", "pairs"])
def test_missing_empty_or_malformed_inputs_are_refused_in_one_line(tmp_path, capsys, command):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "runs.csv").write_text('a,b\n"unterminated\n')
    (tmp_path / "other.csv").write_text("x,y\n1,2\n")
    for bad in (tmp_path / "missing", tmp_path / "empty", tmp_path / "bad", tmp_path / "other.csv"):
        extra = ["--out", str(tmp_path / "all.csv")] if command == "collect" else []
        assert main([command, str(bad), *extra]) == 2, bad
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("python -m odc_bench.results: error: "), lines
    assert not (tmp_path / "all.csv").exists()


def test_an_out_path_naming_the_parquet_is_refused_in_one_line(tmp_path, capsys):
    """The CSV and the .parquet beside it would be one file: CSV text under the .parquet name."""
    _tables(tmp_path)
    assert main(["collect", str(tmp_path), "--out", str(tmp_path / "all.parquet")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "give the CSV's path" in lines[0], lines
    assert not (tmp_path / "all.parquet").exists()


def test_a_ctrl_c_while_collect_writes_keeps_the_earlier_pair(tmp_path, monkeypatch):
    """The CSV and the .parquet come from one collect: interrupted while the .parquet is written,
    both stay as the earlier collect left them."""
    local, cluster = _tables(tmp_path)
    out = tmp_path / "all.csv"
    collect([local], out)
    before = out.read_bytes(), out.with_suffix(".parquet").read_bytes()

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, "to_parquet", interrupted)
    with pytest.raises(KeyboardInterrupt):
        collect([local, cluster], out)
    assert (out.read_bytes(), out.with_suffix(".parquet").read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.csv", "all.parquet", "local", "slurm"]
