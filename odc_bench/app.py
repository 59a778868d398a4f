"""The Hydra app: `python -m odc_bench [overrides]` runs one job; `sweep=NAME` runs a sweep.

Hydra composes the config and calls a `Job` once per job; the job's typed config decides the
task. Command-line checks before Hydra starts live in odc_bench/cli: they plan the run with a
planner that the jobs then plan with (plan/spec.py Planner), so the run is planned once.
"""

from __future__ import annotations

import contextlib

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from odc_bench.config.run import load
from odc_bench.errors import ConfigError, ends_cleanly, fail
from odc_bench.files import interrupts_live
from odc_bench.jobs.train import run_training
from odc_bench.plan.spec import Planner


class Job:
    """What Hydra runs for each job of the command line, planning with one planner."""

    def __init__(self, planner: Planner) -> None:
        self.planner = planner

    def __call__(self, cfg: DictConfig) -> dict | list[dict] | None:
        """The job's row (None when skipped): Hydra hands it to callbacks and launchers."""
        # Inside the job: Hydra would report a closed stdout as the job's failure, traceback and all.
        # A relative path of the command line is the launch folder's, where the check before the
        # run read it: hydra.job.chdir=True (Hydra 1.1's default, which configs still carry) made
        # it a path under the job's output folder, a dataset not found or results written there.
        # The job runs in the launch folder; Hydra's own files are in the output folder already.
        launch = HydraConfig.get().runtime.cwd if HydraConfig.initialized() and HydraConfig.get().job.chdir else None
        with interrupts_live(), ends_cleanly(), contextlib.chdir(launch) if launch else contextlib.nullcontext():
            return self._run(cfg)

    def _run(self, cfg: DictConfig) -> dict | list[dict] | None:
        try:
            config = load(cfg)
            if config.task == "primitives":
                from odc_bench.jobs.primitives import run_primitives  # torch: only the microbenchmark needs it here

                return run_primitives(config)
            hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else None
            gpus = getattr(hydra_cfg.launcher, "gpus_per_node", None) if hydra_cfg is not None else None
            return run_training(config, in_sweep=hydra_cfg is not None and hydra_cfg.mode == RunMode.MULTIRUN,
                                job_gpus=gpus, planner=self.planner)
        except ConfigError as e:
            fail(e)


def main(planner: Planner) -> None:
    """Run the command line's jobs under Hydra (sys.argv), each planned with `planner`."""
    hydra.main(config_path="conf", config_name="config", version_base="1.3")(Job(planner))()
