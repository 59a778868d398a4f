"""Runs on SLURM through submitit: one SLURM job per run, one SLURM task per rank.

Driver side (`SlurmLauncher`, selected by `hydra/launcher=slurm`): hydra-submitit-launcher's
launcher, changed in three ways. Each run is checked (ConfigError: exit 2, nothing submitted)
and sized on its own, so a sweep over world_size asks for the right number of tasks per job;
runs already `ok` in the results table are skipped before anything is queued; and the driver
waits for the jobs while feeding the progress display, noticing a job that left the queue
without a result even on clusters without accounting (no sacct).

Task side (`run_ranks`, called by the app inside each task): the torch.distributed
environment comes from submitit's JobEnvironment (global rank, local rank, world size, the
first node as master). Device selection is left alone: CUDA_VISIBLE_DEVICES is not touched
and a rank picks cuda:local_rank among the devices it sees. Rank 0 hosts the rendezvous
store on a port the kernel picks and publishes it in the job's folder (which submitit
requires to be shared between nodes); every rank leaves its result or its error there, and
rank 0 gathers them and writes the run's row. Nobody watches the ranks from outside, so each
notices a dead peer through its own timeouts and heartbeats (odc_core/liveness.py); when
rank 0 is the one that died, the first surviving rank to claim the report writes the row.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import submitit
import torch
import torch.distributed as dist
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher import submitit_launcher
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import DictConfig, OmegaConf, open_dict
from submitit.core.utils import JobPaths

from odc_bench import progress
from odc_bench.config import ConfigError, RunSpec, check_results_dir, resolve, run_device_type
from odc_bench.launch.local import RunFailed
from odc_bench.results import atomic_write_text, completed_keys
from odc_bench.worker import RankJob, run_rank
from odc_core.engine import collective_backend
from odc_core.liveness import PeerLost, one_line

log = logging.getLogger(__name__)

# Launcher keys a sweep may vary per run (through interpolation, e.g. tasks_per_node: ${world_size});
# the others are read once for the whole sweep, as hydra-submitit-launcher does.
PER_RUN_KEYS = ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "mem_gb", "timeout_min", "partition")
POLL_S = 1.0
# A job gone from squeue whose result files are still missing after this long has died.
GONE_GRACE_S = 15.0


def in_task() -> bool:
    """Whether this process is a task of a SLURM job that submitit started (one rank of a run)."""
    return os.environ.get("SUBMITIT_EXECUTOR") == "slurm" and "SLURM_PROCID" in os.environ


# ---------------------------------------------------------------- task side

def _wait_for_file(candidates: Sequence[Path], timeout_s: float, what: str) -> Path:
    deadline = time.monotonic() + timeout_s
    while True:
        for path in candidates:
            if path.exists():
                return path
        if time.monotonic() > deadline:
            raise RunFailed(f"waited {timeout_s:.0f}s for {what} ({candidates[0].parent}); it never arrived")
        time.sleep(0.1)


def _export_torch_env(env: submitit.JobEnvironment, port: int) -> None:
    """torch.distributed's env:// variables, for code that reads them; devices are left alone."""
    os.environ.update(MASTER_ADDR=env.hostnames[0], MASTER_PORT=str(port), RANK=str(env.global_rank),
                      WORLD_SIZE=str(env.num_tasks), LOCAL_RANK=str(env.local_rank),
                      LOCAL_WORLD_SIZE=str(env.num_tasks // env.num_nodes))


def run_ranks(spec: RunSpec, deadline_s: float | None = None) -> list[dict] | None:
    """Run this task's rank; rank 0 returns every rank's result, the other ranks None.

    The job's time limit (hydra.launcher.timeout_min) bounds the run here, not deadline_s.
    """
    env = submitit.JobEnvironment()
    world, rank, local_rank = env.num_tasks, env.global_rank, env.local_rank
    if world != spec.world_size:
        raise RunFailed(f"the SLURM job has {world} tasks but world_size={spec.world_size}; "
                        f"set hydra.launcher.nodes x tasks_per_node = world_size")
    timeout_s = float(spec.config["timeout_s"])
    # One exchange folder per attempt: a requeued job must not find the last attempt's store address.
    shared = Path(env.paths.folder) / f"ranks.{os.environ.get('SLURM_RESTART_COUNT', '0')}"
    shared.mkdir(parents=True, exist_ok=True)
    if not spec.config.get("threads_per_rank"):
        per_node = world // env.num_nodes
        spec.config["threads_per_rank"] = int(os.environ.get("SLURM_CPUS_PER_TASK") or
                                              max(1, (os.cpu_count() or 1) // per_node))
    if rank == 0:  # the store lives as long as this function, past every rank's end
        store = dist.TCPStore(env.hostnames[0], 0, world, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout_s))
        host, port = env.hostnames[0], store.port
        atomic_write_text(shared / "store.json", json.dumps(dict(host=host, port=port, run_id=spec.run_id)))
    else:
        found = _wait_for_file([shared / "store.json"], timeout_s, "rank 0 to publish its store address")
        info = json.loads(found.read_text())
        if info["run_id"] != spec.run_id:
            raise RunFailed(f"rank {rank} resolved run {spec.run_id} but rank 0 runs {info['run_id']}")
        host, port = info["host"], int(info["port"])
    _export_torch_env(env, port)
    job = RankJob(spec=spec, store_host=host, store_port=port, out_dir=str(shared),
                  job_id=f"{spec.run_id[:8]}-{env.job_id}-{shared.suffix.lstrip('.')}", store_rank=0)
    try:
        run_rank(rank, job, local_rank)
    except Exception as e:  # reported through the shared folder: rank 0 names the failing rank
        atomic_write_text(shared / f"rank{rank}.error", one_line(e))
        rank0_lost = isinstance(e, PeerLost) and 0 in e.peers
        if (rank != 0 and not rank0_lost) or not _claim_report(shared):
            return None
        raise RunFailed(_first_error(shared) if rank == 0 else f"rank {rank} failed: {one_line(e)}") from None
    if rank != 0:
        atomic_write_text(shared / f"rank{rank}.done", "")
        return None
    for r in range(1, world):
        got = _wait_for_file([shared / f"rank{r}.done", shared / f"rank{r}.error"], timeout_s, f"rank {r} to finish")
        if got.suffix == ".error":
            raise RunFailed(f"rank {r} failed: {got.read_text()}")
    results = [json.loads((shared / f"rank{r}.json").read_text()) for r in range(world)]
    shutil.rmtree(shared, ignore_errors=True)
    return results


def _claim_report(shared: Path) -> bool:
    """Whether this rank writes the failed run's row: the first to create the claim file does."""
    try:
        (shared / "report").open("x").close()
        return True
    except FileExistsError:
        return False


def _first_error(shared: Path) -> str:
    """The root cause among the ranks' errors: the earliest one (peers of a failed rank fail later,
    when their waits on it time out or its connections close)."""
    time.sleep(1.0)  # ranks failing together all get to write their errors
    errors = sorted(shared.glob("rank*.error"), key=lambda p: p.stat().st_mtime)
    if not errors:
        return "rank 0 failed"
    return f"rank {errors[0].stem.removeprefix('rank')} failed: {errors[0].read_text()}"


# ---------------------------------------------------------------- driver side

def job_parameters(cfg: DictConfig, world_size: int) -> dict[str, Any]:
    """This run's resource request, with the one check SLURM cannot make for us."""
    params = {k: OmegaConf.select(cfg, f"hydra.launcher.{k}") for k in PER_RUN_KEYS}
    nodes, per_node = params["nodes"], params["tasks_per_node"]
    if nodes * per_node != world_size:
        fix = (f"set hydra.launcher.tasks_per_node={world_size // nodes}" if world_size % nodes == 0 else
               f"world_size must divide evenly over the nodes: choose a multiple of {nodes} or other nodes")
        raise ConfigError(f"hydra.launcher.nodes ({nodes}) x tasks_per_node ({per_node}) must equal world_size "
                          f"({world_size}): one SLURM task per rank; {fix}")
    check_placement(cfg, params)
    return params


def check_placement(cfg: DictConfig, params: dict[str, Any]) -> None:
    """Refuse jobs whose ranks would land where the resolved run cannot work.

    The run is resolved here, on the submitting machine: `device=auto` and the collective
    engine's `engine.backend=auto` follow this machine's CUDA. GPUs requested from a machine
    that sees none would reach the nodes as a CPU run; and CPU shared memory (ODC's heap, the
    collective engine's shm group) cannot span nodes.
    """
    if params.get("gpus_per_node") and not torch.cuda.is_available():
        raise ConfigError("hydra.launcher.gpus_per_node asks for GPUs, but runs are resolved on this machine, which "
                          "sees no CUDA device; submit from a node that sees the GPUs")
    if params["nodes"] > 1 and run_device_type(cfg) == "cpu":
        if cfg.engine.name != "collective":
            raise ConfigError(f"engine={cfg.engine.name} on CPU keeps its symmetric heap in shared memory, which "
                              f"cannot span hydra.launcher.nodes={params['nodes']}; set hydra.launcher.nodes=1")
        if collective_backend(cfg.engine.get("backend", "auto"), "cpu") == "shm":
            raise ConfigError(f"engine.backend=shm (the CPU default) runs FSDP2 over shared memory, which cannot span "
                              f"hydra.launcher.nodes={params['nodes']}; set engine.backend=gloo or "
                              f"hydra.launcher.nodes=1")


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
        from odc_bench.app import fail_config  # the app imports this module

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
                spec = resolve(job_cfg)
                check_results_dir(Path(job_cfg.results_dir))
                params = job_parameters(cfg, spec.world_size)
            except ConfigError as e:
                fail_config(e)
            table = Path(job_cfg.results_dir) / "runs.csv"
            idx = initial_job_idx + i
            if spec.run_id in queued or spec.run_id in completed_keys(table):
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
                if bar is not None:
                    bar.run_finished(progress.outcome_of(returns[i]))
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
