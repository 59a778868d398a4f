"""What tests share: the repository, the config a command line composes, and running the CLI
(in this process, as the entry function; in a subprocess only where the entry point itself is tested).

reference.py holds the single-process trainer every engine must reproduce, real_data.py small
real datasets, figures.py results tables to draw figures from.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from omegaconf import DictConfig

from odc_bench.config.compose import compose_config as _compose
from odc_bench.config.compose import compose_run
from odc_bench.config.run import RunConfig
from odc_bench.plan.spec import RunSpec, resolve
from odc_bench.results.migrate import series_from_config

REPO = Path(__file__).resolve().parents[2]


# What a rank under torchrun prints when torch's C++ side aborts it at interpreter exit, after its
# script has ended (docs/use_odc.md, "Under torchrun"): the run itself is complete, so it is run
# again rather than failed; any other failure fails the test.
EXIT_ABORT = "terminate called without an active exception"


def torchrun(*args: str, cwd: Path | None = None, timeout: float = 300) -> None:
    """`python -m torch.distributed.run --standalone --nproc-per-node 2 ARGS`, run once more if a rank
    aborted at exit (EXIT_ABORT) and only then; an AssertionError with the ranks' output otherwise."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    for attempt in (1, 2):
        done = subprocess.run(command, cwd=cwd, timeout=timeout, capture_output=True, text=True)
        output = done.stdout + done.stderr
        if done.returncode == 0:
            return
        if EXIT_ABORT not in output:
            break
        if attempt == 1:
            logging.getLogger(__name__).warning("torchrun %s: a rank aborted at exit; running it again", args)
    raise AssertionError(f"torchrun {' '.join(args)} exited {done.returncode}:\n{output[-8000:]}")


def compose_config(*overrides: str, hydra: bool = False) -> DictConfig:
    """The composed config `python -m odc_bench OVERRIDES` would run with (Hydra's section too, if asked)."""
    return _compose(overrides, hydra=hydra)


def run_config(*overrides: str) -> RunConfig:
    """The typed config `python -m odc_bench OVERRIDES` would run with."""
    return compose_run(overrides)


def run_spec(*overrides: str) -> RunSpec:
    """The planned run `python -m odc_bench OVERRIDES` would execute."""
    return resolve(compose_run(overrides))


def exit_status(entry: Callable[[Sequence[str]], object], *args: str) -> int:
    """Run a command's entry function in this process on `args`, as its command line would run:
    its exit status (a SystemExit's code, or what it returned; 0 for None)."""
    try:
        returned = entry(list(args))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    return returned if isinstance(returned, int) else 0


def odc_bench(*args: str) -> int:
    """`python -m odc_bench ARGS` in this process (Hydra's output folders land in the working
    directory: chdir to a scratch folder first): its exit status; read its output with capsys.
    The root logger is given back as it was: Hydra points it at the job's console and log file."""
    from odc_bench.cli import main  # imported on first use: a module that never runs the command skips its imports

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return exit_status(main, *args)
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m odc_bench ARGS` as a process of its own: for tests of the entry point itself
    (exit status seen by a shell, signals, a fresh interpreter); `env` adds to this process's."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="0", **(env or {}))
    return subprocess.run([sys.executable, "-m", "odc_bench", *args], cwd=cwd or REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def with_series(row: dict) -> dict:
    """A synthetic row with the series columns a run of its config would have written."""
    values = series_from_config(row["engine"], row.get("backend"), row.get("config"))
    return {**row, **dict(zip(("variant", "shard", "fetch", "staleness"), values, strict=True))}


def overloaded() -> tuple[float, int] | None:
    """(load average, cores) where the machine runs more than 1.5 times as much work as it has
    cores; None where it is roughly free."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    return (load, cores) if load > 1.5 * cores else None


def skip_if_overloaded() -> None:
    """Real timings on a machine running several times more work than it has cores measure the
    other work, not the model: compare only when the machine is roughly free. (`make test` runs
    the tests marked `timing` alone, once the load has settled; this is for a suite run some
    other way.)"""
    if (busy := overloaded()) is not None:
        load, cores = busy
        pytest.skip(f"load average {load:.1f} on {cores} cores: wall-clock comparisons would measure other jobs")
