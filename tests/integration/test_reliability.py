"""A rank killed mid-minibatch ends the run fast and by name, with nothing left behind, under
the local launcher and as plain ranks with nobody watching (SLURM); one seed gives one run."""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import torch

from odc_bench import cli
from odc_bench.errors import ConfigError
from odc_bench.files import interrupts_deferred
from odc_bench.jobs.train import execute
from odc_bench.models.decoder import build_model
from odc_bench.plan.spec import resolve
from odc_bench.record.metrics import events_frame, minibatch_losses
from odc_bench.results.table import read_table
from odc_bench.run import local, slurm_task, worker
from odc_bench.run.local import run_local
from odc_bench.run.ranks import run_ranks
from odc_bench.run.worker import RankJob, rank_entry
from odc_core.engine.fsdp2 import CollectiveEngine
from odc_core.engine.odc import OdcEngine
from odc_core.transport.shm import (
    SHM_DIR,
    ShmHeap,
    list_segments,
    of_job,
    process_start_time,
    segment_creator,
    sweep_stale_segments,
)
from tests.helpers import REPO, odc_bench, run_config
from tests.helpers.processes import alive, descendants

pytestmark = pytest.mark.slow

TIMEOUT_S = 5.0
# From a rank's death to the run's row: the peers' timeout, judging their heartbeats, stopping
# the launcher's processes and writing the row. Start-up is not in it: on a loaded 2-CPU machine
# it alone took more than the whole of an earlier bound that counted it (CI at 77f30ab).
MARGIN_S = 15.0
SMALL = ("model.num_layers=2", "world_size=2", "minibatch_size=2", "num_minibatches=3", "warmup_minibatches=0",
         "dataset.length_scale=0.005", f"timeout_s={TIMEOUT_S}", "threads_per_rank=1")


def _spec(engine: str, *overrides: str):
    return resolve(run_config(f"engine={engine}", *SMALL, *overrides))


def die_in_minibatch_1(rank: int, victim: int, before: Callable[[], None] | None = None) -> None:
    """Make `victim` SIGKILL itself as it loads its second sample of minibatch 1 (calling `before`
    first): its peers are then inside minibatch 1 too, gathering from it, pushing to it or in a
    collective with it."""
    if rank != victim:
        return
    state = {"minibatch": -1, "samples": 0}
    for cls in (OdcEngine, CollectiveEngine):
        def begin(self, _begin=cls.begin_minibatch):
            _begin(self)
            state["minibatch"] += 1
            state["samples"] = 0
        cls.begin_minibatch = begin
    source = worker.token_source

    def killing_source(name: str):
        tokens = source(name)

        def sample(*args, **kwargs):
            if state["minibatch"] == 1:
                state["samples"] += 1
                if state["samples"] == 2:
                    if before is not None:
                        before()
                    os.kill(os.getpid(), signal.SIGKILL)
            return tokens(*args, **kwargs)

        return sample

    worker.token_source = killing_source


def killing_entry(folder: str, rank: int, job: RankJob) -> None:
    """rank_entry that records its process and job in `folder` and, in runs with seed 0, kills
    rank 1 in minibatch 1, writing the instant of its death (time.monotonic, one clock for the
    host) to `folder`/killed. Bind `folder` with functools.partial: the ranks unpickle it by name."""
    (Path(folder) / f"rank{rank}").write_text(f"{os.getpid()} {process_start_time(os.getpid())} {job.job_id}")
    # On CPU, a stand-in for what torch's CUDA IPC makes when a rank shares a CUDA tensor: a
    # reference-count file under the rank's pid, which a killed rank never gives its count back to.
    (SHM_DIR / f"torch_{os.getpid()}_0_0").touch()
    if job.spec.config.seed == 0:
        die_in_minibatch_1(rank, victim=1, before=partial(_write_instant, Path(folder) / "killed"))
    rank_entry(rank, job)


def _write_instant(path: Path) -> None:
    path.write_text(repr(time.monotonic()), encoding="utf-8")


def since_killed(folder: Path) -> float:
    """Seconds since killing_entry's victim died."""
    return time.monotonic() - float((folder / "killed").read_text(encoding="utf-8"))


def _segments_of(job_id: str) -> list[str]:
    """This job's segments, its process groups' included (job ids are unique on the host: they
    carry the store's port or the job number)."""
    return [s for s in list_segments() if of_job(s, job_id)]


@pytest.mark.parametrize(("engine", "overrides"), [("odc", ()), ("odc", ("engine.staleness=1",)),
                                                   ("collective", ())])
def test_a_rank_killed_mid_minibatch_fails_the_run_by_name_and_leaves_nothing(engine, overrides, results_dir,
                                                                              tmp_path, sigkill_window):
    spec = _spec(engine, *overrides)
    row = execute(spec, results_dir, launch=partial(run_local, entry=partial(killing_entry, str(tmp_path))))
    assert since_killed(tmp_path) < TIMEOUT_S + MARGIN_S
    assert row["status"] == "failed"
    # Progress is rank 0's. With staleness s the ranks may run up to s minibatches apart, either
    # way: rank 0 may still be in minibatch 1 - s when its peer dies in minibatch 1, or finish up
    # to s minibatches past it.
    staleness = spec.config.engine.staleness
    assert row["error"] in {f"rank 1 died (killed by SIGKILL) after {done} of 3 minibatches"
                            for done in range(max(0, 1 - staleness), 2 + staleness)}, row["error"]
    table = read_table(results_dir / "runs.csv")
    assert list(table["status"]) == ["failed"] and table["error"][0] == row["error"]
    ranks = [(tmp_path / f"rank{r}").read_text().split() for r in range(2)]
    assert _segments_of(ranks[0][2]) == [], "the launcher removed the dead and the killed ranks' segments"
    assert all(process_start_time(int(pid)) != int(start) for pid, start, _ in ranks), "no rank process is left"
    assert ipc_counters_of(ranks) == [], "the launcher removed the ranks' CUDA IPC reference-count files"


def _memory_cgroup(name: str, limit: int) -> Path | None:
    """A memory cgroup limited to `limit` bytes (cgroup v1 or v2): its cgroup.procs, or None where
    this process may not make one (not root, no memory controller)."""
    for folder, limit_file in ((Path("/sys/fs/cgroup/memory") / name, "memory.limit_in_bytes"),
                               (Path("/sys/fs/cgroup") / name, "memory.max")):
        try:
            folder.mkdir()
        except OSError:
            continue
        try:
            (folder / limit_file).write_text(str(limit))
            return folder / "cgroup.procs"
        except OSError:
            folder.rmdir()
    return None


def oom_entry(procs: str, rank: int, job: RankJob) -> None:
    """rank_entry whose rank 1 first moves into the memory cgroup of `procs` and fills it, so that
    the kernel's OOM killer kills it as it would a rank that outgrew the host."""
    if rank == 1:
        Path(procs).write_text(str(os.getpid()), encoding="utf-8")
        hog = b"x" * (1 << 30)
        del hog
    rank_entry(rank, job)


def test_a_rank_the_oom_killer_killed_is_named_so(results_dir, sigkill_window):
    """A rank the kernel killed for memory was `rank 1 died (killed by SIGKILL)`, as if anyone
    could have sent it: nothing said that memory ran out."""
    procs = _memory_cgroup(f"odc-test-{os.getpid()}", 256 << 20)
    if procs is None:
        pytest.skip("making a memory cgroup needs root and a memory controller")
    try:
        row = execute(_spec("odc"), results_dir, launch=partial(run_local, entry=partial(oom_entry, str(procs))))
    finally:
        procs.parent.rmdir()
    assert row["status"] == "failed"
    assert row["error"] == ("rank 1 died (killed by SIGKILL from the kernel's out-of-memory killer, which ran while "
                            "the ranks did: this host or the run's cgroup ran out of memory) after 0 of 3 minibatches; "
                            "use fewer ranks per host, a smaller model or a lower max_tokens")


def ipc_counters_of(ranks: list[list[str]]) -> list[str]:
    """torch's CUDA IPC reference-count files in /dev/shm of the ranks killing_entry recorded."""
    return sorted(p.name for pid, _, _ in ranks for p in SHM_DIR.glob(f"torch_{pid}_*"))


def test_a_sweep_goes_on_after_a_run_whose_rank_died(tmp_path, monkeypatch, sigkill_window):
    results = tmp_path / "results"
    monkeypatch.setattr(local, "run_local", partial(run_local, entry=partial(killing_entry, str(tmp_path))))
    monkeypatch.chdir(tmp_path)
    status = odc_bench("--multirun", "seed=0,1", *SMALL, f"results_dir={results}",
                       f"hydra.sweep.dir={tmp_path / 'multirun'}")
    assert status == 1, "a sweep with a failed run ends with exit status 1, after the other runs"
    table = read_table(results / "runs.csv")
    assert list(table["seed"]) == [0, 1]
    assert list(table["status"]) == ["failed", "ok"]
    assert table["error"][0] == "rank 1 died (killed by SIGKILL) after 1 of 3 minibatches"


def _as_slurm_task(rank: int, world: int, folder: str, job_number: str) -> None:
    """The environment submitit gives task `rank` of a one-node job of `world` tasks."""
    os.environ.update(SUBMITIT_EXECUTOR="slurm", SUBMITIT_FOLDER=folder, SLURM_JOB_ID=job_number,
                      SLURM_NTASKS=str(world), SLURM_JOB_NUM_NODES="1", SLURM_NODEID="0",
                      SLURM_JOB_NODELIST="localhost", SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank))


def plain_slurm_task(rank: int, world: int, spec, results_dir: str, folder: str, job_number: str, victim: int) -> None:
    """One task of a SLURM job as submitit runs it, minus sbatch: the job's execute() around
    slurm_task.run_task, with no process watching the ranks."""
    _as_slurm_task(rank, world, folder, job_number)
    die_in_minibatch_1(rank, victim)
    execute(spec, Path(results_dir), slurm_task.run_task)


# The survivors below wait this long for the dead rank before they name it: shorter than the
# other tests' (their launcher sees the death at once), long enough for healthy waits under load.
UNWATCHED_TIMEOUT_S = 3.0


@pytest.mark.parametrize(("engine", "victim", "overrides"), [
    ("odc", 1, ()), ("collective", 1, ()), ("odc", 0, ()),
    # Stale-synchronous: the survivor's server thread waits on the dead rank too.
    ("odc", 1, ("engine.staleness=1",)), ("odc", 0, ("engine.staleness=2",)),
])
def test_ranks_with_nobody_watching_notice_a_dead_peer_by_themselves(engine, victim, overrides, tmp_path):
    """Rank 0 hosts the store and writes the row, as on SLURM; when rank 0 is the one that dies,
    the survivor writes it."""
    spec = _spec(engine, *overrides, f"timeout_s={UNWATCHED_TIMEOUT_S}")
    results = tmp_path / "results"
    ctx = multiprocessing.get_context("forkserver")
    # Unique on the host, like a SLURM job id, but not a number: its segments are then told apart
    # from real SLURM tasks', which the SLURM tests running beside this one check (tests/helpers/shm.py).
    job_number = f"pid{os.getpid()}"
    tasks = [ctx.Process(target=plain_slurm_task,
                         args=(r, 2, spec, str(results), str(tmp_path / "job"), job_number, victim))
             for r in range(2)]
    for task in tasks:
        task.start()
    ended: dict[int, float] = {}
    limit = time.monotonic() + 120
    while len(ended) < len(tasks) and time.monotonic() < limit:
        for r, task in enumerate(tasks):
            if r not in ended and task.exitcode is not None:
                ended[r] = time.monotonic()
        time.sleep(0.05)
    for task in tasks:
        if task.is_alive():
            task.kill()
        task.join()
    survivor = 1 - victim
    assert tasks[victim].exitcode == -signal.SIGKILL
    assert tasks[survivor].exitcode == 0, "the survivor recorded the failure and ended"
    # Its waits on the dead rank time out after timeout_s, it watches heartbeats for 3 beats,
    # and rank 0 gives its peers a second to leave their errors.
    assert ended[survivor] - ended[victim] < UNWATCHED_TIMEOUT_S + 8
    table = read_table(results / "runs.csv")
    assert list(table["status"]) == ["failed"]
    error = table["error"][0]
    assert error.startswith(f"rank {survivor} failed: ") and f"rank {victim} is gone" in error, error
    if engine == "odc":
        assert f"waiting for rank {victim}" in error, error
    job_id = f"{spec.run_id[:8]}-{job_number}-0.0"  # as slurm_task.run_task names it (restart 0, repeat 0)
    assert _segments_of(job_id) == [], "the survivor removed the dead rank's segments"


def ending_slurm_task(rank: int, world: int, spec, results_dir: str, folder: str, job_number: str,
                      victim: int) -> None:
    """plain_slurm_task as SLURM ends an attempt (a requeue, a cancel): submitit only logs SIGTERM,
    SLURM sends it to every task, then kills the tasks one by one, here `victim` first."""
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # submitit's handler: it only logs
    pids = Path(folder) / "pids"
    pids.mkdir(parents=True, exist_ok=True)
    (pids / str(rank)).write_text(str(os.getpid()))

    def sigterm_every_task() -> None:
        for pid in sorted(int(p.read_text()) for p in pids.iterdir()):
            os.kill(pid, signal.SIGTERM)
        time.sleep(0.2)  # KillWait, shortened

    _as_slurm_task(rank, world, folder, job_number)
    die_in_minibatch_1(rank, victim, before=sigterm_every_task)
    execute(spec, Path(results_dir), slurm_task.run_task)


@pytest.mark.parametrize("victim", [0, 1])
def test_an_attempt_slurm_ends_writes_no_failed_row(victim, tmp_path):
    """SLURM killing a requeued or cancelled job's tasks one by one is not the run failing: the
    survivor, signalled first, sees its peer vanish and records nothing (the requeued attempt
    resumes and writes the run's one row). In CI the survivor of a requeue once wrote a failed
    row (test_slurm's requeue test read two rows)."""
    spec = _spec("odc", f"timeout_s={UNWATCHED_TIMEOUT_S}")
    results = tmp_path / "results"
    ctx = multiprocessing.get_context("forkserver")
    job_number = f"pid{os.getpid()}"  # not a number: see the test above
    tasks = [ctx.Process(target=ending_slurm_task,
                         args=(r, 2, spec, str(results), str(tmp_path / "job"), job_number, victim))
             for r in range(2)]
    for task in tasks:
        task.start()
    for task in tasks:
        task.join(timeout=120)
        if task.is_alive():
            task.kill()
            task.join()
    assert tasks[victim].exitcode == -signal.SIGKILL
    assert tasks[1 - victim].exitcode == 0, "the survivor ended without an error"
    assert not (results / "runs.csv").exists() or read_table(results / "runs.csv").empty, "no row"
    job_id = f"{spec.run_id[:8]}-{job_number}-0.0"
    assert _segments_of(job_id) == [], "the survivor removed the dead rank's segments"


# ---- determinism ---------------------------------------------------------------------

def _plans(spec) -> list:
    return [(mb.sample_ids, mb.lengths, mb.plan, mb.queue) for mb in spec.minibatches]


@pytest.mark.parametrize(("engine", "balancer"), [("collective", "lb_micro"), ("odc", "lb_mini"), ("odc", "dynamic")])
def test_one_seed_gives_one_plan_and_one_set_of_initial_weights(engine, balancer):
    a, b = (_spec(engine, f"balancer={balancer}", "seed=3", "num_minibatches=4") for _ in range(2))
    other = _spec(engine, f"balancer={balancer}", "seed=4", "num_minibatches=4")
    assert _plans(a) == _plans(b)
    assert _plans(a) != _plans(other)
    weights = [build_model(s.config.model, s.config.seed, torch.device("cpu")).state_dict() for s in (a, b, other)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])


def _train(spec) -> tuple[list[float], dict[str, torch.Tensor]]:
    results = run_local(spec, collect_params=True)
    losses = minibatch_losses(events_frame(results), [mb.labelled_tokens for mb in spec.minibatches])
    return losses, results[0]["params"]


@pytest.mark.parametrize(("engine", "overrides"), [
    ("collective", ("minibatch_size=3",)),
    # Every gradient element of an ODC owner then gets exactly two pushes, one per rank, and
    # a + b == b + a in floating point: the order they land in cannot change the sum.
    ("odc", ("minibatch_size=1",)),
])
def test_two_runs_with_one_seed_train_bit_for_bit_alike(engine, overrides):
    spec = _spec(engine, "num_minibatches=4", *overrides)
    (losses, params), (again, params_again) = _train(spec), _train(spec)
    assert losses == again
    assert all(torch.equal(params[k], params_again[k]) for k in params)
    assert losses[-1] != losses[0], "the runs trained"


def test_odc_with_several_pushes_per_owner_differs_at_most_by_rounding():
    """Three or more pushes into one accumulator land in arrival order, and fp32 addition is
    not associative: losses after the first step may differ in the last bits (docs/reliability.md)."""
    spec = _spec("odc", "num_minibatches=4", "minibatch_size=3")
    (losses, _), (again, _) = _train(spec), _train(spec)
    assert losses[0] == again[0], "the first minibatch runs on the seed's weights, before any push"
    assert again == pytest.approx(losses, rel=1e-5, abs=0)


# Where Ctrl-C lands: (a line of the run's output to wait for, or None for the start, and seconds
# after it). Importing the harness; composing and planning; the ranks starting (the line before
# them is the lengths); mid-run; and between two runs, just after the first one's row.
INTERRUPTS = [(None, 0.3), (None, 1.2), ("lengths: ", 0.0), ("lengths: ", 1.5), ("samples_per_s", 0.0)]


@pytest.mark.parametrize(("after", "delay"), INTERRUPTS)
def test_ctrl_c_at_any_moment_is_one_line_status_130_and_leaves_no_segment(after, delay, tmp_path):
    # A seed of this process's own makes the runs' keys, which name their segments, this test's
    # alone: the host is shared, and another session may be running this very test.
    overrides = ("repeat=20", f"seed={os.getpid()}", f"results_dir={tmp_path / 'r'}")
    ours = f"odc-{_spec('odc', *overrides).run_id[:8]}_"
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    proc = subprocess.Popen([sys.executable, "-m", "odc_bench", *SMALL, "engine=odc", *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=tmp_path,  # Hydra's outputs/ of a single run goes to the working directory
                            start_new_session=True,  # its own group, as a terminal's job
                            # SIGINT at its default, as a terminal starts it, even where this test runs in the
                            # background (a non-interactive shell's `&` ignores SIGINT, and children inherit that)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    try:
        if after is not None:
            for line in proc.stdout:
                if after in line:
                    break
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGINT)  # the whole group, as Ctrl-C does
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # Ctrl-C went unanswered: stop the command and its ranks, and their segments
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            sweep_stale_segments()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 130 and len(lines) == 1, err
    assert lines[0].startswith("odc_bench: interrupted; ") and "Traceback" not in err
    assert not [name for name in list_segments() if name.startswith(ours)], "no shared memory left behind"


def test_ctrl_c_landing_in_executed_source_still_ends_with_status_130(tmp_path):
    """A Ctrl-C can surface inside source run by exec(): dataclasses build their methods that way,
    so a lazy `import torch` in the precheck took one there under load. CPython marks such a
    KeyboardInterrupt unhandled though the command handles it, and `python -m` would then end
    by SIGINT (-2) instead of with 130 (cli.interrupted clears the mark)."""
    (tmp_path / "ctrl_c_in_exec.py").write_text(
        "from odc_bench.cli import interrupted\n"
        "try:\n"
        "    exec('raise KeyboardInterrupt')\n"
        "except KeyboardInterrupt:\n"
        "    interrupted()\n")
    proc = subprocess.run([sys.executable, "-m", "ctrl_c_in_exec"], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)])))
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.startswith("odc_bench: interrupted; ") and len(proc.stderr.splitlines()) == 1


def _interrupted_composing(args: list[str], monkeypatch, capsys) -> list[tuple[int | str, str, bool]]:
    """The command run once per composition it makes (Hydra's loader: the check before Hydra, Hydra's
    own, the sweeper's and its launcher's per job), Ctrl-C sent as that composition starts: each
    time the exit (the status, or `raised`: the Ctrl-C left the command's main for
    odc_bench/__main__.py to say), stderr, and whether that composition ran to its end."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    load = ConfigLoaderImpl.load_configuration
    count: list[int] = []
    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration",
                        lambda self, *a, **k: count.append(1) or load(self, *a, **k))
    assert odc_bench(*args) == 0
    capsys.readouterr()
    outcomes = []
    for k in range(len(count)):
        calls: list[str] = []

        def interrupting(self, *a, k=k, calls=calls, **kw):
            if calls.count("started") == k:
                signal.raise_signal(signal.SIGINT)
            calls.append("started")
            cfg = load(self, *a, **kw)
            calls.append("composed")
            return cfg

        monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", interrupting)
        try:
            status: int | str = odc_bench(*args)
        except KeyboardInterrupt:
            status = "raised"
        outcomes.append((status, capsys.readouterr().err, calls.count("composed") == calls.count("started") > k))
    return outcomes


@pytest.mark.parametrize("sweep", [(), ("-m", "seed=0,1")], ids=["run", "sweep"])
def test_ctrl_c_while_a_config_is_composed_waits_for_it_and_ends_in_one_line(sweep, tmp_path, monkeypatch, capsys):
    """OmegaConf interrupted mid-merge raised another error instead (`'NoneType' object has no
    attribute '_invalidate_flags_cache'`), which Hydra reported as the command's failure, status 1:
    once in 80 Ctrl-Cs sent 0.8-3 s into a run under load (2026-12-06)."""
    monkeypatch.chdir(tmp_path)
    args = [*sweep, "backend=sim", "num_minibatches=3", "warmup_minibatches=0", f"results_dir={tmp_path / 'r'}"]
    outcomes = _interrupted_composing(args, monkeypatch, capsys)
    assert len(outcomes) >= (5 if sweep else 2)
    for status, err, composed in outcomes:
        assert composed, "the composition the Ctrl-C came in ran to its end"
        if status == "raised":
            assert err == ""
        else:
            assert status == 130 and err.startswith("odc_bench: interrupted; ") and len(err.splitlines()) == 1, err


def test_ctrl_c_inside_torchs_cpp_initialisation_waits_for_the_import(tmp_path):
    """The command imports torch only once a run needs it. A Ctrl-C raised in Python that torch's
    C++ initialisation calls aborted the command in a few of every hundred Ctrl-Cs pressed during
    that import (SIGABRT, `terminate called after throwing ... pybind11::error_already_set`), a
    rank's cleanup undone: the test of random moments above met it under load. Held, it comes
    once torch's code has run (tests/helpers/ctrl_c_in_torch_init makes the moment exact)."""
    record = tmp_path / "record"
    helper = str(REPO / "tests" / "helpers" / "ctrl_c_in_torch_init")
    proc = subprocess.run([sys.executable, "-m", "odc_bench", *SMALL, f"results_dir={tmp_path / 'r'}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, ODC_TEST_RECORD=str(record),
                                   PYTHONPATH=os.pathsep.join(filter(None, [helper, os.environ.get("PYTHONPATH")]))))
    if not record.exists():
        pytest.skip("this torch's import calls no torch._C._autograd_init (the moment the helper interrupts)")
    assert record.read_text(encoding="utf-8") == "returned", "the C++ call returned: nothing was raised inside it"
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.startswith("odc_bench: interrupted; ") and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert not (tmp_path / "r").exists()


def test_ctrl_c_while_the_fork_server_starts_is_not_lost(monkeypatch):
    """The launcher starts the server that forks ranks with Ctrl-C kept from it; a Ctrl-C pressed
    in that moment still interrupts the launcher once its ranks have started."""
    spawn = multiprocessing.forkserver.ensure_running

    def spawn_during_ctrl_c() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        spawn()

    monkeypatch.setattr(multiprocessing.forkserver, "ensure_running", spawn_during_ctrl_c)
    with pytest.raises(KeyboardInterrupt), interrupts_deferred():
        local._start_forkserver()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_the_command_turns_sigterm_and_sighup_into_an_exit_while_it_runs_and_restores_the_handler(
        signum, tmp_path, monkeypatch):
    """SIGTERM and SIGHUP unwind the command like Ctrl-C (status 143, 129); a caller in the same
    process gets its own handler back, and one started ignoring the signal (nohup) keeps ignoring it."""
    during = []

    def stop_at_the_check(args: list[str], planner: object) -> None:
        during.append(signal.getsignal(signum))
        raise ConfigError("stopped at the check")

    monkeypatch.setattr(cli, "precheck", stop_at_the_check)
    monkeypatch.chdir(tmp_path)
    original = signal.signal(signum, signal.SIG_DFL)  # as a terminal starts a command, whatever runs this test
    try:
        assert odc_bench("world_size=2") == 2
        assert signal.getsignal(signum) == signal.SIG_DFL
        (handler,) = during
        assert callable(handler)
        with pytest.raises(SystemExit) as ended:
            handler(signum, None)
        assert ended.value.code == 128 + signum
        signal.signal(signum, signal.SIG_IGN)
        assert odc_bench("world_size=2") == 2
        assert during[1] == signal.SIG_IGN and signal.getsignal(signum) == signal.SIG_IGN
    finally:
        signal.signal(signum, original)


@pytest.mark.parametrize("delay", [0.2, 1.5])  # as the ranks start (the fork server goes with the group), mid-run
def test_a_hangup_stops_the_run_in_one_line_and_leaves_no_segment_or_rank(delay, tmp_path):
    """The terminal or ssh session closing sends the command's process group SIGHUP, whose default
    action ended the command and its ranks on the spot: their shared memory stayed behind until
    another run on the host swept it, and a SLURM sweep's jobs were left running."""
    overrides = ("repeat=20", f"seed={os.getpid()}", f"results_dir={tmp_path / 'r'}")
    ours = f"odc-{_spec('odc', *overrides).run_id[:8]}_"
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    proc = subprocess.Popen([sys.executable, "-m", "odc_bench", *SMALL, "engine=odc", *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            start_new_session=True,  # its own group, as a terminal's job
                            # SIGHUP at its default, as a terminal starts it, even where this test runs under
                            # nohup or a tool that ignores it (children inherit that)
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith("lengths: "):  # the ranks start next
                break
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGHUP)  # the whole group, as a hangup does
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            sweep_stale_segments()
    assert proc.returncode == 128 + signal.SIGHUP, err
    assert err.splitlines()[-1] == ("odc_bench: stopped by SIGHUP; the run under way was stopped and wrote nothing "
                                    "(finished runs' rows are kept)") and "Traceback" not in err
    assert not [name for name in list_segments() if name.startswith(ours)], "no shared memory left behind"
    assert not (tmp_path / "r" / "runs.csv").exists() or len(read_table(tmp_path / "r" / "runs.csv")) < 20


def test_ranks_of_a_killed_command_end_at_once_and_leave_no_segment(tmp_path):
    """The command SIGKILLed (by hand, or chosen by the kernel's out-of-memory killer) left an ODC
    rank waiting out timeout_s on a peer that had died with it, its shared memory held: 2 minutes
    at the default. The command hosts the run's store; its ranks end once it stops answering."""
    timeout_s = 60.0  # a rank that waits it out fails the bound below
    overrides = (*(o for o in SMALL if not o.startswith(("timeout_s=", "num_minibatches="))), "engine=odc",
                 "num_minibatches=400", f"timeout_s={timeout_s}", f"seed={os.getpid()}",
                 f"results_dir={tmp_path / 'r'}")
    ours = f"odc-{resolve(run_config(*overrides)).run_id[:8]}_"
    proc = subprocess.Popen([sys.executable, "-m", "odc_bench", *overrides], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=tmp_path, start_new_session=True)
    below: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not [name for name in list_segments() if name.startswith(ours)] and time.monotonic() < deadline:
            assert proc.poll() is None, "the run ended before its ranks were under way"
            time.sleep(0.1)
        assert [name for name in list_segments() if name.startswith(ours)], "the ranks opened their heap"
        time.sleep(1.0)  # both ranks training
        below = descendants(proc.pid)
        assert len(below) >= 3, "the fork server and two ranks"
        proc.kill()
        proc.wait()
        killed = time.monotonic()
        while (alive(below) or [n for n in list_segments() if n.startswith(ours)]) and time.monotonic() < killed + 30:
            time.sleep(0.1)
        ended = time.monotonic() - killed
        left, held = alive(below), [name for name in list_segments() if name.startswith(ours)]
    finally:
        for pid in alive(below):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        time.sleep(0.5)  # the killed ranks' segments are swept once their creators are gone
        sweep_stale_segments()
    assert not left, f"processes left running 30 s after their command was killed: {left}"
    assert not held, "no shared memory left behind"
    assert ended < timeout_s / 3, f"the ranks ended {ended:.1f} s after their command, not at once"


def hold_a_heap(rank: int, world_size: int, store, job_id: str) -> None:
    """A rank of run_ranks that opens a shared-memory heap and waits to be stopped."""
    heap = ShmHeap(rank, world_size, job_id, store, timeout_s=60.0)
    heap.alloc("buffer", 1024, torch.float32)
    time.sleep(120)


def test_an_interrupt_while_run_ranks_waits_stops_its_ranks_and_removes_their_segments():
    """The primitives benchmark's ranks (run/ranks.py) are killed when its command is interrupted
    (Ctrl-C, or SIGTERM sent to the command alone): what their heaps left goes with them."""
    job = f"interrupted-ranks-{os.getpid()}"

    def ours() -> list[str]:
        return [name for name in list_segments() if of_job(name, job)]

    def interrupt_once_every_heap_is_open() -> None:
        deadline = time.monotonic() + 60
        while len({segment_creator(name) for name in ours()}) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_every_heap_is_open, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_ranks(hold_a_heap, 2, job, timeout_s=90)
    assert ours() == [], "no segment left behind"
