"""Hydra's view of a sweep (its size and each job's start and end), fed to the progress display
(odc_bench/jobs/progress.py); registered as a callback in odc_bench/conf/config.yaml."""

from __future__ import annotations

from typing import Any

from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from odc_bench.cli.outcomes import outcome_of
from odc_bench.cli.sweeper import sweep_jobs
from odc_bench.jobs import progress

LABEL_CHARS = 48


def _key(override: str) -> str:
    return override.split("=", 1)[0]


def _label(config: DictConfig, varying: set[str] | None) -> str:
    """The job's overrides, only those the sweep varies when it is one."""
    overrides = OmegaConf.select(config, "hydra.overrides.task", default=[]) or []
    shown = [o for o in overrides if (_key(o) in varying if varying is not None
                                      else not o.startswith(("hydra.", "results_dir=")))]
    label = " ".join(shown) or "default job"
    # Cut with three dots, not an ellipsis: a terminal in latin-1 or ASCII (LANG=en_US on older
    # systems) could not print one, and the run ended in a UnicodeEncodeError.
    return label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 3] + "..."


class ProgressCallback(Callback):
    """Hydra's view of a sweep (its size and each job's start and end) fed to the display.

    Jobs that a remote launcher runs call on_job_start/on_job_end in their own process, where
    no display is active, so those calls do nothing; that launcher reports to the display itself.
    """

    def __init__(self) -> None:
        self.varying: set[str] | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweeper: Any = OmegaConf.to_container(config.hydra.sweeper, resolve=True)
        try:
            jobs = sweep_jobs(sweeper, list(config.hydra.overrides.task))
        except Exception:  # another sweeper's params (ranges, intervals): the sweep runs, size unknown
            progress.start(None)
            return
        values: dict[str, set[str]] = {}
        for job in jobs:
            for override in job:
                values.setdefault(_key(override), set()).add(override)
        self.varying = {k for k, v in values.items() if len(v) > 1}
        progress.start(len(jobs))

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.varying = None
        progress.start(1)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        display = progress.current()
        if display is not None:
            display.run_started(_label(config, self.varying))

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        display = progress.current()
        if display is not None:
            display.run_finished(outcome_of(job_return))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        progress.stop()

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        progress.stop()
