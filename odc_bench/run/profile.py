"""One minibatch under torch.profiler (`profile_minibatch=K`): where a rank's time goes, host and
device, written beside the run's results as a table and a Chrome trace.

The profiler's own cost would land in the metrics, so only a warm-up minibatch may be profiled
(RunConfig refuses others). The table is read from the Chrome trace the profiler writes: on a
GPU, torch's own table (key_averages) of one 1.5B minibatch took longer than a minute of Python
over its events (make gpu-check on an H200, 2026-11-27), where pandas over the trace takes
seconds. It says how much of the profiled span the device was busy and lists the kernels by
device time (on CUDA), and the operators by self host time.
"""

from __future__ import annotations

import gzip
import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.profiler import ProfilerActivity, profile

from odc_bench.files import atomic_path, atomic_write_text

if TYPE_CHECKING:  # pandas is imported by the table alone: every rank imports this module
    import pandas as pd

ROWS = 40  # the table's operators: the heaviest, enough to name where a minibatch goes


def folder(results_dir: str, run_id: str) -> Path:
    """Where a run's profiles go: one file pair per rank."""
    return Path(results_dir) / "profiles" / run_id


def prepare(device: torch.device) -> None:
    """What profiling allocates once and keeps for the life of the process, done before a rank
    takes its memory baseline, so that its peak counts none of it: the profiler's first start
    and stop, and pandas, which the table imports (their sizes: docs/configuration.md)."""
    import pandas  # noqa: F401

    start(device).stop()


def start(device: torch.device) -> profile:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    profiler = profile(activities=activities, record_shapes=True)
    profiler.start()
    return profiler


def save(profiler: profile, device: torch.device, out: Path, rank: int, header: str) -> None:
    """Stop the profiler; write rank<r>.trace.json.gz (chrome://tracing or Perfetto) and
    rank<r>.txt (`header`, then operator_table of the trace)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    profiler.stop()
    with tempfile.TemporaryDirectory() as scratch:
        raw = Path(scratch) / "trace.json"
        profiler.export_chrome_trace(str(raw))
        table = operator_table(json.loads(raw.read_text())["traceEvents"])
        with atomic_path(out / f"rank{rank}.trace.json.gz") as tmp, raw.open("rb") as src, \
                gzip.GzipFile(tmp, "wb", compresslevel=6, mtime=0) as dst:
            shutil.copyfileobj(src, dst)
    atomic_write_text(out / f"rank{rank}.txt", f"{header}\n\n{table}\n")


def self_times(ops: pd.DataFrame) -> pd.Series:
    """Each operator's duration less that of the operators nested directly in it on its thread:
    its self time (ts and dur in microseconds, as the trace holds them)."""
    own = ops["dur"].astype(float).copy()
    for _, thread in ops.sort_values(["ts", "dur"], ascending=[True, False]).groupby(["pid", "tid"], sort=False):
        open_: list[tuple[float, object]] = []  # (end, index) of the operators enclosing the current one
        for index, ts, dur in zip(thread.index, thread["ts"], thread["dur"], strict=True):
            while open_ and open_[-1][0] <= ts:
                open_.pop()
            if open_:
                own[open_[-1][1]] -= dur
            open_.append((ts + dur, index))
    return own.clip(lower=0.0)


def busy_time(starts: pd.Series, durations: pd.Series) -> float:
    """The length of the union of the intervals [start, start + duration): time in which at least
    one of them ran, overlaps counted once."""
    busy, reach = 0.0, float("-inf")
    for start, end in sorted(zip(starts.astype(float), (starts + durations).astype(float), strict=True)):
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return busy


def operator_table(events: list[dict], rows: int = ROWS) -> str:
    """Where the trace has device work, first how much of the profiled span the device was busy
    (a minibatch bound by its host leaves it idle most of the time), then the heaviest kernels by
    device time; the heaviest operators by self host time; with their calls and share, as text."""
    import pandas as pd

    frame = pd.DataFrame([e for e in events if e.get("ph") == "X" and "dur" in e],
                         columns=["name", "cat", "ts", "dur", "pid", "tid"])
    sections = []
    kernels = frame[frame["cat"].isin(["kernel", "gpu_memcpy", "gpu_memset"])]
    text = []
    if len(kernels):
        span = float((frame["ts"] + frame["dur"]).max() - frame["ts"].min())
        busy = busy_time(kernels["ts"], kernels["dur"])
        text.append(f"Span {span / 1e3:.3f} ms, first event to last: the device busy {busy / 1e3:.3f} ms of it "
                    f"({busy / (span or 1.0):.1%}; kernels and copies that overlap counted once)")
        sections.append(("Device time by kernel", kernels.assign(time=kernels["dur"].astype(float))))
    ops = frame[frame["cat"] == "cpu_op"]
    sections.append(("Self CPU time by operator", ops.assign(time=self_times(ops))))
    for title, part in sections:
        total = float(part["time"].sum()) or 1.0
        table = (part.groupby("name")["time"].agg(["count", "sum"]).sort_values("sum", ascending=False).head(rows))
        lines = [f"{title} (total {total / 1e3:.3f} ms)", f"{'ms':>10} {'share':>6} {'calls':>7}  name"]
        lines += [f"{t / 1e3:10.3f} {t / total:6.1%} {n:7d}  {name}" for name, n, t in
                  zip(table.index, table["count"], table["sum"], strict=True)]
        text.append("\n".join(lines))
    return "\n\n".join(text)
