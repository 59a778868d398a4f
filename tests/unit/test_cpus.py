"""The CPUs a run's ranks share: those the process may use, a container's CPU quota included.
`docker run --cpus=N` shows every core of its host; counting them gave each rank threads for
them all, which ran at about half the throughput (docs/reliability.md, "The CPUs a run may use")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from odc_bench import forked
from odc_bench.forked import usable_cpus
from odc_bench.run import worker
from odc_bench.run.launch import launch
from tests.helpers import REPO, run_spec

CPU_V1 = Path("/sys/fs/cgroup/cpu")


def test_a_containers_cpu_quota_lowers_the_count(tmp_path):
    """A process in a cgroup of half a CPU's time, seen from its own cgroup and mount namespaces
    as a container sees its cgroup (the root of its own), counts one CPU."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a cgroup and namespaces of its own need root and util-linux's unshare")
    if not (CPU_V1 / "cpu.cfs_quota_us").exists():
        pytest.skip("this test sets a cgroup v1 CPU quota, and this machine has no cgroup v1 cpu hierarchy")
    if usable_cpus() == 1:
        pytest.skip("one CPU here already: a quota cannot lower the count")
    group = CPU_V1 / f"odc-test-{os.getpid()}"
    group.mkdir()
    try:
        period = int((group / "cpu.cfs_period_us").read_text(encoding="utf-8"))
        (group / "cpu.cfs_quota_us").write_text(str(period // 2), encoding="utf-8")
        # In a script of its own, the interpreter through the environment: its path may hold a space.
        mount = tmp_path / "cgroup"
        mount.mkdir()
        inside = tmp_path / "inside.sh"
        inside.write_text(f"mount -t cgroup -o cpu cgroup {mount} && mount --bind {mount} {CPU_V1} && "
                          "grep -x 1:cpu:/ /proc/self/cgroup && "
                          """exec "$PY" -c 'from odc_bench.forked import usable_cpus; print(usable_cpus())'\n""",
                          encoding="utf-8")
        done = subprocess.run(["sh", "-c", f"echo $$ > {group}/cgroup.procs && exec unshare -C -m sh {inside}"],
                              cwd=REPO, capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PY=sys.executable))
    finally:
        group.rmdir()
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1:cpu:/", "1"], "the process sees its cgroup as the root, and one CPU"


def test_the_ranks_on_a_host_share_the_cpus_the_process_may_use(monkeypatch):
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setattr(forked, "usable_cpus", lambda: 9)
    spec = run_spec("world_size=2")
    assert worker.threads_per_rank(spec, 2, 2) == 4
    assert worker.threads_per_rank(spec, 16, 16) == 1, "at least one each"
    assert worker.threads_per_rank(run_spec("world_size=2", "threads_per_rank=3"), 2, 2) == 3
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "5")
    assert worker.threads_per_rank(spec, 2, 1) == 5, "a SLURM task per rank: the task's CPUs"


class _Started(Exception):
    pass


def test_a_local_runs_ranks_share_the_cpus_of_the_slurm_task_that_starts_them(monkeypatch):
    """`python -m odc_bench world_size=2` inside `sbatch -c 8` (SLURM_CPUS_PER_TASK=8): each of
    the two ranks the launcher starts gets 4 threads, where each took all 8 before."""
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "8")
    monkeypatch.setattr(forked, "usable_cpus", lambda: 64)  # a node's cores, more than the task's

    def start(entry, job, world):
        raise _Started(job.threads, world)

    with pytest.raises(_Started) as started:
        launch(run_spec("world_size=2"), start, worker.run_rank)
    assert started.value.args == (4, 2)


@pytest.mark.parametrize(("overrides", "note"), [
    (("world_size=2",), None),
    (("world_size=3",), "world_size=3 runs 3 ranks on the 2 CPUs this command may use: they take turns on the cores, "
                        "so the times measure the host's scheduling as much as the engines; use a world_size of at "
                        "most 2 for times to compare, or backend=sim"),
    (("world_size=2", "threads_per_rank=2"), "world_size=2 runs 2 ranks of 2 threads each on the 2 CPUs this command "
                                             "may use: they take turns on the cores, so the times measure the host's "
                                             "scheduling as much as the engines; use threads_per_rank=1 or null"),
    (("world_size=3", "backend=sim"), None)],
    ids=["as many as CPUs", "more ranks", "more threads", "simulated"])
def test_a_real_run_of_more_threads_than_cpus_says_its_times_are_the_hosts_scheduling(overrides, note, monkeypatch):
    """4 ranks on 2 CPUs ran and recorded times like any other run, without a word: ranks that take
    turns on a core wait inside their steps (a lock held by a rank off its core)."""
    monkeypatch.setattr(forked, "usable_cpus", lambda: 2)
    said = run_spec(*overrides).cpus_shared()
    assert said == note if note is None else said is not None and said.startswith(note)
