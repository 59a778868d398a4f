"""A progress display for sweeps and long runs: runs done of the total, the run in progress and
its minibatches, elapsed and remaining time.

It draws on the terminal: when stderr is not a terminal (a log file, CI, a SLURM job) there is
no bar, and each minibatch a run completes is instead one plain line on stdout (`run label:
minibatch 3/8, 0:00:05`), so a log shows where a run is without a bar's control characters.
`say` prints a line above the bar (or plainly), for what a run has to tell while it goes (that
it resumed from a checkpoint). There is one display
per process (`current()`): Hydra starts and stops it through odc_bench/cli/progress.py's
callback, which the app registers in its config, and the launchers feed it what only they know
(minibatches done inside a local run, SLURM jobs still queued).

The remaining time is the mean duration of the runs that executed times the runs left, minus
the current run's elapsed time: runs a resumed sweep skips take no time and would otherwise
make the estimate far too short. Runs that go in parallel (SLURM) are not timed one by one;
there it is the sweep's pace so far (elapsed time per executed run) times the runs left.
"""

from __future__ import annotations

import atexit
import logging
import sys
import time
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

_current: SweepProgress | None = None


def current() -> SweepProgress | None:
    """The display of this process, if a sweep or run has started one."""
    return _current


def _clock(seconds: float) -> str:
    s = int(max(0.0, seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class _Remaining(ProgressColumn):
    """The sweep's own estimate on the runs line, rich's speed-based one on the minibatch line."""

    def __init__(self, sweep: SweepProgress) -> None:
        super().__init__()
        self.sweep = sweep
        self.per_task = TimeRemainingColumn()

    def render(self, task: Task) -> Text:
        if task.id != self.sweep.runs_task:
            return self.per_task.render(task)
        left = self.sweep.remaining_s()
        return Text("left -:--:--" if left is None else f"left {_clock(left)}", style="progress.remaining")


def _stream_handlers() -> list[logging.StreamHandler]:
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    return [h for lg in loggers for h in lg.handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]


class SweepProgress:
    """Runs done of `total_runs` (None: unknown), the current run and its minibatches, elapsed and remaining time."""

    def __init__(self, total_runs: int | None, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.enabled = self.console.is_terminal
        self.total = total_runs
        self.finished = {"ok": 0, "failed": 0, "skipped": 0}
        self.durations: list[float] = []
        self._run_t0: float | None = None
        self._t_start = time.monotonic()
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), _Remaining(self), TextColumn("{task.fields[note]}"),
                                  console=self.console, disable=not self.enabled)
        # A single run shows its minibatches only.
        self.runs_task: TaskID = self._progress.add_task("runs", total=total_runs, note="", visible=total_runs != 1)
        self._mb_task: TaskID = self._progress.add_task("  minibatches", total=None, visible=False, note="")
        self._moved: list[tuple[logging.StreamHandler, TextIO]] = []
        self._label = ""
        self._shown = 0  # minibatches of the current run a plain line has been printed for

    def start(self) -> None:
        if not self.enabled:
            return
        before = {id(sys.stdout): "out", id(sys.stderr): "err"}
        self._progress.start()
        # Log handlers hold the streams they were made with; point them at rich's redirected
        # streams so log lines print above the display instead of through it.
        after = {"out": sys.stdout, "err": sys.stderr}
        for handler in _stream_handlers():
            which = before.get(id(handler.stream))
            old = handler.setStream(after[which]) if which is not None else None
            if old is not None:
                self._moved.append((handler, old))

    def stop(self) -> None:
        if not self.enabled:
            return
        for handler, stream in self._moved:
            handler.setStream(stream)
        self._moved.clear()
        self._progress.stop()

    def remaining_s(self) -> float | None:
        executed = self.finished["ok"] + self.finished["failed"]
        if not executed or self.total is None:
            return None
        left = self.total - sum(self.finished.values())
        if not self.durations:  # runs in parallel (SLURM), timed by no one: the sweep's pace so far
            return left * (time.monotonic() - self._t_start) / executed
        running = time.monotonic() - self._run_t0 if self._run_t0 is not None else 0.0
        return max(0.0, left * sum(self.durations) / len(self.durations) - running)

    def _describe(self) -> str:
        f = self.finished
        parts = [f"{n} {k}" for k, n in (("failed", f["failed"]), ("skipped", f["skipped"])) if n]
        return ", ".join(parts)

    def set_total(self, total_runs: int) -> None:
        """The sweep's size once it is known exactly (combinations that cannot run left out)."""
        self.total = total_runs
        self._progress.update(self.runs_task, total=total_runs)

    def run_started(self, label: str) -> None:
        self._run_t0 = time.monotonic()
        self._label, self._shown = label, 0
        self._progress.reset(self._mb_task, description=f"  {label}", total=None, visible=False)

    def run_minibatches(self, done: int, total: int) -> None:
        if self.enabled:
            self._progress.update(self._mb_task, completed=done, total=total, visible=True)
            return
        elapsed = _clock(time.monotonic() - self._run_t0) if self._run_t0 is not None else "-"
        if self._shown == 0:  # a resumed run's first count holds the minibatches done before it
            self._shown = max(0, done - 1)
        for k in range(self._shown + 1, done + 1):
            print(f"{self._label or 'run'}: minibatch {k}/{total}, {elapsed}", flush=True)
        self._shown = max(self._shown, done)

    def say(self, text: str) -> None:
        """A line above the display (plainly on stdout without one)."""
        if self.enabled:
            self._progress.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, flush=True)

    def run_finished(self, outcome: str) -> None:
        """outcome: ok, failed, or skipped (already in the results table)."""
        if outcome != "skipped" and self._run_t0 is not None:
            self.durations.append(time.monotonic() - self._run_t0)
        self._run_t0 = None
        self.finished[outcome] += 1
        self._progress.update(self._mb_task, visible=False)
        self._progress.update(self.runs_task, advance=1, note=self._describe())

    def note(self, text: str) -> None:
        """A line of state only the launcher knows (for SLURM: jobs running and queued)."""
        self._progress.update(self.runs_task, note=", ".join(p for p in (self._describe(), text) if p))


def say(text: str) -> None:
    """A line for the user while a run goes: above the display when there is one, else on stdout."""
    display = current()
    if display is not None:
        display.say(text)
    else:
        print(text, flush=True)


def start(total_runs: int | None, console: Console | None = None) -> SweepProgress:
    global _current
    stop()
    _current = SweepProgress(total_runs, console)
    _current.start()
    atexit.register(stop)  # a sweep that ends in an error still gives the terminal its cursor back
    return _current


def stop() -> None:
    global _current
    if _current is not None:
        _current.stop()
        _current = None
