"""The smoke sweep through a real SLURM cluster (submitit): one job per run, one task per rank.

CI (.ci/run) starts a one-node cluster on localhost first (.ci/slurm/start.sh); elsewhere the
test needs `sbatch` on PATH and a cluster it talks to, and skips without one.
"""

import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from odc_bench.cli import submissions
from odc_bench.results.table import read_table
from tests.helpers import REPO, run_cli
from tests.helpers.mpi import requires_mpi

if shutil.which("sbatch") is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI=true but sbatch is missing: .ci/run must start SLURM (.ci/slurm/start.sh)")
    pytest.skip("no sbatch on PATH: start a cluster with .ci/slurm/start.sh (as root) to run the SLURM test",
                allow_module_level=True)


@pytest.mark.slow
@pytest.mark.slurm
def test_smoke_sweep_on_slurm_records_its_rows_and_resumes(tmp_path):
    results_dir, sweep_dir = tmp_path / "results", tmp_path / "multirun"
    args = ["sweep=smoke", "hydra/launcher=slurm", f"results_dir={results_dir}", f"hydra.sweep.dir={sweep_dir}"]
    first = run_cli(*args, timeout=420)
    assert first.returncode == 0, first.stderr[-3000:]

    rows = read_table(results_dir / "runs.csv")
    assert len(rows) == 3 and rows["run_id"].is_unique
    assert (rows["status"] == "ok").all(), rows["error"].tolist()
    assert sorted(rows["minibatch_size"]) == [1, 2, 4] and set(rows["world_size"]) == {2}
    for trace in rows["trace"]:
        ranks = set(read_table(results_dir / trace)["rank"])
        assert ranks == {0, 1}, "rank 0 gathered every rank's trace"

    # One SLURM job per run, its two ranks as two tasks: each job folder holds one result per task.
    job_dirs = [d for d in (sweep_dir / ".submitit").iterdir() if list(d.glob("*_result.pkl"))]
    assert len(job_dirs) == 3
    for d in job_dirs:
        assert len(list(d.glob("*_result.pkl"))) == 2, f"{d.name}: expected one result per task (rank)"
        assert not list(d.glob("ranks.*")), "rank 0 removes the ranks' exchange folder"

    # Job ids and log folders as the jobs are submitted, each result as it comes, then the summary.
    submitted_lines = [ln for ln in first.stdout.splitlines() if " submitted as SLURM job " in ln]
    assert len(submitted_lines) == 3 and all("logs in " + str(sweep_dir / ".submitit") in ln for ln in submitted_lines)
    results = [ln for ln in first.stdout.splitlines() if re.match(r"odc_bench: #\d SLURM job \S+ ok: ", ln)]
    assert len(results) == 3 and all("samples/s" in ln for ln in results)
    assert "odc_bench: sweep of 3 runs: 3 ok, 0 failed" in first.stdout
    assert not (results_dir / "slurm_jobs.json").exists(), "finished jobs are no longer recorded as under way"

    submitted = set((sweep_dir / ".submitit").iterdir())
    again = run_cli(*args, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("already in ") == 3, "a re-run skips the runs already in the table"
    assert "sweep of 3 runs: 0 ok, 0 failed, 3 already done or under way (skipped)" in again.stdout
    assert set((sweep_dir / ".submitit").iterdir()) == submitted, "and submits no job"
    assert len(read_table(results_dir / "runs.csv")) == 3


@pytest.mark.slow
@pytest.mark.slurm
def test_a_run_failing_on_slurm_is_a_failed_row_naming_the_rank(tmp_path):
    results_dir = tmp_path / "results"
    # AdamW fails to build in every process of the job: the config passed, every rank fails.
    failing = str(REPO / "tests" / "helpers" / "failing_optimizer")
    proc = run_cli("sweep=smoke", "minibatch_size=1", "hydra/launcher=slurm", f"results_dir={results_dir}",
                   f"hydra.sweep.dir={tmp_path / 'multirun'}", timeout=300,
                   env={"PYTHONPATH": os.pathsep.join(filter(None, [failing, os.environ.get("PYTHONPATH")]))})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "odc_bench: sweep of 1 run: 0 ok, 1 failed" in proc.stdout
    assert re.search(r"odc_bench: #0 SLURM job \S+ failed: rank \d failed: .*Invalid learning rate", proc.stderr)
    rows = read_table(results_dir / "runs.csv")
    assert list(rows["status"]) == ["failed"]
    assert "rank " in rows["error"][0] and "Invalid learning rate" in rows["error"][0], rows["error"][0]


# Two tiny runs whose jobs wait in their set-up, so that they are still queued or running
# when the driver is interrupted.
WAITING = ["-m", "minibatch_size=1,2", "model=tiny", "num_minibatches=2", "warmup_minibatches=0",
           "dataset.length_scale=0.00390625", "hydra/launcher=slurm"]


def _start(tmp_path: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="0")
    # The driver as a terminal starts it: with SIGINT at its default even where this test runs
    # in the background (a non-interactive shell's `&` ignores SIGINT, and children inherit that).
    return subprocess.Popen([sys.executable, "-m", "odc_bench", *WAITING, *extra,
                             f"results_dir={tmp_path / 'results'}", f"hydra.sweep.dir={tmp_path / 'multirun'}"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _submitted_ids(proc: subprocess.Popen, count: int, timeout_s: float = 120) -> list[str]:
    """The job ids the driver prints as it submits, once all `count` are out."""
    assert proc.stdout is not None
    ids: list[str] = []
    deadline = time.monotonic() + timeout_s
    while len(ids) < count:
        assert time.monotonic() < deadline, f"the driver did not submit {count} jobs in {timeout_s:.0f}s"
        line = proc.stdout.readline()
        assert line, f"the driver ended before submitting: {proc.stderr.read() if proc.stderr else ''}"
        found = re.search(r" submitted as SLURM job (\S+): ", line)
        if found:
            ids.append(found.group(1))
    return ids


def _queued(ids: list[str]) -> dict[str, str]:
    """The state of each job still in SLURM's queue (array tasks one by one)."""
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T", "-j", ",".join(ids)], capture_output=True, text=True)
    return dict(line.split("|", 1) for line in out.stdout.split() if "|" in line)


def _array_states(ids: list[str]) -> set[str]:
    """Every state SLURM records for the job arrays of these jobs (it keeps finished ones for
    MinJobAge, 300 s here; a cancelled task that never started is folded into its array's record)."""
    states: set[str] = set()
    for array in {job_id.split("_")[0] for job_id in ids}:
        text = subprocess.run(["scontrol", "show", "job", array], capture_output=True, text=True).stdout
        states |= set(re.findall(r"JobState=(\S+)", text))
    return states


def _interrupt(proc: subprocess.Popen) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


@pytest.mark.slow
@pytest.mark.slurm
def test_ctrl_c_cancels_the_jobs_this_command_submitted(tmp_path):
    proc = _start(tmp_path, "hydra.launcher.setup=[\"sleep 120\"]")
    ids = []
    try:
        ids = _submitted_ids(proc, 2)
        assert len(submissions.read(tmp_path / "results")) == 2, "the submissions are recorded in the results folder"
        status, _, err = _interrupt(proc)
        assert status == 130, err
        assert f"cancelled SLURM job(s) {' '.join(ids)}" in err and "Traceback" not in err, err
        deadline = time.monotonic() + 60
        while _queued(ids) and time.monotonic() < deadline:
            time.sleep(1)
        assert not _queued(ids) and _array_states(ids) == {"CANCELLED"}, (_queued(ids), _array_states(ids))
        assert submissions.read(tmp_path / "results") == {}, "cancelled jobs are no longer recorded"
        assert not (tmp_path / "results" / "runs.csv").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True)


@pytest.mark.slow
@pytest.mark.slurm
def test_interrupted_and_left_running_a_resumed_sweep_submits_no_run_twice(tmp_path):
    first = _start(tmp_path, "hydra.launcher.on_interrupt=leave", "hydra.launcher.setup=[\"sleep 20\"]")
    ids = []
    try:
        ids = _submitted_ids(first, 2)
        status, _, err = _interrupt(first)
        assert status == 130 and f"cancel them with: scancel {' '.join(ids)}" in err, err
        assert set(_queued(ids)) == set(ids), "left queued or running"

        again = run_cli(*WAITING, "hydra.launcher.on_interrupt=leave", "hydra.launcher.setup=[\"sleep 20\"]",
                        f"results_dir={tmp_path / 'results'}", f"hydra.sweep.dir={tmp_path / 'multirun2'}",
                        timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        assert " submitted as SLURM job " not in again.stdout, "nothing submitted twice"
        for job_id in ids:
            assert re.search(rf"already (pending|running|configuring) as SLURM job {job_id} ", again.stdout), \
                again.stdout
        assert "sweep of 2 runs: 0 ok, 0 failed, 2 already done or under way (skipped)" in again.stdout

        deadline = time.monotonic() + 240  # the jobs left running finish and write their rows
        table = tmp_path / "results" / "runs.csv"
        while (not table.exists() or len(read_table(table)) < 2) and time.monotonic() < deadline:
            time.sleep(2)
        rows = read_table(table)
        assert len(rows) == 2 and rows["run_id"].is_unique and (rows["status"] == "ok").all(), rows
        third = run_cli(*WAITING, f"results_dir={tmp_path / 'results'}", f"hydra.sweep.dir={tmp_path / 'multirun3'}",
                        timeout=300)
        assert third.returncode == 0 and third.stdout.count("already in ") == 2, third.stdout
        assert submissions.read(tmp_path / "results") == {}, "the finished jobs' records are gone"
    finally:
        if first.poll() is None:
            first.kill()
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True)


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.mpi
@requires_mpi
def test_an_odc_run_on_the_mpi_transport_runs_as_srun_bootstrapped_mpi_tasks(tmp_path):
    """CI's cluster has one node, so the two tasks share it; MPI stays off shared memory
    (engine.mpi_network_only) so they talk as tasks on two nodes would. The same command with
    hydra.launcher.nodes=2 hydra.launcher.tasks_per_node=1 spans nodes (docs/transport.md)."""
    results_dir, sweep_dir = tmp_path / "results", tmp_path / "multirun"
    proc = run_cli("-m", "hydra/launcher=slurm", "engine=odc", "engine.transport=mpi", "engine.mpi_network_only=true",
                   "num_minibatches=3", "warmup_minibatches=1", "dataset.length_scale=0.00390625",
                   f"results_dir={results_dir}", f"hydra.sweep.dir={sweep_dir}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_table(results_dir / "runs.csv")
    assert list(rows["status"]) == ["ok"], rows["error"].tolist()
    assert set(read_table(results_dir / rows["trace"][0])["rank"]) == {0, 1}
    (job_dir,) = [d for d in (sweep_dir / ".submitit").iterdir() if list(d.glob("*_result.pkl"))]
    assert len(list(job_dir.glob("*_result.pkl"))) == 2, "one task per rank"
    (script,) = job_dir.glob("*_submission.sh")
    assert "--mpi=pmi2" in script.read_text(), "srun's PMI bootstraps MPICH in the tasks"


@pytest.mark.slurm
def test_a_gpu_request_from_a_host_without_gpus_reaches_slurm_and_a_refusal_is_one_line(tmp_path):
    # This host (like a login node) sees no GPU: the run is resolved for the job's CUDA devices and
    # submitted; CI's node has no GPUs (no gres), so sbatch refuses it, in one line, leaving no job.
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    proc = run_cli("-m", "hydra/launcher=slurm", "hydra.launcher.gpus_per_node=2", "num_minibatches=3",
                   f"results_dir={tmp_path / 'results'}", f"hydra.sweep.dir={tmp_path / 'multirun'}", timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("odc_bench: error: SLURM refused a job of this sweep (sbatch: error: ")
    assert "sees no CUDA" not in proc.stderr, "the submitting host's own devices are not checked"
    after = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    assert set(after) <= set(before), "nothing queued"
    assert not (tmp_path / "results").exists(), "no row, no record of a job"


@pytest.mark.slow
@pytest.mark.slurm
def test_a_simulated_run_is_one_task_without_gpus_whatever_world_it_models(tmp_path):
    """The simulator is one process: a task per modelled rank had each task simulate the run (one
    wrote the row, the job's result said "skipped"), and 64 ranks or a GPU request asked this
    one-node cluster for what it has not."""
    sweep = tmp_path / "multirun"
    proc = run_cli("-m", "hydra/launcher=slurm", "backend=sim", "world_size=64", "hydra.launcher.gpus_per_node=8",
                   f"results_dir={tmp_path / 'results'}", f"hydra.sweep.dir={sweep}", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "odc_bench: sweep of 1 run: 1 ok, 0 failed" in proc.stdout, proc.stdout[-2000:]
    rows = read_table(tmp_path / "results" / "runs.csv")
    assert len(rows) == 1 and rows["status"].tolist() == ["ok"] and rows["world_size"].tolist() == [64]
    (script,) = sweep.glob(".submitit/*/*_submission.sh")
    assert "#SBATCH --ntasks-per-node=1\n" in script.read_text() and "gpu" not in script.read_text()
    assert len(list(sweep.glob(".submitit/*/*_result.pkl"))) == 1


@pytest.mark.slow
@pytest.mark.slurm
def test_the_primitives_benchmark_is_one_task_that_starts_its_ranks(tmp_path):
    """A task per rank had each task run the whole benchmark at once: twice the rows, each
    measured beside the other, and the job's line read "failed: None" once per row."""
    sweep, results = tmp_path / "multirun", tmp_path / "results"
    proc = run_cli("-m", "hydra/launcher=slurm", "task=primitives", "primitives.max_bytes=16384",
                   "primitives.turn_s=0.001", f"results_dir={results}", f"hydra.sweep.dir={sweep}", timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"SLURM job \S+ ok: 10 measurements in primitives\.csv\n", proc.stdout), proc.stdout[-2000:]
    assert "odc_bench: sweep of 1 run: 1 ok, 0 failed" in proc.stdout
    assert len(read_table(results / "primitives.csv")) == 2 * 5, "one row per size and op"
    (script,) = sweep.glob(".submitit/*/*_submission.sh")
    assert "#SBATCH --ntasks-per-node=1\n" in script.read_text() and "#SBATCH --cpus-per-task=2\n" in script.read_text()


@pytest.mark.slow
@pytest.mark.slurm
def test_a_job_that_cannot_start_says_why_and_ctrl_c_cancels_it(tmp_path):
    # Two nodes on CI's one-node cluster: SLURM keeps the job pending (PartitionNodeLimit).
    proc = _start(tmp_path, "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=1", "engine.backend=gloo",
                  "minibatch_size=1")
    ids = []
    try:
        ids = _submitted_ids(proc, 1)
        assert proc.stderr is not None
        line = proc.stderr.readline()  # the driver's next word on stderr: why the job waits
        assert line.startswith(f"odc_bench: #0 SLURM job {ids[0]} pending: needs 2 nodes, partition ") and \
            line.rstrip().endswith("has 1 (SLURM: PartitionNodeLimit)"), line
        status, _, err = _interrupt(proc)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert status == 130 and lines == [f"odc_bench: interrupted; cancelled SLURM job(s) {ids[0]} (finished runs' "
                                           f"rows are kept)"], err
    finally:
        if proc.poll() is None:
            proc.kill()
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True)


@pytest.mark.slow
@pytest.mark.slurm
def test_array_parallelism_one_runs_a_sweeps_jobs_one_after_another(tmp_path):
    # Two world sizes are two job arrays (other resources); with array_parallelism=1 the second is
    # submitted only once the first has its result, so timed runs never share the node.
    proc = run_cli("-m", "world_size=1,2", "model=tiny", "num_minibatches=2", "warmup_minibatches=0",
                   "dataset.length_scale=0.00390625", "hydra/launcher=slurm", "hydra.launcher.array_parallelism=1",
                   f"results_dir={tmp_path / 'results'}", f"hydra.sweep.dir={tmp_path / 'multirun'}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [("submitted" if " submitted as SLURM job " in ln else "done", ln.split()[1])
              for ln in proc.stdout.splitlines() if re.match(r"odc_bench: #\d (submitted|SLURM job)", ln)]
    assert events == [("submitted", "#0"), ("done", "#0"), ("submitted", "#1"), ("done", "#1")], proc.stdout
    scripts = list((tmp_path / "multirun" / ".submitit").rglob("*submission.sh"))
    assert scripts and all("%1" in s.read_text() for s in scripts if "#SBATCH --array" in s.read_text())


def _held_env(hold: Path) -> dict[str, str]:
    """The environment of a driver whose runs' ranks wait before each sample while `hold` exists
    (tests/helpers/held_run): the tests below hold a run still while SLURM acts on it, so a short
    run cannot end first however slowly squeue and scontrol answer under load."""
    path = os.pathsep.join(filter(None, [str(REPO / "tests" / "helpers" / "held_run"), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path, ODC_TEST_HOLD=str(hold))


def _job_held_once_it_checkpointed(results: Path, hold: Path, after: int = -1) -> str:
    """The SLURM job of the one run under way, held (`hold` created) once it has saved a
    checkpoint past step `after`."""
    deadline = time.monotonic() + 180
    while not list(results.glob("checkpoints/*/step-*[0-9]")) or _newest_step(results) <= after:
        assert time.monotonic() < deadline, "the run saved no checkpoint in 180 s"
        time.sleep(0.1)
    hold.touch()
    return subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()[0]


@pytest.mark.slow
@pytest.mark.slurm
def test_a_job_preempted_and_then_at_its_time_limit_resumes_each_time_and_writes_one_row(tmp_path):
    """Both ways SLURM ends a job early and starts it again. `scontrol requeue` of a running job is
    what a preemption with requeue does: SLURM kills its tasks. A job nearing its time limit is
    signalled (submitit's --signal=USR2@120), and submitit's hook requeues it. Each time the
    requeued job goes on from the run's newest checkpoint."""
    results, sweep, hold = tmp_path / "results", tmp_path / "multirun", tmp_path / "hold"
    proc = subprocess.Popen([sys.executable, "-m", "odc_bench", "-m", "hydra/launcher=slurm", "num_minibatches=20",
                             "checkpoint.every=2", "hydra.launcher.timeout_min=5", f"results_dir={results}",
                             f"hydra.sweep.dir={sweep}"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_held_env(hold))
    job_id = ""
    try:
        job_id = _job_held_once_it_checkpointed(results, hold)
        subprocess.run(["scontrol", "requeue", job_id], check=True)
        _requeued_then_started(job_id)
        hold.unlink()
        _job_held_once_it_checkpointed(results, hold, after=_newest_step(results))
        # A limit one to two minutes past the job's run time puts it inside its warning window
        # (120 s): slurmctld signals it at its next time-limit check (every 30 s), the held job still
        # running. A limit below the run time times the job out at that same check: SIGTERM then
        # killed submitit's `scontrol requeue` and the run failed (a loaded host, once).
        limit_min = math.ceil(_run_time_s(job_id) / 60) + 1
        subprocess.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={limit_min}"], check=True)
        _requeued_then_started(job_id, within_s=90)
        hold.unlink()
        out, err = proc.communicate(timeout=420)
    finally:
        if proc.poll() is None:
            proc.kill()
        if job_id:  # a failed check leaves no job behind (the killed launcher cannot cancel it)
            subprocess.run(["scancel", job_id], capture_output=True)
    assert proc.returncode == 0, err[-3000:]
    logs = "".join(p.read_text(errors="replace") for p in sweep.glob(f".submitit/{job_id}/*.err"))
    assert "Caught signal SIGUSR2 on vm: this job is timed-out" in logs.replace(os.uname().nodename, "vm"), logs[-3000:]
    rows = read_table(results / "runs.csv")
    assert len(rows) == 1 and rows["status"][0] == "ok", rows
    assert rows["requeues"][0] == 2 and rows["resumed_from"][0] >= 4, rows
    assert "sweep of 1 run: 1 ok, 0 failed, 2 requeues by SLURM, 1 resumed from a checkpoint" in out, out
    assert not list(results.glob("checkpoints/*/*")), "the recorded run's checkpoints are removed"
    # The killed attempts' ranks could not remove their shared memory; the next attempt did.
    assert not [name for name in os.listdir("/dev/shm") if name.startswith("odc-") and f"_{job_id}_" in name]


def _run_time_s(job_id: str) -> int:
    """How long the job's current attempt has run, in seconds (squeue's [days-][hours:]minutes:seconds)."""
    elapsed = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%M"], capture_output=True, text=True,
                             check=True).stdout.strip()
    days, _, clock = elapsed.rpartition("-")
    seconds = 0
    for part in clock.split(":"):
        seconds = seconds * 60 + int(part)
    return int(days or 0) * 86400 + seconds


def _newest_step(results: Path) -> int:
    return max(int(p.name.split("-")[1]) for p in results.glob("checkpoints/*/step-*[0-9]"))


def _requeued_then_started(job_id: str, within_s: float = 30) -> None:
    """Wait for the job to be requeued, then start it at once with time to finish: SLURM holds a
    requeued job back for a while (its BeginTime), and root administers this test's cluster. Not
    its five minutes back: on a loaded host a last attempt once outlasted them, SLURM's time-limit
    warning requeued it a third time, and the test timed out."""
    deadline = time.monotonic() + within_s
    while subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                         text=True).stdout.strip() != "PENDING":
        assert time.monotonic() < deadline, f"job {job_id} was not requeued within {within_s} s"
        time.sleep(0.2)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=15", "StartTime=now"], check=True)


@pytest.mark.slow
@pytest.mark.slurm
def test_a_rank_killed_under_slurm_fails_the_run_and_its_rerun_resumes(tmp_path):
    results, hold = tmp_path / "results", tmp_path / "hold"
    # timeout_s: how long the survivors wait for the dead rank before naming it
    args = ["-m", "hydra/launcher=slurm", "num_minibatches=20", "checkpoint.every=2", "timeout_s=10",
            f"results_dir={results}"]
    proc = subprocess.Popen([sys.executable, "-m", "odc_bench", *args, f"hydra.sweep.dir={tmp_path / 'first'}"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_held_env(hold))
    job_id = ""
    try:
        # Held, so the kill lands mid-run: without the hold, runs of 16 and of 40 minibatches
        # once ended before squeue and scontrol had answered.
        job_id = _job_held_once_it_checkpointed(results, hold)
        pids = subprocess.run(["scontrol", "listpids", job_id], capture_output=True, text=True).stdout
        # PID JOBID STEPID LOCALID GLOBALID: rank 1 is the task with global id 1
        rank1 = [int(f[0]) for f in (line.split() for line in pids.splitlines()[1:]) if len(f) == 5 and f[4] == "1"]
        assert rank1, pids
        for pid in rank1:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        hold.unlink()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        if job_id:  # a failed check leaves no job behind (the killed launcher cannot cancel it)
            subprocess.run(["scancel", job_id], capture_output=True)
    assert proc.returncode == 1, err[-3000:]
    failed = read_table(results / "runs.csv")
    assert list(failed["status"]) == ["failed"] and "rank 1" in failed["error"][0], failed["error"][0]
    assert list(results.glob("checkpoints/*/step-*[0-9]")), "a failed run keeps its checkpoints"

    again = run_cli(*args, f"hydra.sweep.dir={tmp_path / 'second'}", timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    rows = read_table(results / "runs.csv")
    assert list(rows["status"]) == ["failed", "ok"] and rows["resumed_from"][1] >= 2, rows
    assert "1 resumed from a checkpoint" in again.stdout
