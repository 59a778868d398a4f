"""SLURM through submitit, the driver side (`hydra/launcher=slurm`): one job per run, one task
per rank (odc_bench/run/slurm_task.py runs inside each task).

hydra-submitit-launcher's launcher, changed in three ways. Each run is checked (ConfigError:
exit 2, nothing submitted) and sized on its own, so a sweep over world_size asks for the right
number of tasks per job; runs already `ok` in the results table are skipped before anything is
queued; and the driver waits for the jobs while feeding the progress display, noticing a job
that left the queue without a result even on clusters without accounting (no sacct).
"""

from __future__ import annotations

import copy
import json
import logging
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import submitit
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher import submitit_launcher
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import DictConfig, OmegaConf, open_dict
from submitit.core.utils import JobPaths

from odc_bench.cli.progress import outcome_of
from odc_bench.config.fields import require
from odc_bench.config.run import load
from odc_bench.errors import ConfigError, fail
from odc_bench.jobs import progress
from odc_bench.plan.spec import RunSpec, resolve
from odc_bench.results.table import check_results_dir, ok_runs
from odc_bench.run.mpiexec import uses_mpi

log = logging.getLogger(__name__)

# Launcher keys a sweep may vary per run (through interpolation, e.g. tasks_per_node: ${world_size});
# the others are read once for the whole sweep, as hydra-submitit-launcher does.
PER_RUN_KEYS = ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "mem_gb", "timeout_min", "partition")
POLL_S = 1.0
# A job gone from squeue whose result files are still missing after this long has died.
GONE_GRACE_S = 15.0
# srun's plugin that hands MPICH (engine.transport=mpi) its ranks: PMI-2, which the mpich wheel speaks.
SRUN_MPI = "pmi2"


def job_parameters(cfg: DictConfig, spec: RunSpec) -> dict[str, Any]:
    """This run's resource request (cfg: the job's config with its `hydra` section), with the
    checks SLURM cannot make for us."""
    world_size = spec.world_size
    params = {k: OmegaConf.select(cfg, f"hydra.launcher.{k}") for k in PER_RUN_KEYS}
    nodes, per_node = params["nodes"], params["tasks_per_node"]
    if nodes * per_node != world_size:
        fix = (f"set hydra.launcher.tasks_per_node={world_size // nodes}" if world_size % nodes == 0 else
               f"world_size must divide evenly over the nodes: choose a multiple of {nodes} or other nodes")
        raise ConfigError(f"hydra.launcher.nodes ({nodes}) x tasks_per_node ({per_node}) must equal world_size "
                          f"({world_size}): one SLURM task per rank; {fix}")
    check_placement(spec, params)
    if uses_mpi(spec):
        check_srun_mpi()
        params["srun_args"] = [f"--mpi={SRUN_MPI}"]  # submitit's slurm_srun_args: the tasks' MPI bootstrap
    return params


def check_srun_mpi() -> None:
    """ConfigError when this cluster's srun cannot bootstrap MPICH (no pmi2 plugin); nothing to
    check when srun is not here to ask."""
    try:
        listed = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return
    plugins = re.findall(r"^\s+(\S+)\s*$", listed.stdout + listed.stderr, re.MULTILINE)
    require(SRUN_MPI in plugins,
            f"engine.transport=mpi starts its ranks with srun --mpi={SRUN_MPI}, which this cluster's srun lacks "
            f"(srun --mpi=list: {', '.join(plugins) or 'nothing'}); ask its admins for Slurm's {SRUN_MPI} plugin, "
            "or run ODC on one node with engine.transport=shm")


def check_placement(spec: RunSpec, params: dict[str, Any]) -> None:
    """Refuse jobs whose ranks would land where the resolved run cannot work.

    The run is resolved here, on the submitting machine: `device=auto` and `auto` engine
    options follow this machine's CUDA. GPUs requested from a machine that sees none would reach
    the nodes as a CPU run; and memory that one host shares (ODC's shared-memory heap, the
    collective engine's shm group) cannot span nodes.
    """
    require(not (params.get("gpus_per_node") and spec.device_type != "cuda"),
            "hydra.launcher.gpus_per_node asks for GPUs, but runs are resolved on this machine, which sees no CUDA "
            "device; submit from a node that sees the GPUs")
    bound = spec.config.engine.options.host_bound()
    if params["nodes"] > 1 and bound is not None:
        what, fix = bound
        raise ConfigError(f"{what}, which cannot span hydra.launcher.nodes={params['nodes']}; {fix}")


def _queue_states(job_ids: Sequence[str]) -> dict[str, str] | None:
    """SLURM's state of each queued job (array tasks one by one); None when squeue cannot answer."""
    raw = sorted({j.split("_")[0] for j in job_ids})
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T", "-j", ",".join(raw)], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 and "Invalid job id" not in out.stderr:
        return None
    return dict(line.split("|", 1) for line in out.stdout.split() if "|" in line)


def _job_return(overrides: Sequence[str], status: JobStatus, value: Any) -> JobReturn:
    """A job's outcome decided here rather than by the job: skipped, or lost on the way."""
    job_return = JobReturn(overrides=list(overrides), status=status)
    job_return.return_value = value
    return job_return


class SlurmLauncher(submitit_launcher.SlurmLauncher):
    """hydra-submitit-launcher's SLURM launcher, one job per run, sized per run, resumable."""

    def _executor(self, per_run: dict[str, Any]) -> submitit.AutoExecutor:
        params = {**self.params, **per_run}
        executor = submitit.AutoExecutor(cluster="slurm", folder=params["submitit_folder"],
                                         slurm_max_num_timeout=params["max_num_timeout"])
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()
                                      if k not in {"submitit_folder", "max_num_timeout"}})
        return executor

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        bar = progress.current()
        returns: list[JobReturn | None] = [None] * len(job_overrides)
        groups: dict[str, tuple[dict[str, Any], list[tuple[int, tuple]]]] = {}
        queued: set[str] = set()
        for i, overrides in enumerate(job_overrides):
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            job_cfg = copy.deepcopy(cfg)
            with open_dict(job_cfg):
                del job_cfg["hydra"]
            try:
                spec = resolve(load(job_cfg))
                check_results_dir(Path(job_cfg.results_dir))
                params = job_parameters(cfg, spec)
            except ConfigError as e:
                fail(e)
            table = Path(job_cfg.results_dir) / "runs.csv"
            idx = initial_job_idx + i
            if spec.run_id in queued or ok_runs(table).get(spec.run_id, 0) >= spec.config.repeat:
                where = "queued by an earlier job of this sweep" if spec.run_id in queued else f"already in {table}"
                print(f"odc_bench: run {spec.run_id} (#{idx}) {where}; skipped")
                returns[i] = _job_return(overrides, JobStatus.COMPLETED, None)
                if bar is not None:
                    bar.run_finished("skipped")
                continue
            queued.add(spec.run_id)
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            args = (list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state())
            groups.setdefault(json.dumps(params, sort_keys=True), (params, []))[1].append((i, args))
        submitted: dict[int, tuple[submitit.Job, int]] = {}
        for params, items in groups.values():
            jobs = self._executor(params).map_array(self, *zip(*(args for _, args in items), strict=True))
            tasks = params["nodes"] * params["tasks_per_node"]
            submitted.update({i: (job, tasks) for (i, _), job in zip(items, jobs, strict=True)})
        self._wait(submitted, job_overrides, returns, bar)
        return returns  # type: ignore[return-value]

    def _wait(self, submitted: dict[int, tuple[submitit.Job, int]], job_overrides: Sequence[Sequence[str]],
              returns: list[JobReturn | None], bar: progress.SweepProgress | None) -> None:
        """Wait for the jobs through their result files and squeue, never sacct (clusters without
        accounting have none).

        A job is done when every task's result file is there; one that left the queue without
        them and whose files do not appear within GONE_GRACE_S died (killed, out of memory, time limit).
        """
        pending = dict(submitted)
        left_queue: dict[int, float] = {}
        while pending:
            states = _queue_states([job.job_id for job, _ in pending.values()])
            for i, (job, tasks) in list(pending.items()):
                results = [JobPaths(self.params["submitit_folder"], job.job_id, t).result_pickle for t in range(tasks)]
                if all(p.exists() for p in results):  # every task has returned, the job may still be ending
                    returns[i] = self._result(job, job_overrides[i])
                elif states is None or job.job_id in states:
                    continue
                elif time.monotonic() - left_queue.setdefault(i, time.monotonic()) > GONE_GRACE_S:
                    error = RuntimeError(f"SLURM job {job.job_id} left the queue without a result; "
                                         f"see {job.paths.stderr}")
                    print(f"odc_bench: {error}", file=sys.stderr)
                    returns[i] = _job_return(job_overrides[i], JobStatus.FAILED, error)
                else:
                    continue
                del pending[i]
                done = returns[i]
                if bar is not None and done is not None:
                    bar.run_finished(outcome_of(done))
            if bar is not None and states is not None:
                running = sum(states.get(job.job_id) == "RUNNING" for job, _ in pending.values())
                bar.note(f"SLURM: {running} running, {len(pending) - running} queued")
            if pending:
                time.sleep(POLL_S)

    @staticmethod
    def _result(job: submitit.Job, overrides: Sequence[str]) -> JobReturn:
        try:
            return job.results()[0]
        except Exception as e:  # a task raised outside the run (a run's own failure is a row)
            print(f"odc_bench: SLURM job {job.job_id} failed: {str(e).strip().splitlines()[-1]}", file=sys.stderr)
            return _job_return(overrides, JobStatus.FAILED, e)
