"""A size in bytes as the primitives' table, figure 11 and the messages about free space label it,
and the memory this host has available."""

from __future__ import annotations

import os
from pathlib import Path


def size_label(n: float) -> str:
    """The largest binary unit the size reaches, to 4 significant digits: 64 B, 1000 B, 2.93 KiB,
    256 MiB. Never rounded to a unit it has not reached: distinct sizes below 1 KiB would
    otherwise all read as 0 KiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.4g} B"


MEMINFO = Path("/proc/meminfo")


def host_available_bytes() -> int:
    """This host's available memory (Linux's MemAvailable), which local ranks share; where there is
    none (macOS, where the what-if and the simulator run too), its physical memory."""
    try:
        with MEMINFO.open(encoding="utf-8") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) * 1024
    except (OSError, StopIteration):
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
