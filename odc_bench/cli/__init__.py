"""The command line: its help (help.py), checks before Hydra starts (precheck.py), the sweeps'
sweeper (sweeper.py), the SLURM launcher's driver side (slurm.py, submissions.py) and the
progress callback (progress.py)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import NoReturn

from odc_bench.app import main as hydra_main
from odc_bench.cli.help import text as help_text
from odc_bench.cli.precheck import precheck
from odc_bench.config.compose import register_chosen_sweep
from odc_bench.errors import ConfigError, Stopped, fail, unwinding_on_signals
from odc_bench.files import interrupts_deferred
from odc_bench.plan.spec import Planner


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m odc_bench` (the `odc-bench` script): every bad input ends in one line and exit
    status 2 before Hydra runs; Ctrl-C ends it with status 130 and no traceback.

    argv (default: the process's) is the whole command line, Hydra's part included, so a caller
    in the same process runs exactly what the command would. The SIGTERM and SIGHUP handlers it
    installs are removed again when it returns or exits."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        with unwinding_on_signals():
            _run(args)
    except Stopped as e:
        e.say(f"odc_bench: stopped by {e.signal.name}; the run under way was stopped and wrote nothing (finished "
              f"runs' rows are kept)")
        raise


# Launchers that start a command once per rank, by the variable each sets to the count it started.
_PER_RANK = {"WORLD_SIZE": "torchrun", "SLURM_STEP_NUM_TASKS": "srun", "OMPI_COMM_WORLD_SIZE": "mpirun",
             "PMI_SIZE": "mpiexec"}


def started_per_rank(env: Mapping[str, str]) -> str | None:
    """The launcher that started this command as one of several copies (`torchrun --nproc_per_node
    2 -m odc_bench`, `srun -n 8 python -m odc_bench`), with its variable; None when started once.
    The harness starts a run's ranks itself: each copy ran the whole sweep, and the copies raced
    for every run (one ran it, the others skipped it as under way)."""
    for var, launcher in _PER_RANK.items():
        if var == "WORLD_SIZE" and "TORCHELASTIC_RUN_ID" not in env:
            continue  # WORLD_SIZE alone is a torch.distributed setting anyone may export
        with contextlib.suppress(ValueError):
            if int(env.get(var, "1")) > 1:
                return f"{launcher} ({var}={env[var]})"
    return None


def _run(args: list[str]) -> None:
    if args in (["help"], ["--help"], ["-h"]):
        print(help_text())
        return
    planner = Planner()  # the precheck's plans are the jobs'
    try:
        if (launcher := started_per_rank(os.environ)) is not None:
            raise ConfigError(f"this command was started once per rank, by {launcher}, but it starts a run's ranks "
                              f"itself (world_size); start it once: python -m odc_bench ... (on SLURM: "
                              f"hydra/launcher=slurm, or srun -n 1)")
        register_chosen_sweep(args)
        precheck(args, planner)
    except ConfigError as e:
        fail(e)
    with _command_line(args):
        try:
            # Hydra's own code (composing the config, launching each job) runs with Ctrl-C held,
            # the harness's (the jobs, the sweeper, the SLURM launcher) without (interrupts_live):
            # OmegaConf interrupted mid-merge raised another error instead, which Hydra reported
            # as the command's failure, status 1.
            with interrupts_deferred():
                hydra_main(planner)
        except KeyboardInterrupt as e:
            interrupted(str(e))


@contextlib.contextmanager
def _command_line(args: list[str]) -> Iterator[None]:
    """sys.argv as `args` while Hydra runs: Hydra reads its command line from there."""
    saved = sys.argv
    sys.argv = [saved[0] if saved else "odc_bench", *args]
    try:
        yield
    finally:
        sys.argv = saved


def interrupted(what: str = "") -> NoReturn:
    """Ctrl-C: one line and status 130. The run under way was stopped and wrote nothing (its ranks
    are gone and their shared memory removed: run/local.py); rows of runs that finished stay. `what`:
    what stayed instead (the stopped run's checkpoints: jobs/train.py) or what the interrupted
    launcher did (the SLURM jobs it cancelled)."""
    print(f"odc_bench: interrupted; {what or 'the run under way was stopped and wrote nothing'} (finished runs' "
          f"rows are kept)", file=sys.stderr)
    # A Ctrl-C that surfaced inside source run by exec() (dataclasses build their methods that way,
    # so a lazy `import torch` can take it there) leaves CPython's mark of an unhandled
    # KeyboardInterrupt set though it was handled here, and the interpreter would end by SIGINT
    # rather than with 130; running source again clears the mark.
    exec("")
    sys.exit(130)
