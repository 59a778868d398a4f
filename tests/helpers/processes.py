"""The processes below a process, read from /proc: what a test checks is gone once a run ends."""

from __future__ import annotations

from pathlib import Path

from odc_core.transport.shm import process_start_time


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (its children, theirs, ...); a process that ends while it is
    read is left out."""
    children: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            children += [int(c) for c in (task / "children").read_text(encoding="ascii").split()]
    except FileNotFoundError:
        return []
    return children + [d for c in children for d in descendants(c)]


def alive(pids: list[int]) -> list[int]:
    """The processes of `pids` still running (a zombie, dead but not yet waited for, is not)."""
    return [pid for pid in pids if process_start_time(pid) is not None]
