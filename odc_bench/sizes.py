"""A size in bytes as the primitives' table, figure 11 and the messages about free space label it,
and the memory this host has available."""

from __future__ import annotations


def size_label(n: float) -> str:
    """The largest binary unit the size reaches, to 4 significant digits: 64 B, 1000 B, 2.93 KiB,
    256 MiB. Never rounded to a unit it has not reached: distinct sizes below 1 KiB would
    otherwise all read as 0 KiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.4g} B"


def host_available_bytes() -> int:
    """This host's available memory (the kernel's MemAvailable), which local ranks share."""
    with open("/proc/meminfo", encoding="utf-8") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) * 1024
