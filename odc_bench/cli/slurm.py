"""SLURM through submitit, the driver side (`hydra/launcher=slurm`): one job per run, one task
per rank (odc_bench/run/slurm_task.py runs inside each task).

hydra-submitit-launcher's launcher, changed in three ways. Each run is checked (ConfigError:
exit 2, nothing submitted) and sized on its own, so a sweep over world_size asks for the right
number of tasks per job; runs already `ok` in the results table are skipped before anything is
queued; and the driver waits for the jobs while feeding the progress display, noticing a job
that left the queue without a result even on clusters without accounting (no sacct).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit
from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher import submitit_launcher
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf, SlurmQueueConf
from omegaconf import DictConfig, OmegaConf, open_dict
from submitit.core.utils import FailedJobError, JobPaths

from odc_bench.app import Job
from odc_bench.cli import submissions
from odc_bench.cli.outcomes import measurements, outcome_of
from odc_bench.cli.slurm_logs import read_why_it_ended
from odc_bench.config.fields import require
from odc_bench.config.run import load
from odc_bench.data.real import write_pending_caches
from odc_bench.errors import ConfigError, fail
from odc_bench.files import folder_problem, interrupts_deferred, interrupts_live
from odc_bench.jobs import progress
from odc_bench.jobs.train import uses_mpi
from odc_bench.plan.spec import Planner, RunSpec
from odc_bench.results.table import check_results_dir, ok_runs


@dataclass
class QueueConf(SlurmQueueConf):
    """hydra-submitit-launcher's SLURM settings (`hydra.launcher.*`) and this launcher's own."""

    _target_: str = "hydra_plugins.odc_bench_plugins.SlurmLauncher"
    # Ctrl-C (or SIGTERM) of the submitting command: cancel the jobs it submitted, or leave them.
    on_interrupt: str = "cancel"


# The base of conf/hydra/launcher/slurm.yaml, which sets the defaults.
ConfigStore.instance().store(group="hydra/launcher", name="odc_slurm", node=QueueConf(), provider="odc_bench")

# Launcher keys a sweep may vary per run (through interpolation, e.g. tasks_per_node: ${world_size});
# the others are read once for the whole sweep, as hydra-submitit-launcher does.
PER_RUN_KEYS = ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "mem_gb", "timeout_min", "partition")
POLL_S = 1.0
# A job gone from squeue whose result files are still missing after this long has died.
GONE_GRACE_S = 15.0
# A job still pending this long after submission gets a line saying why it waits.
PENDING_NOTE_S = 10.0
# srun's plugin that hands MPICH (engine.transport=mpi) its ranks: PMI-2, which the mpich wheel speaks.
SRUN_MPI = "pmi2"


def job_parameters(cfg: DictConfig, spec: RunSpec) -> dict[str, Any]:
    """This run's resource request (cfg: the job's config with its `hydra` section), with the
    checks SLURM cannot make for us."""
    world_size = spec.world_size
    params = {k: OmegaConf.select(cfg, f"hydra.launcher.{k}") for k in PER_RUN_KEYS}
    check_time_limit(cfg, params["timeout_min"])
    check_submitit_folder(cfg)
    if spec.config.simulated:
        # The simulator is one process whatever world_size it models: one task, no GPU. With a
        # task per rank, each simulated the run and wrote its row (or found the other's and
        # reported the run skipped), and a paper-scale world asked SLURM for that many tasks.
        return {**params, "nodes": 1, "tasks_per_node": 1, "gpus_per_node": None}
    if spec.config.task == "primitives":
        # The benchmark starts its ranks itself, on one host (run_ranks, or mpiexec for mpi), as
        # on a workstation: one task with a core per rank (cpus_per_task per rank when set). A
        # task per rank had every task run the whole benchmark, at once, each writing its rows.
        return {**params, "nodes": 1, "tasks_per_node": 1, "cpus_per_task": (params["cpus_per_task"] or 1) * world_size}
    nodes, per_node = params["nodes"], params["tasks_per_node"]
    for key, value in (("nodes", nodes), ("tasks_per_node", per_node)):
        require(isinstance(value, int) and value >= 1, f"hydra.launcher.{key} must be a whole number, at least 1, "
                                                        f"got {value}")
    if nodes * per_node != world_size:
        fix = (f"set hydra.launcher.tasks_per_node={world_size // nodes}" if world_size % nodes == 0 else
               f"world_size must divide evenly over the nodes: choose a multiple of {nodes} or other nodes")
        raise ConfigError(f"hydra.launcher.nodes ({nodes}) x tasks_per_node ({per_node}) must equal world_size "
                          f"({world_size}): one SLURM task per rank; {fix}")
    check_placement(spec, params)
    on_interrupt = OmegaConf.select(cfg, "hydra.launcher.on_interrupt")
    require(on_interrupt in ("cancel", "leave"),
            f"hydra.launcher.on_interrupt must be cancel or leave, got {on_interrupt!r}")
    if uses_mpi(spec):
        check_srun_mpi()
        params["srun_args"] = [f"--mpi={SRUN_MPI}"]  # submitit's slurm_srun_args: the tasks' MPI bootstrap
    return params


def check_time_limit(cfg: DictConfig, timeout_min: Any) -> None:
    """A time limit inside SLURM's warning window signals the job as soon as it starts, and
    submitit answers the signal at once: it requeues the job, max_num_timeout times over, and
    after the last (at once with max_num_timeout=0) ends the run, before it has trained at all."""
    require(timeout_min is None or timeout_min >= 0, f"hydra.launcher.timeout_min, each run's time limit in "
            f"minutes, cannot be negative (0: no limit, as sbatch --time=0), got {timeout_min}")
    signal_s = OmegaConf.select(cfg, "hydra.launcher.signal_delay_s")
    if not (timeout_min and signal_s) or timeout_min * 60 > signal_s:
        return
    requeues = OmegaConf.select(cfg, "hydra.launcher.max_num_timeout")
    raise ConfigError(f"hydra.launcher.timeout_min={timeout_min} ends the job within SLURM's time-limit warning "
                      f"(hydra.launcher.signal_delay_s={signal_s} s before the end), which comes as the job starts: "
                      f"submitit would requeue it {requeues} times (max_num_timeout), then end the run, before it "
                      f"trains; set timeout_min above {signal_s / 60:g}, or signal_delay_s below {timeout_min * 60}")


def check_submitit_folder(cfg: DictConfig) -> None:
    """The folder submitit writes each job's script, logs and results under (up to its first
    %-pattern, which SLURM fills in) can be made and written: submitit failed in a traceback."""
    given = str(OmegaConf.select(cfg, "hydra.launcher.submitit_folder") or "")
    prefix = given.split("%", 1)[0]
    base = Path(prefix if "%" not in given or prefix.endswith("/") else Path(prefix).parent).absolute()
    if given and (problem := folder_problem(base)) is not None:
        raise ConfigError(f"hydra.launcher.submitit_folder={given}: {base} {problem[0]}; set it to {problem[1]} "
                          f"(one every node shares)")


def check_slurm_available() -> None:
    """ConfigError when this machine cannot submit SLURM jobs (no sbatch on PATH)."""
    require(shutil.which("sbatch") is not None and shutil.which("squeue") is not None,
            "hydra/launcher=slurm needs SLURM's sbatch and squeue on PATH, and this machine has none; submit from a "
            "SLURM login node, or leave out hydra/launcher=slurm to run on this machine")


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


def gpus_requested(cfg: DictConfig) -> bool:
    """Whether the job asks SLURM for GPUs (hydra.launcher.gpus_per_node): its runs are then
    resolved for CUDA, whatever this machine has (plan/spec.py resolve's remote_cuda)."""
    return bool(OmegaConf.select(cfg, "hydra.launcher.gpus_per_node", default=None))


def check_placement(spec: RunSpec, params: dict[str, Any]) -> None:
    """Refuse jobs whose ranks would land where the resolved run cannot work.

    The run is resolved here, on the submitting machine, for the devices the job asks for (CUDA
    when it asks for GPUs, even from a login node that has none). Memory that one host shares
    (ODC's shared-memory heap, the collective engine's shm group) cannot span nodes.
    """
    bound = spec.config.engine.options.host_bound()
    if params["nodes"] > 1 and bound is not None:
        what, fix = bound
        raise ConfigError(f"{what}, which cannot span hydra.launcher.nodes={params['nodes']}; {fix}")
    # The run is resolved before SLURM places its tasks, so the nodes the engines shard within
    # are the config's: it must say what the job asks for.
    options = spec.config.engine.options
    if options.shard == "hybrid" and params["nodes"] > 1 and options.ranks_per_node != params["tasks_per_node"]:
        have = "is unset" if options.ranks_per_node is None else f"is {options.ranks_per_node}"
        per_node = params["tasks_per_node"]
        raise ConfigError(f"engine.shard=hybrid shards within a node: this job's nodes have "
                          f"hydra.launcher.tasks_per_node={per_node} ranks each, and engine.ranks_per_node {have}; set "
                          f"engine.ranks_per_node={per_node}")


def _queue_states(job_ids: Sequence[str]) -> dict[str, str] | None:
    """SLURM's state of each queued job (array tasks one by one); None when squeue cannot answer."""
    queue = _queue(job_ids)
    return None if queue is None else {job: fields[0] for job, fields in queue.items()}


def _queue(job_ids: Sequence[str]) -> dict[str, list[str]] | None:
    """Per queued job: its state, why it waits, its partition and nodes (squeue's %T %r %P %D)."""
    raw = sorted({j.split("_")[0] for j in job_ids})
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T|%r|%P|%D", "-j", ",".join(raw)],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 and "Invalid job id" not in out.stderr:
        return None
    return {fields[0]: fields[1:] for line in out.stdout.splitlines() if len(fields := line.split("|")) == 5}


def _partition_nodes(partition: str) -> int | None:
    """How many nodes the partition has (sinfo), or None when sinfo cannot say."""
    try:
        out = subprocess.run(["sinfo", "-h", "-p", partition, "-o", "%D"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    counts = [int(n) for n in out.stdout.split() if n.isdigit()]
    return sum(counts) if out.returncode == 0 and counts else None


def pending_reason(reason: str, partition: str, nodes: str) -> str:
    """Why a job waits, in a user's words where SLURM's reason code is about its size."""
    if reason in ("PartitionNodeLimit", "Resources", "ReqNodeNotAvail", "PartitionConfig", "BadConstraints"):
        have = _partition_nodes(partition)
        if reason == "PartitionConfig" and have and nodes.isdigit() and int(nodes) <= have:
            # Not the node count, then: SLURM queues a job asking a node for more than the
            # partition's nodes have, and it never starts (cpus_per_task=64 on 2-CPU nodes).
            return (f"it asks for more than partition {partition} offers, so SLURM will not start it: compare "
                    f"hydra.launcher.cpus_per_task x tasks_per_node, mem_gb, gpus_per_node and timeout_min with "
                    f"sinfo -p {partition} -o '%D %c %m %G %l' (SLURM: {reason})")
        size = f"needs {nodes} node{'s' * (nodes != '1')}" + (f", partition {partition} has {have}" if have else "")
        return f"{size} (SLURM: {reason})"
    return f"SLURM: {reason}"


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
                                      if k not in {"submitit_folder", "max_num_timeout", "on_interrupt"}})
        return executor

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        with interrupts_live():  # Ctrl-C cancels what was submitted (cli/__init__.py holds it in Hydra's code)
            return self._launch(job_overrides, initial_job_idx)

    def _launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        bar = progress.current()
        returns: list[JobReturn | None] = [None] * len(job_overrides)
        groups: dict[str, tuple[dict[str, Any], list[tuple[int, tuple]]]] = {}
        queued: set[str] = set()
        runs: dict[int, tuple[str, Path]] = {}  # job index -> run key, results folder
        earlier = _Earlier()
        # The sweep planned every job with the command's planner (sweeper._runnable): planned
        # again with it, a job is read back rather than planned twice.
        planner = self.task_function.planner if isinstance(self.task_function, Job) else Planner()
        for i, overrides in enumerate(job_overrides):
            with interrupts_deferred():  # OmegaConf interrupted mid-merge (cli/__init__.py)
                cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            job_cfg = copy.deepcopy(cfg)
            with open_dict(job_cfg):
                del job_cfg["hydra"]
            try:
                spec = planner.resolve(load(job_cfg), remote_cuda=gpus_requested(cfg))
                results_dir = Path(spec.config.results_dir)  # as the run has it (~ expanded)
                check_results_dir(results_dir)
                params = job_parameters(cfg, spec)
            except ConfigError as e:
                fail(e)
            idx = initial_job_idx + i
            done = ok_runs(results_dir / "runs.csv").get(spec.run_id, 0) >= spec.config.repeat
            if done:
                earlier.finished(results_dir, spec.run_id)
            skip = ("queued by an earlier job of this sweep" if spec.run_id in queued else
                    f"already in {results_dir / 'runs.csv'}" if done else earlier.queued(results_dir, spec.run_id))
            if skip:
                print(f"odc_bench: run {spec.run_id} (#{idx}) {skip}; skipped")
                returns[i] = _job_return(overrides, JobStatus.COMPLETED, None)
                if bar is not None:
                    bar.run_finished("skipped")
                continue
            queued.add(spec.run_id)
            runs[i] = (spec.run_id, results_dir)
            args = (list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state())
            groups.setdefault(json.dumps(params, sort_keys=True), (params, []))[1].append((i, args))
        earlier.forget_gone()
        write_pending_caches()  # every run is accepted: the ranks on the nodes find the lengths cached
        submitted: dict[int, tuple[submitit.Job, int]] = {}
        # array_parallelism=1 runs a sweep's jobs one after another: within a job array SLURM keeps
        # them apart (%1), and arrays of different resources are submitted one after the other.
        one_at_a_time = int(self.params.get("array_parallelism") or 0) == 1
        try:
            for params, items in groups.values():
                # submitit prints a refused sbatch's stderr itself; the refusal's one line says it instead
                with contextlib.redirect_stderr(io.StringIO()):
                    jobs = self._executor(params).map_array(self, *zip(*(args for _, args in items), strict=True))
                tasks = params["nodes"] * params["tasks_per_node"]
                submitted.update({i: (job, tasks) for (i, _), job in zip(items, jobs, strict=True)})
                self._remember(runs, submitted, items, job_overrides)
                for i, _ in items:
                    job = submitted[i][0]
                    label = " ".join(filter_overrides(job_overrides[i])) or "default job"
                    print(f"odc_bench: #{initial_job_idx + i} submitted as SLURM job {job.job_id}: {label}; "
                          f"logs in {job.paths.folder}")
                if one_at_a_time:  # the next group only once this one is done: runs never share nodes
                    self._wait({i: submitted[i] for i, _ in items}, runs, job_overrides, returns, bar,
                               initial_job_idx)
            self._wait({i: s for i, s in submitted.items() if returns[i] is None}, runs, job_overrides, returns, bar,
                       initial_job_idx)
        except FailedJobError as e:  # sbatch refused a job: none of the sweep may stay
            waiting = {i: job for i, (job, _) in submitted.items() if returns[i] is None}
            cancelled = self._cancel(waiting, runs)
            said = " ".join(str(e).strip().splitlines()[-1:]) or "no reason given"
            also = (f"; cancelled the {len(waiting)} job(s) this command had submitted" if cancelled and waiting else
                    f"; cancel the jobs it had submitted: scancel {' '.join(j.job_id for j in waiting.values())}"
                    if waiting else "")
            fail(ConfigError(f"SLURM refused a job of this sweep ({said}); check hydra.launcher.gpus_per_node, "
                             f"partition, nodes and mem_gb against what the cluster offers (sinfo -o '%P %D %G %m')"
                             f"{also}"))
        except BaseException as e:  # Ctrl-C, SIGTERM, or an error of the driver: the jobs must not be forgotten
            said = self._interrupted({i: job for i, (job, _) in submitted.items() if returns[i] is None}, runs)
            if isinstance(e, KeyboardInterrupt) and said:
                raise KeyboardInterrupt(said) from None  # the command's one line says it (cli.interrupted)
            if said:
                print(f"odc_bench: interrupted; {said}", file=sys.stderr)
            raise
        return returns  # type: ignore[return-value]

    @staticmethod
    def _remember(runs: dict[int, tuple[str, Path]], submitted: dict[int, tuple[submitit.Job, int]],
                  items: Sequence[tuple[int, tuple]], job_overrides: Sequence[Sequence[str]]) -> None:
        """Record the jobs just submitted in their results folders (cli/submissions.py)."""
        by_dir: dict[Path, dict[str, dict[str, Any]]] = {}
        for i, _ in items:
            job = submitted[i][0]
            run_id, results_dir = runs[i]
            by_dir.setdefault(results_dir, {})[run_id] = submissions.record(job.job_id, job.paths.folder,
                                                                            job_overrides[i])
        for results_dir, add in by_dir.items():
            submissions.update(results_dir, add=add)

    def _interrupted(self, pending: dict[int, submitit.Job], runs: dict[int, tuple[str, Path]]) -> str:
        """Cancel the jobs still queued or running (hydra.launcher.on_interrupt=cancel), or say how
        to; what was done, in words ("" when no job was under way)."""
        if not pending:
            return ""
        ids = [job.job_id for job in pending.values()]
        if self.params.get("on_interrupt", "cancel") != "cancel":
            return (f"{len(ids)} SLURM job(s) left queued or running (hydra.launcher.on_interrupt="
                    f"{self.params['on_interrupt']}): their rows land in the results folder when they finish, and the "
                    f"same command run again skips them while they are queued or running; cancel them with: "
                    f"scancel {' '.join(ids)}")
        if not self._cancel(pending, runs):
            return f"cancelling the SLURM jobs failed; cancel them with: scancel {' '.join(ids)}"
        return f"cancelled SLURM job(s) {' '.join(ids)}"

    @staticmethod
    def _cancel(pending: dict[int, submitit.Job], runs: dict[int, tuple[str, Path]]) -> bool:
        """scancel these jobs and forget them in their results folders; False when scancel failed."""
        if not pending:
            return True
        try:
            done = subprocess.run(["scancel", *(job.job_id for job in pending.values())], capture_output=True,
                                  text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return False
        if done.returncode != 0:
            return False
        for results_dir in {runs[i][1] for i in pending}:
            submissions.update(results_dir, remove=[runs[i][0] for i in pending if runs[i][1] == results_dir])
        return True

    def _wait(self, submitted: dict[int, tuple[submitit.Job, int]], runs: dict[int, tuple[str, Path]],
              job_overrides: Sequence[Sequence[str]], returns: list[JobReturn | None],
              bar: progress.SweepProgress | None, first_idx: int) -> None:
        """Wait for the jobs through their result files and squeue, never sacct (clusters without
        accounting have none), printing each run's result as it comes.

        A job is done when every task's result file is there; one that left the queue without
        them and whose files do not appear within GONE_GRACE_S died (killed, out of memory, time limit).
        """
        pending = dict(submitted)
        left_queue: dict[int, float] = {}
        since = time.monotonic()
        told: set[int] = set()
        while pending:
            queue = _queue([job.job_id for job, _ in pending.values()])
            states = None if queue is None else {job: fields[0] for job, fields in queue.items()}
            if queue is not None and time.monotonic() - since > PENDING_NOTE_S:
                for i, (job, _) in pending.items():  # still waiting to start: say why, once
                    state, reason, partition, nodes = queue.get(job.job_id, ["", "", "", ""])
                    if i not in told and state == "PENDING" and reason not in ("None", "Priority", ""):
                        told.add(i)
                        print(f"odc_bench: #{first_idx + i} SLURM job {job.job_id} pending: "
                              f"{pending_reason(reason, partition, nodes)}", file=sys.stderr)
            for i, (job, tasks) in list(pending.items()):
                results = [JobPaths(self.params["submitit_folder"], job.job_id, t).result_pickle for t in range(tasks)]
                if all(p.exists() for p in results):  # every task has returned, the job may still be ending
                    returns[i] = self._result(job, job_overrides[i])
                elif states is None or job.job_id in states:
                    continue
                elif time.monotonic() - left_queue.setdefault(i, time.monotonic()) > GONE_GRACE_S:
                    why = read_why_it_ended(job.paths.stderr)
                    error = RuntimeError(f"SLURM job {job.job_id} left the queue without a result"
                                         f"{': ' + why if why else ''}; see {job.paths.stderr}")
                    returns[i] = _job_return(job_overrides[i], JobStatus.FAILED, error)
                else:
                    continue
                del pending[i]
                done = returns[i]
                assert done is not None
                submissions.update(runs[i][1], remove=[runs[i][0]])
                print(f"odc_bench: #{first_idx + i} SLURM job {job.job_id} {describe(done)}",
                      file=sys.stdout if outcome_of(done) != "failed" else sys.stderr)
                if bar is not None:
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
            return _job_return(overrides, JobStatus.FAILED,
                               RuntimeError(f"SLURM job {job.job_id} failed: {str(e).strip().splitlines()[-1]}"))


def describe(job_return: JobReturn) -> str:
    """A finished job's result in a few words: its throughput, or its error."""
    if job_return.status != JobStatus.COMPLETED:
        return f"failed: {job_return._return_value}"
    rows = job_return.return_value
    rows = [rows] if isinstance(rows, dict) else rows or []
    if not rows:
        return "skipped (already in the results table)"
    if measurements(rows):
        return f"ok: {len(rows)} measurements in primitives.csv"
    return "; ".join(f"ok: {r['samples_per_s']:.4g} samples/s, {r['tokens_per_s']:.4g} tokens/s, bubble "
                     f"{r['bubble_rate']:.0%}" if r.get("status") == "ok" else f"failed: {r.get('error')}"
                     for r in rows)


class _Earlier:
    """Runs that earlier commands submitted to SLURM and that are still queued or running."""

    def __init__(self) -> None:
        self.records: dict[Path, dict[str, dict[str, Any]]] = {}
        self.gone: dict[Path, list[str]] = {}
        self.states: dict[str, str] | None = None

    def _records(self, results_dir: Path) -> dict[str, dict[str, Any]]:
        if results_dir not in self.records:
            self.records[results_dir] = submissions.read(results_dir)
            self.states = None
        return self.records[results_dir]

    def finished(self, results_dir: Path, run_id: str) -> None:
        """The run's rows are all in its table: a record of its job is history."""
        if run_id in self._records(results_dir):
            self.gone.setdefault(results_dir, []).append(run_id)

    def queued(self, results_dir: Path, run_id: str) -> str:
        """Why the run must not be submitted again ('' when nothing says so)."""
        record = self._records(results_dir).get(run_id)
        if record is None:
            return ""
        if self.states is None:
            ids = [r["job_id"] for recs in self.records.values() for r in recs.values()]
            self.states = _queue_states(ids) if ids else {}
        state = (self.states or {}).get(str(record["job_id"]))
        if state is None:  # finished or died since: its row is in the table or it runs again
            if self.states is not None:
                self.gone.setdefault(results_dir, []).append(run_id)
            return ""
        return (f"already {state.lower()} as SLURM job {record['job_id']} (submitted {record['submitted']}; logs in "
                f"{record['logs']}); its row lands in the results folder when it ends (scancel {record['job_id']} "
                f"to cancel it)")

    def forget_gone(self) -> None:
        for results_dir, run_ids in self.gone.items():
            submissions.update(results_dir, remove=run_ids)
