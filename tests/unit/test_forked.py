"""Calls in forked worker processes (odc_bench/forked.py): results in order, the first failure
raised here, Ctrl-C left to the parent, a worker's own calls inline, and no worker outliving a
killed parent; a helper loaded early that runs calls later."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from odc_bench.forked import Helper, HelperGone, first_here, in_processes

REPO = Path(__file__).resolve().parents[2]


def _whoami(i: int) -> tuple[int, int]:
    return i, os.getpid()


def _fails_from_one(i: int) -> int:
    if i >= 1:
        raise ValueError(f"call {i}")
    return i


def _sigint_blocked() -> bool:
    return signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_calls_run_in_other_processes_and_come_back_in_their_order():
    met = []
    done = in_processes(_whoami, [(i,) for i in range(5)], 2, meanwhile=lambda: met.append(os.getpid()))
    assert [i for i, _ in done] == list(range(5))
    assert os.getpid() not in {pid for _, pid in done} and 1 <= len({pid for _, pid in done}) <= 2
    assert met == [os.getpid()], "meanwhile runs once, here"


def test_the_first_call_runs_here_and_the_others_in_workers():
    unpicklable = lambda: None  # noqa: E731  (a call run here is never sent)
    done = first_here(lambda i, _: _whoami(i), [(0, unpicklable)], 2)
    assert done == [(0, os.getpid())]
    done = first_here(_whoami, [(i,) for i in range(4)], 2)
    assert [i for i, _ in done] == list(range(4)) and done[0][1] == os.getpid()
    assert os.getpid() not in {pid for _, pid in done[1:]}


def _inner_pids() -> tuple[int, list[tuple[int, int]]]:
    return os.getpid(), in_processes(_whoami, [(0,), (1,)], 2)


def test_a_workers_own_calls_run_in_it():
    [(worker, inner)] = in_processes(_inner_pids, [(), ()], 2)[:1]
    assert worker != os.getpid() and {pid for _, pid in inner} == {worker}


def test_with_no_workers_the_calls_run_here_after_meanwhile():
    order: list[object] = []

    def call(i: int) -> tuple[int, int]:
        order.append(i)
        return _whoami(i)

    assert in_processes(call, [(0,), (1,)], 0, meanwhile=lambda: order.append("meanwhile")) == [
        (0, os.getpid()), (1, os.getpid())]
    assert order == ["meanwhile", 0, 1]


def test_the_first_calls_exception_is_raised_here():
    with pytest.raises(ValueError, match="^call 1$"):
        in_processes(_fails_from_one, [(0,), (1,), (2,)], 3)


def test_workers_leave_ctrl_c_to_this_process():
    assert in_processes(_sigint_blocked, [(), ()], 2) == [True, True]
    assert not _sigint_blocked()


def _state(pid: int) -> str | None:
    """The process's state letter (Z: a zombie), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


WORKERS = """
    def work(folder, i):
        Path(folder, str(os.getpid())).write_text("")
        time.sleep(120)

    in_processes(work, [(sys.argv[1], 0), (sys.argv[1], 1)], 2)
"""
HELPER = """
    helper = Helper("os")
    Path(sys.argv[1], str(helper.call("getpid"))).write_text("")
    Path(sys.argv[1], "parent").write_text("")
    time.sleep(120)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the kernel's parent-death signal is Linux's")
@pytest.mark.parametrize("children", [WORKERS, HELPER], ids=["workers", "helper"])
def test_no_worker_outlives_a_killed_parent(tmp_path, children):
    script = textwrap.dedent("""
        import os, sys, time
        from pathlib import Path
        from odc_bench.forked import Helper, in_processes
    """) + textwrap.dedent(children)
    parent = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=REPO,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.iterdir())) < 2:
            assert parent.poll() is None and time.monotonic() < deadline, "the workers never started"
            time.sleep(0.05)
        workers = [int(p.name) for p in tmp_path.iterdir() if p.name != "parent"]
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while any(_state(pid) not in (None, "Z") for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_state(pid) in (None, "Z") for pid in workers), "a worker outlived its parent"


# -- the helper --------------------------------------------------------------------------------

HELPED = '''
import os, signal, time
LOADED_IN = os.getpid()

def whoami():
    return LOADED_IN, os.getpid()

def fails():
    raise ValueError("from the helper")

def sigint_blocked():
    return signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])

def slow_write(path):
    time.sleep(0.5)
    with open(path + ".part", "w") as f:
        f.write("done")
    os.replace(path + ".part", path)
'''


@pytest.fixture
def helped(tmp_path, monkeypatch):
    """A module the helper loads: forked, the helper sees this process's import path."""
    (tmp_path / "helped_module.py").write_text(HELPED)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "helped_module"
    sys.modules.pop("helped_module", None)


def test_a_helper_loads_its_module_there_and_runs_its_calls_there(helped):
    helper = Helper(helped)
    try:
        loaded_in, runs_in = helper.call("whoami")
        assert loaded_in == runs_in != os.getpid() and helped not in sys.modules
        with pytest.raises(ValueError, match="^from the helper$"):
            helper.call("fails")
        assert helper.call("sigint_blocked") is True, "Ctrl-C is left to this process"
        assert helper.call("whoami") == (loaded_in, runs_in), "one helper, calls one after the other"
    finally:
        helper.close()
    assert _state(runs_in) in (None, "Z")


def test_a_module_the_helper_cannot_load_fails_at_the_call():
    helper = Helper("odc_bench.no_such_module")
    try:
        with pytest.raises(ModuleNotFoundError, match="odc_bench.no_such_module"):
            helper.call("anything")
    finally:
        helper.close()


def test_a_helper_killed_from_outside_is_said_so(helped):
    helper = Helper(helped)
    try:
        _, pid = helper.call("whoami")
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(HelperGone):
            helper.call("whoami")
    finally:
        helper.close()


def test_ctrl_c_during_a_call_reaches_the_caller_once_the_helper_has_ended(helped, tmp_path):
    """Ctrl-C here while the helper writes a file: the call finishes in the helper (no half-written
    file left) and the helper ends before the Ctrl-C reaches the caller, whose clean-up then sees
    everything the helper wrote (the what-if removes its temporary figure: a helper still drawing
    wrote it again after that)."""
    helper = Helper(helped)
    _, pid = helper.call("whoami")

    def ctrl_c(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, ctrl_c)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            helper.call("slow_write", str(tmp_path / "out"))
        assert (tmp_path / "out").read_text() == "done" and not (tmp_path / "out.part").exists()
        assert _state(pid) in (None, "Z")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        helper.close()
