"""One minibatch under torch.profiler (`profile_minibatch=K`): where a rank's time goes, host and
device, written beside the run's results as a table and a Chrome trace.

The profiler's own cost would land in the metrics, so only a warm-up minibatch may be profiled
(RunConfig refuses others); on CUDA the table is sorted by device time, elsewhere by CPU time.
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from odc_bench.files import atomic_path, atomic_write_text

ROWS = 40  # the table's operators: the heaviest, enough to name where a minibatch goes


def folder(results_dir: str, run_id: str) -> Path:
    """Where a run's profiles go: one file pair per rank."""
    return Path(results_dir) / "profiles" / run_id


def start(device: torch.device) -> profile:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    profiler = profile(activities=activities, record_shapes=True)
    profiler.start()
    return profiler


def save(profiler: profile, device: torch.device, out: Path, rank: int, header: str) -> None:
    """Stop the profiler; write rank<r>.txt (operators by self time, `header` first) and
    rank<r>.trace.json.gz (chrome://tracing or Perfetto)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    profiler.stop()
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = profiler.key_averages().table(sort_by=sort, row_limit=ROWS)
    atomic_write_text(out / f"rank{rank}.txt", f"{header}\n\n{table}\n")
    with tempfile.TemporaryDirectory() as scratch:
        raw = Path(scratch) / "trace.json"
        profiler.export_chrome_trace(str(raw))
        with atomic_path(out / f"rank{rank}.trace.json.gz") as tmp, raw.open("rb") as src, \
                gzip.GzipFile(tmp, "wb", compresslevel=6, mtime=0) as dst:
            shutil.copyfileobj(src, dst)
