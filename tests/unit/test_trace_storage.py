"""Traces stored gzipped (schema 7): written so, read by the same loaders, and the traces of a
schema-6 table compressed by the migration without a byte of their content changing."""

import gzip
import io

import numpy as np
import pandas as pd

from odc_bench.record.schema import COLUMNS, SCHEMA_VERSION
from odc_bench.results.migrate import migrate_table
from odc_bench.results.table import TRACE_SUFFIX, read_table, write_trace
from paper_figures.inputs import read_trace

EVENTS = pd.DataFrame({"rank": [0, 1], "minibatch": [0, 0], "microbatch": [0, 0], "kind": ["fwd", "bwd"],
                       "unit": ["layer0", "layer0"], "t0": [27363.217737563, 27363.2198], "t1": [27363.2188, 27363.22]})


def test_a_trace_is_written_gzipped_the_same_bytes_each_time_and_read_back_as_written(tmp_path):
    path = tmp_path / "traces" / f"r{TRACE_SUFFIX}"
    write_trace(path, EVENTS)
    first = path.read_bytes()
    pd.testing.assert_frame_equal(pd.read_csv(io.BytesIO(gzip.decompress(first))), EVENTS)
    write_trace(path, EVENTS)
    assert path.read_bytes() == first, "no time stamp or temporary name in the file: a re-run is no change"
    row = pd.Series({"run_id": "r", "trace": f"traces/r{TRACE_SUFFIX}", "table_dir": str(tmp_path)})
    pd.testing.assert_frame_equal(read_trace(row), EVENTS)  # the figures' loader, unchanged


def test_a_trace_reads_back_as_pandas_own_csv_of_it_would_whatever_its_columns_hold(tmp_path):
    """Empty cells, whole floats, text that needs quotes, and a column of Python objects of
    several types (which Arrow, typing each column, takes only as text)."""
    events = EVENTS.assign(tokens=[512.0, np.nan], loss_sum=[np.nan, 1e-300], note=['a "b", c', None],
                           mixed=pd.Series(["layer0", 3], dtype=object))
    path = tmp_path / f"r{TRACE_SUFFIX}"
    write_trace(path, events)
    pd.testing.assert_frame_equal(pd.read_csv(path), pd.read_csv(io.StringIO(events.to_csv(index=False))))
    write_trace(path, events.iloc[:0])
    assert list(pd.read_csv(path).columns) == list(events.columns), "a trace without events keeps its header"


def test_a_schema_6_table_gets_its_traces_compressed_and_named_so(tmp_path):
    (tmp_path / "traces").mkdir()
    text = EVENTS.to_csv(index=False)
    (tmp_path / "traces" / "a.csv").write_text(text)
    (tmp_path / "traces" / "c.csv.gz").write_bytes(gzip.compress(text.encode()))  # compressed already
    rows = [{**{c: "" for c in COLUMNS}, "run_id": run_id, "schema_version": 6, "status": "ok", "trace": trace}
            for run_id, trace in (("a", "traces/a.csv"), ("b", "traces/gone.csv"), ("c", "traces/c.csv"),
                                  ("d", ""))]
    path = tmp_path / "runs.csv"
    pd.DataFrame(rows, columns=COLUMNS).to_csv(path, index=False)
    assert migrate_table(path) == 4
    table = read_table(path)
    assert list(table["trace"].fillna("")) == ["traces/a.csv.gz", "traces/gone.csv", "traces/c.csv.gz", ""]
    assert (table["schema_version"] == SCHEMA_VERSION).all()
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == ["a.csv.gz", "c.csv.gz"]
    assert gzip.decompress((tmp_path / "traces" / "a.csv.gz").read_bytes()).decode() == text
    assert migrate_table(path) == 0
