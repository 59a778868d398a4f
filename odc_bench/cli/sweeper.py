"""A Hydra sweeper over a union of grids minus excluded combinations.

The paper's experiments are not full products: Fig. 8 pairs every engine with every balancer
except collective with lb_mini (which collective FSDP cannot run), and the golden setting's
parametric study varies one factor at a time around a shared point. Hydra's basic sweeper
only expands one product, so this one expands several, joins them and filters the result:

    hydra.sweeper.params   the product shared by every grid (the basic sweeper's `params`)
    hydra.sweeper.grids    a list of grids; each is a product of its own keys over `params`
    hydra.sweeper.exclude  a list of partial jobs ({key: value, ...}); a job matching every
                           key=value of one of them is dropped

A grid's keys override `params`, command-line overrides override both (so `model=tiny` turns
a paper-scale sweep into a CPU one), and a job that two grids produce (the shared point of
every one-factor variation) runs once. Without grids and exclusions it is the basic sweeper.

A config of `repeat=N` runs N times. By default (`hydra.sweeper.interleave: true`) the sweep runs
in rounds: round r asks every config of repeat >= r for r ok runs (`repeat=r`, which a run's key
leaves out, so each round adds one run), in sweep order on odd rounds and reversed on even ones,
so a config's runs spread over the sweep instead of meeting one stretch of a shared host's load
back to back (what the demo's five side-by-side sets did by hand). `interleave: false` keeps each
config's repeats back to back. Each round is launched after the one before has finished (on
SLURM too: a round's jobs run side by side).

Every job is checked (composed, typed and planned) before the first one runs: a combination
that cannot run (collective FSDP with lb_mini) is skipped with one line saying how to exclude
it, any other bad input stops the sweep (exit status 2) with nothing written. The sweep ends
with a summary of its runs (outcomes.py) and exit status 1 when one of them failed, wherever
the runs executed (locally or on SLURM).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from odc_bench.app import Job
from odc_bench.cli.outcomes import print_summary
from odc_bench.cli.precheck import check_run, require_listable, swept_values
from odc_bench.config.compose import COMPOSE_ERRORS, hydra_error_line, overrides_parser, refuse_odd_groups
from odc_bench.config.run import load
from odc_bench.errors import CombinationError, ConfigError, ends_cleanly, fail
from odc_bench.files import interrupts_deferred, interrupts_live
from odc_bench.jobs import progress
from odc_bench.plan.spec import Planner, check_combination


def _as_override(key: str, value: Any) -> str:
    if value is None:
        return f"{key}=null"
    if isinstance(value, bool):
        return f"{key}={str(value).lower()}"
    return f"{key}={value}"


def _by_key(parser: OverridesParser, overrides: Sequence[str]) -> dict[str, Override]:
    return {o.get_key_element(): o for o in parser.parse_overrides(list(overrides))}


def expand_jobs(params: Mapping[str, Any] | None, grids: Sequence[Mapping[str, Any]] | None = None,
                exclude: Sequence[Mapping[str, Any]] | None = None, arguments: Sequence[str] = ()) -> list[list[str]]:
    """Every job of the sweep as its list of overrides, in grid order, without repeats."""
    parser = overrides_parser()
    common = _by_key(parser, [_as_override(k, v) for k, v in (params or {}).items()])
    cli = _by_key(parser, arguments)
    dropped = [{_as_override(k, v) for k, v in partial.items()} for partial in exclude or []]
    jobs: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    for grid in grids or [{}]:
        own = _by_key(parser, [_as_override(k, v) for k, v in grid.items()])
        merged = {**common, **own, **cli}
        # One that lists nothing, here or on the command line, or more than this host can.
        counts = [len(swept_values(o)) if o.is_sweep_override() else 1 for o in merged.values()]
        require_listable(len(jobs) + math.prod(counts), "every combination of its values makes")
        for job in BasicSweeper.split_arguments(list(merged.values()), None)[0]:
            key = frozenset(job)
            if key not in seen and not any(partial <= key for partial in dropped):
                seen.add(key)
                jobs.append(job)
    return jobs


def sweep_jobs(sweeper: Mapping[str, Any], arguments: Sequence[str] = ()) -> list[list[str]]:
    """The jobs a `hydra.sweeper` config (as plain containers) expands to, with these command-line overrides."""
    return expand_jobs(sweeper.get("params"), sweeper.get("grids"), sweeper.get("exclude"), arguments)


class GridSweeper(Sweeper):
    """Hydra's basic sweeper, expanding a union of grids minus exclusions instead of one product.

    It derives from Sweeper, not BasicSweeper: Hydra re-executes its core plugin modules when
    it scans for plugins, which leaves a subclass of BasicSweeper made before the scan broken.
    """

    def __init__(self, max_batch_size: int | None = None, params: Mapping[str, Any] | None = None,
                 grids: Sequence[Mapping[str, Any]] | None = None,
                 exclude: Sequence[Mapping[str, Any]] | None = None, interleave: bool = True) -> None:
        super().__init__()
        self.max_batch_size = max_batch_size
        self.interleave = interleave
        self.params = dict(params or {})
        self.grids = [dict(g) for g in grids or []]
        self.exclude = [dict(e) for e in exclude or []]
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Launcher | None = None
        self.planner = Planner()

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context = hydra_context
        self.config = config
        if isinstance(task_function, Job):  # the jobs plan with the planner the sweep checked them with
            self.planner = task_function.planner
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> list[Sequence[JobReturn]]:
        # Inside the sweep: Hydra would report a closed stdout that its launcher's logging meets
        # as the sweep's failure, traceback and all.
        with interrupts_live(), ends_cleanly():
            return self._sweep(arguments)

    def _sweep(self, arguments: list[str]) -> list[Sequence[JobReturn]]:
        assert self.config is not None and self.launcher is not None
        try:
            expanded = expand_jobs(self.params, self.grids, self.exclude, arguments)
        except ConfigError as e:
            fail(ConfigError(f"the sweep: {e}"))
        runnable, cannot_run = self._runnable(expanded)
        jobs = [job for job, _ in runnable]
        repeats = [repeat for _, repeat in runnable]
        if self.interleave and max(repeats, default=1) > 1:
            try:
                require_listable(sum(repeats), "its repeats, in rounds, are", "lower repeat, or set "
                                 "hydra.sweeper.interleave=false to run each config's repeats back to back")
            except ConfigError as e:
                fail(ConfigError(f"the sweep: {e}"))
            batches = interleave(jobs, repeats)
        else:
            batches = [jobs]
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        display = progress.current()
        if display is not None and display.total is not None:
            display.set_total(sum(map(len, batches)))
        returns: list[Sequence[JobReturn]] = []
        done = 0
        for batch in batches:  # a round is launched once the one before has finished
            size = self.max_batch_size or len(batch) or 1
            for first in range(0, len(batch), size):
                with interrupts_deferred():  # Hydra's launcher composes each job (cli/__init__.py)
                    returns.append(self.launcher.launch(batch[first:first + size], initial_job_idx=done + first))
            done += len(batch)
        progress.stop()  # the summary goes below the display, not through it
        failed = print_summary([r for batch in returns for r in batch], cannot_run, configs=len(jobs))
        if failed:
            sys.exit(1)
        return returns

    def _runnable(self, jobs: list[list[str]]
                  ) -> tuple[list[tuple[list[str], int]], list[tuple[list[str], CombinationError]]]:
        """The jobs that can run, each with its repeat, and those that cannot (with why), each
        announced in one line.

        Every job is composed, typed and planned here, as the command line's own run is before
        Hydra starts (precheck.check_run), before anything is written: bad input in a later job,
        or in a setting the sweep file gives every job (a calibration this machine lacks), stops
        the sweep now (ConfigError) rather than after its output folder or hours of earlier runs.
        The jobs plan again with the same planner, which returns what it planned here."""
        assert self.hydra_context is not None and self.config is not None
        runnable, cannot_run = [], []
        for job in jobs:
            try:
                refuse_odd_groups(job)
                with interrupts_deferred():  # OmegaConf interrupted mid-merge (cli/__init__.py)
                    cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(job))
            except COMPOSE_ERRORS as e:  # a later job's option (model=PATH, ...)
                fail(ConfigError(f"{' '.join(job) or 'the sweep'}: {hydra_error_line(e)}"))
            except ConfigError as e:  # a config source's own check (odc_bench/config/model_source.py)
                fail(ConfigError(f"{' '.join(job) or 'the sweep'}: {e}"))
            try:
                config = load(cfg)
                check_combination(config)
                check_run(cfg, self.planner)
            except CombinationError as e:
                exclude = {k: OmegaConf.select(cfg, f"{k}.name") for k in e.keys}
                print(f"odc_bench: skipped {' '.join(f'{k}={v}' for k, v in exclude.items())}: {e}; "
                      f"leave it out with hydra.sweeper.exclude "
                      f"(e.g. 'hydra.sweeper.exclude=[{{{','.join(f'{k}:{v}' for k, v in exclude.items())}}}]')",
                      file=sys.stderr)
                cannot_run.append((job, e))
                continue
            except ConfigError as e:
                fail(ConfigError(f"{' '.join(job) or 'the sweep'}: {e}"))
            runnable.append((job, config.repeat))
        return runnable, cannot_run


def interleave(jobs: Sequence[list[str]], repeats: Sequence[int]) -> list[list[list[str]]]:
    """The jobs as rounds: round r asks every job of repeat >= r for r ok runs (its repeat override
    set to r), in the jobs' order on odd rounds and reversed on even ones."""
    rounds = []
    for r in range(1, max(repeats, default=1) + 1):
        members = [[*(o for o in job if o.split("=", 1)[0].lstrip("+") != "repeat"), f"repeat={r}"]
                   for job, n in zip(jobs, repeats, strict=True) if n >= r]
        rounds.append(members if r % 2 else members[::-1])
    return rounds
