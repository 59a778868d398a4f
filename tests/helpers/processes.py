"""The processes below a process, read from /proc: what a test checks is gone once a run ends."""

from __future__ import annotations

from pathlib import Path


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
    """The processes of `pids` that still run (a zombie, dead but not yet waited for, does not)."""
    running = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state != "Z":
            running.append(pid)
    return running
