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
"""

from __future__ import annotations

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
    parser = OverridesParser.create()
    common = _by_key(parser, [_as_override(k, v) for k, v in (params or {}).items()])
    cli = _by_key(parser, arguments)
    dropped = [{_as_override(k, v) for k, v in partial.items()} for partial in exclude or []]
    jobs: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    for grid in grids or [{}]:
        own = _by_key(parser, [_as_override(k, v) for k, v in grid.items()])
        merged = {**common, **own, **cli}
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
                 exclude: Sequence[Mapping[str, Any]] | None = None) -> None:
        super().__init__()
        self.max_batch_size = max_batch_size
        self.params = dict(params or {})
        self.grids = [dict(g) for g in grids or []]
        self.exclude = [dict(e) for e in exclude or []]
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Launcher | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> list[Sequence[JobReturn]]:
        assert self.config is not None and self.launcher is not None
        jobs = expand_jobs(self.params, self.grids, self.exclude, arguments)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        size = self.max_batch_size or len(jobs) or 1
        returns: list[Sequence[JobReturn]] = []
        for first in range(0, len(jobs), size):
            batch = jobs[first:first + size]
            self.validate_batch_is_legal(batch)  # every job composes before any of the batch runs
            results = self.launcher.launch(batch, initial_job_idx=first)
            for r in results:
                _ = r.return_value  # a job that raised ends the sweep with its error
            returns.append(results)
        return returns
