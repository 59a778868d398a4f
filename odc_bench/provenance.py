"""Where a result came from: the commit it was produced at (rows, calibrations, benchmarks), and
the machine it was measured on."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


# A copy of the tree without .git (what a lent GPU machine gets) names its commit here; the
# command that sends it fills it in (odc_bench/tools/gpu_check.py: device_command).
COMMIT_ENV = "ODC_BENCH_COMMIT"


def git_commit() -> str:
    """$ODC_BENCH_COMMIT where set (a copy of the tree sent to a GPU machine may carry a .git of
    another commit), else the short commit of the checkout, else "unknown"."""
    named = os.environ.get(COMMIT_ENV, "").strip()
    if named:
        return named
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=5)
        commit = out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return commit or "unknown"


def host_fingerprint() -> dict[str, object]:
    """What makes CPU timings of one machine apply to another: the processor model and how many
    logical cores there are (the hostname does not: VMs of one name differ, and one machine may be
    renamed)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return {"cpu_model": model, "logical_cores": os.cpu_count() or 0}
