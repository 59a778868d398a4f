"""`python -m odc_bench.results collect`: one tidy table from many results folders."""

import subprocess
import sys

import pandas as pd

from odc_bench.results.__main__ import main
from odc_bench.results.collect import collect
from odc_bench.results.table import append_row
from tests.helpers import REPO


def _row(run_id, status, timestamp, **extra):
    return dict(run_id=run_id, status=status, timestamp=timestamp, trace=f"traces/{run_id}.csv", **extra)


def test_collect_keeps_the_latest_ok_row_of_each_run(tmp_path):
    local, cluster = tmp_path / "local", tmp_path / "slurm" / "sweep1"
    append_row(local / "runs.csv", _row("a", "failed", "2026-01-01T10:00:00", error="rank 1 died"))
    append_row(local / "runs.csv", _row("a", "ok", "2026-01-01T11:00:00", samples_per_s=1.0))
    append_row(cluster / "runs.csv", _row("a", "ok", "2026-01-02T09:00:00", samples_per_s=2.0))
    append_row(cluster / "runs.csv", _row("a", "failed", "2026-01-03T09:00:00", error="later failure"))
    append_row(cluster / "runs.csv", _row("b", "ok", "2026-01-01T12:00:00", samples_per_s=3.0))
    append_row(local / "runs.csv", _row("c", "failed", "2026-01-01T09:00:00", error="first"))
    append_row(local / "runs.csv", _row("c", "failed", "2026-01-01T13:00:00", error="second"))

    out = tmp_path / "merged" / "all.csv"
    rows = collect([tmp_path], out).set_index("run_id")
    assert sorted(rows.index) == ["a", "b", "c"]
    assert rows.loc["a", "samples_per_s"] == 2.0, "the latest ok row, not a later failure"
    assert rows.loc["b", "status"] == "ok"
    assert (rows.loc["c", "status"], rows.loc["c", "error"]) == ("failed", "second"), "never ok: its latest row"
    assert rows.loc["a", "trace"] == "../slurm/sweep1/traces/a.csv", "trace paths follow the merged table"
    on_disk = pd.read_csv(out)
    assert len(on_disk) == 3
    pd.testing.assert_frame_equal(pd.read_parquet(out.with_suffix(".parquet")), on_disk, check_dtype=False)


def test_collect_cli_writes_the_table(tmp_path):
    append_row(tmp_path / "r" / "runs.csv", _row("a", "ok", "2026-01-01T10:00:00"))
    out = tmp_path / "all.csv"
    ok = subprocess.run([sys.executable, "-m", "odc_bench.results", "collect", str(tmp_path / "r"), "--out", str(out)],
                        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "1 runs (1 ok)" in ok.stdout and pd.read_csv(out)["run_id"].tolist() == ["a"]


def test_collect_refuses_folders_without_results_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for bad in (tmp_path / "missing", tmp_path / "empty"):
        assert main(["collect", str(bad), "--out", str(tmp_path / "all.csv")]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("odc_bench.results: error: "), lines
    assert not (tmp_path / "all.csv").exists()
