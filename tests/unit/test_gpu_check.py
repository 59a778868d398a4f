"""make gpu-check's parts that need no GPU: what it does on a machine without one, where it
writes, the engine's gap read off a device-timed trace, and the simulator half of its report
(the runs themselves need the GPU: the lent machine runs them)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from odc_bench.tools import gpu_check
from tests.helpers import REPO


def test_without_cuda_it_says_so_and_exits_0(capsys, monkeypatch):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu_check.sys, "argv", ["gpu_check"])
    gpu_check.main()  # returns: exit status 0
    assert "no CUDA device on this machine: nothing to check here" in capsys.readouterr().out


@pytest.mark.parametrize(("name", "folder"), [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                               ("NVIDIA A100-SXM4-80GB", "a100"), ("Some GPU", "some-gpu")])
def test_results_go_to_a_folder_named_for_the_device_and_the_day(name, folder):
    assert gpu_check.device_folder(name, now=0.0) == f"{folder}-1970-01-01"


def test_a_step_runs_within_what_the_command_has_left_and_none_starts_once_it_is_spent(tmp_path):
    step = gpu_check.Step("quick", [sys.executable, "-c", "pass"], timeout_s=100)
    gpu_check.run_step(step, left_s=30, logs=tmp_path)
    assert step.ok and step.timeout_s == 30, "the command's time left bounds the step's own limit"
    late = gpu_check.Step("late", [sys.executable, "-c", "pass"], timeout_s=100)
    gpu_check.run_step(late, left_s=2, logs=tmp_path)
    assert late.status.startswith("not run") and not late.ok


def _hanging_step(name: str, pid_file: Path, own_session: bool) -> gpu_check.Step:
    """A step of 3 s that starts a child (in a session of its own: outside the step's group),
    writes the child's pid to pid_file, says 'started' and hangs."""
    script = (f"import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(30)'], start_new_session={own_session}); open({str(pid_file)!r}, 'w').write(str(c.pid)); "
              "print('started', flush=True); time.sleep(60)")
    return gpu_check.Step(name, [sys.executable, "-c", script], timeout_s=3)


def test_a_step_out_of_time_is_killed_with_the_processes_it_started_and_its_output_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "MIN_STEP_S", 1.0)
    pid_file = tmp_path / "child.pid"
    step = _hanging_step("hangs: a rank", pid_file, own_session=False)
    gpu_check.run_step(step, left_s=30, logs=tmp_path / "logs")
    assert step.status == "out of time (3 s)" and "started" in step.tail
    assert (tmp_path / "logs" / "hangs-a-rank.log").read_text().startswith("started")
    child = int(pid_file.read_text())
    for _ in range(50):  # killed, then reaped by init: gone within a moment
        stat = Path(f"/proc/{child}/stat")
        if not stat.parent.exists() or "Z" in stat.read_text(encoding="utf-8").split()[2]:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the step's own child outlived the step's time limit")


def test_a_step_whose_pipe_outlives_its_kill_is_given_up_and_the_command_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "KILL_WAITS", ((gpu_check.signal.SIGABRT, 0.5), (gpu_check.signal.SIGKILL, 0.5)))
    monkeypatch.setattr(gpu_check, "MIN_STEP_S", 1.0)
    pid_file = tmp_path / "escaped.pid"
    step = _hanging_step("escapes", pid_file, own_session=True)
    started = time.monotonic()
    try:
        gpu_check.run_step(step, left_s=30, logs=tmp_path / "logs")
        assert time.monotonic() - started < 15
        assert step.status == "out of time (3 s); its output was lost: a process outside its group held the pipe"
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), 9)


def test_the_engines_gap_is_the_microbatchs_time_outside_its_units_per_unit():
    rows = []
    for j, t in enumerate((0.0, 10.0)):
        rows += [dict(rank=0, minibatch=1, microbatch=j, kind="microbatch", t0=t, t1=t + 4.0),
                 dict(rank=0, minibatch=1, microbatch=j, kind="fwd", t0=t, t1=t + 1.0),
                 dict(rank=0, minibatch=1, microbatch=j, kind="bwd", t0=t + 2.0, t1=t + 3.0 + j)]
    rows.append(dict(rank=0, minibatch=1, microbatch=-1, kind="optimizer", t0=20.0, t1=30.0))
    # Microbatch 0: 4 s, units 2 s -> 1 s per unit; microbatch 1: units 3 s -> 0.5 s.
    assert gpu_check.engine_gap(pd.DataFrame(rows)) == pytest.approx(0.75)
    # A warm-up minibatch (compiling, profiled) with a large gap is left out once it is named one.
    rows += [dict(rank=0, minibatch=0, microbatch=0, kind="microbatch", t0=-50.0, t1=-10.0),
             dict(rank=0, minibatch=0, microbatch=0, kind="fwd", t0=-50.0, t1=-49.0)]
    assert gpu_check.engine_gap(pd.DataFrame(rows)) == pytest.approx(1.0)  # the median of 39, 1, 0.5
    assert gpu_check.engine_gap(pd.DataFrame(rows), warmup=1) == pytest.approx(0.75)


def test_the_simulator_half_compares_the_runs_with_both_profiles_and_the_memory_estimate(tmp_path, monkeypatch):
    shutil.copy(REPO / "results" / "gpu" / "h100-2026-11-26" / "compute.json", tmp_path / "compute.json")
    monkeypatch.setattr(gpu_check, "COMMON", [*gpu_check.COMMON[:3], "num_minibatches=2", "warmup_minibatches=0"])
    gpu_check.simulate_runs(tmp_path)
    sims = {p: pd.read_csv(tmp_path / f"sim-{p}" / "runs.csv") for p in ("h100", "measured")}
    assert all(len(t) == len(gpu_check.RUNS) and (t["status"] == "ok").all() for t in sims.values())
    # A measured run as the table would hold it: half the measured profile's speed, 10% over its estimate.
    real = sims["measured"].copy()
    real["samples_per_s"] /= 2
    real["peak_mem_mb"] = real["mem_estimate_mb"] / 0.9
    real.to_csv(tmp_path / "runs.csv", index=False)
    lines = gpu_check.comparisons(gpu_check.Findings.read(tmp_path, None), tmp_path)
    assert len(lines) == 2 + len(gpu_check.RUNS)
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[5] == "0.50" and cells[8] == "0.90", line
        # The estimate at the largest microbatch the plan holds is no more than at max_tokens.
        assert int(cells[9]) > 0 and float(cells[10]) <= float(cells[7]), line
    assert json.loads((tmp_path / "compute.json").read_text())["units"]


def test_the_commit_is_the_one_the_sending_command_named_then_the_checkouts_own(tmp_path, monkeypatch):
    """The lent machine gets a copy of the tree, without .git or with one of an older commit (as
    seen on 2026-11-27): rows and provenance name the commit from $ODC_BENCH_COMMIT where the
    device command set it, else the checkout's own, and "unknown" where nothing names one."""
    import subprocess

    from odc_bench import provenance

    plain, checkout = tmp_path / "plain", tmp_path / "checkout"
    plain.mkdir(), checkout.mkdir()
    monkeypatch.setattr(provenance, "REPO_ROOT", plain)  # no git checkout here
    monkeypatch.delenv(provenance.COMMIT_ENV, raising=False)
    assert provenance.git_commit() == "unknown"
    monkeypatch.setenv(provenance.COMMIT_ENV, "abc1234")
    assert provenance.git_commit() == "abc1234"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(checkout)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    own = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    monkeypatch.setattr(provenance, "REPO_ROOT", checkout)
    assert provenance.git_commit() == "abc1234", "the commit the command named comes first"
    monkeypatch.delenv(provenance.COMMIT_ENV)
    assert provenance.git_commit() == own


def test_the_device_command_installs_every_wheel_names_the_commit_and_packs_the_results():
    wheels = ["a-1-py3-none-any.whl", "b-2-py3-none-any.whl"]
    command = gpu_check.device_command("abc1234-dirty", wheels)
    assert all(f".whl/{w}" in command for w in wheels)
    assert "ODC_BENCH_COMMIT=abc1234-dirty" in command
    run, pack, traces = command.rsplit("; ", 2)
    assert run.endswith("python3 -m odc_bench.tools.gpu_check")
    assert pack == "tar czf $OUT/gpu.tgz --exclude='*.trace.json.gz' results/gpu"
    assert traces == "find results/gpu -name '*.trace.json.gz' | tar czf $OUT/gpu-traces.tgz -T -"
    assert len(command) <= 2000  # what the device tool takes


@pytest.mark.parametrize(("arg", "says"), [
    ("--comand", "unrecognized arguments: --comand"),
    ("--deadline=abc", "argument --deadline: must be an integer of at least 1, got 'abc'"),
    ("--deadline=10", "argument --deadline: must be more than 25 seconds"),
    ("--deadline=", "argument --deadline: must be an integer of at least 1, got ''"),
    ("--steps=", "argument --steps: no step ''; the steps are cuda_ipc-conformance,odc-equivalence,"),
    ("--steps=compute-profile,gpu-tests", "argument --steps: no step 'gpu-tests'; the steps are "),
    ("--command=x", "argument --command: ignored explicit argument 'x'"),
])
def test_an_unknown_argument_is_refused_in_one_line_before_anything_runs(arg, says, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check.sys, "argv", ["gpu_check", arg])
    monkeypatch.setattr(gpu_check, "run_step", lambda *a, **k: pytest.fail("nothing may run"))
    with pytest.raises(SystemExit) as e:
        gpu_check.main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err, err
    assert err.startswith(f"python -m odc_bench.tools.gpu_check: error: {says}"), err


def test_help_names_every_option_and_step(monkeypatch, capsys):
    """--help was an unknown argument, exit status 2."""
    monkeypatch.setattr(gpu_check.sys, "argv", ["gpu_check", "--help"])
    with pytest.raises(SystemExit) as e:
        gpu_check.main()
    out = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0
    assert all(option in out for option in ("--deadline SECONDS", "--steps NAME[,NAME...]", "--command"))
    assert ", ".join(gpu_check.slug(s.name) for s in gpu_check.steps(Path("."))) in out


def test_steps_runs_only_the_steps_it_names_and_says_so_of_the_others(tmp_path, monkeypatch):
    ran: list[str] = []
    monkeypatch.setattr(gpu_check.sys, "argv", ["gpu_check", "--steps=compute-profile,odc-equivalence",
                                                 "--deadline=400"])
    monkeypatch.setattr(gpu_check, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check.torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(gpu_check, "provenance", dict)
    monkeypatch.setattr(gpu_check, "simulate_runs", lambda out: None)
    monkeypatch.setattr(gpu_check, "run_step", lambda step, left_s, logs: ran.append(step.name))
    with pytest.raises(SystemExit):
        gpu_check.main()
    assert ran == ["odc equivalence", "compute profile"]
    summary = next((tmp_path / "results" / "gpu").glob("h200-*/summary.md")).read_text()
    said = "| primitives | not run (not among --steps; this folder may hold an earlier run's results of it) |"
    assert said in summary
    assert "under a deadline of 400 s" in summary


def test_a_deadline_other_than_six_minutes_is_said_in_the_summary(tmp_path):
    quiet = gpu_check.Step("quiet", [sys.executable, "-c", "pass"], 30)
    assert "under a deadline" not in gpu_check.summary("a GPU", [quiet], 1.0, tmp_path)
    assert "under a deadline of 420 s" in gpu_check.summary("a GPU", [quiet], 1.0, tmp_path, 420.0)


def test_without_wheels_the_command_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(gpu_check.sys, "argv", ["gpu_check", "--command"])
    with pytest.raises(SystemExit) as e:
        gpu_check.main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "run make gpu-wheels first" in err and "\n" not in err


def test_every_gpu_test_runs_in_exactly_one_step_all_of_them_first_and_at_once(tmp_path):
    """The tests run first, side by side (they time nothing); NVSHMEM's, which may hang where it
    does not refuse, a step of their own, so that a hang costs no other step's results; the steps
    that time the device each alone."""
    import subprocess

    listed = gpu_check.steps(tmp_path)
    tests = [s for s in listed if "pytest" in s.argv]
    assert [s.name for s in tests] == ["cuda_ipc conformance", "odc equivalence", "odc bf16 and dead rank",
                                       "nvshmem tests", "baseline gpu tests"]
    assert gpu_check.batches(listed)[0] == tests, "the tests first, at once"
    assert all(len(batch) == 1 for batch in gpu_check.batches(listed)[1:]), "a step that times the device, alone"
    # What each step's pytest arguments select, collected by one process (its imports made once).
    selections = [[a for a in s.argv[s.argv.index("pytest") + 1:] if not a.startswith("--junitxml")] for s in tests]
    script = ("import json, sys, pytest\n"
              "class Selected:\n"
              "    def pytest_collection_finish(self, session):\n"
              "        self.ids = [item.nodeid for item in session.items]\n"
              "found = []\n"
              "for args in json.loads(sys.argv[1]):\n"
              "    grab = Selected()\n"
              "    pytest.main(['--collect-only', '-q', *args], plugins=[grab])\n"
              "    found.append(grab.ids)\n"
              "print('SELECTED', json.dumps(found))\n")
    out = subprocess.run([sys.executable, "-c", script, json.dumps(selections)], cwd=REPO, capture_output=True,
                         text=True, timeout=120).stdout
    found = json.loads(out.split("SELECTED ", 1)[1])
    conformance, equivalence, more, nvshmem, baseline = (set(ids) for ids in found)
    parts = [conformance, equivalence, more, nvshmem, baseline]
    assert all(parts) and sum(map(len, parts)) == len(set().union(*parts)), "no test in two steps"
    assert all("nvshmem" in t for t in nvshmem) and not any("nvshmem" in t for t in set().union(*parts) - nvshmem)
    assert conformance == {t for t in conformance if t.endswith("[cuda_ipc]")} and len(conformance) == 4
    assert {t.split("::")[1].split("[")[0] for t in equivalence | more} == {
        "test_two_ranks_sharing_the_gpu_match_one_process_with_uneven_counts", "test_bf16_on_the_gpu_stays_near_fp32",
        "test_a_dead_rank_on_the_gpu_fails_the_run_by_name_and_leaves_nothing"}
    assert all(t.startswith("tests/integration/test_gpu.py::") for t in baseline)


def test_shared_steps_run_at_once_and_the_others_alone(tmp_path):
    """Two shared steps that each wait for the other's file pass only side by side; a step that
    is not shared is a batch of its own even between shared ones."""
    def waits_for(mine: str, theirs: str) -> gpu_check.Step:
        script = (f"import pathlib, time; pathlib.Path({str(tmp_path / mine)!r}).touch(); "
                  f"[time.sleep(0.05) for _ in range(200) if not pathlib.Path({str(tmp_path / theirs)!r}).exists()]; "
                  f"assert pathlib.Path({str(tmp_path / theirs)!r}).exists()")
        return gpu_check.Step(mine, [sys.executable, "-c", script], 30, shared=True)

    a, b = waits_for("a", "b"), waits_for("b", "a")
    alone = gpu_check.Step("alone", [sys.executable, "-c", "pass"], 30)
    c = gpu_check.Step("c", [], 30, shared=True)
    assert gpu_check.batches([a, b, alone, c]) == [[a, b], [alone], [c]]
    gpu_check.run_batch([a, b], left_s=30, logs=tmp_path / "logs")
    assert a.ok and b.ok, (a.status, b.status)
    assert {p.name for p in (tmp_path / "logs").iterdir()} == {"a.log", "b.log"}
    text = gpu_check.summary("a GPU", [a, b, alone], 1.0, tmp_path)
    assert "At the same time (they time nothing): a, b; the others one at a time." in text


def test_the_larger_models_layers_are_held_to_their_share_of_peak_with_varlen():
    """On the committed H100 seed's timings (varlen attention, shared/gpu/h100-2026-11-26)."""
    compute = json.loads((REPO / "results" / "gpu" / "h100-2026-11-26" / "compute.json").read_text())
    # The seed does not say which kernel ran.
    assert "not checked" in gpu_check.layer_lines(gpu_check.layer_shares(compute, 989.0), 989.0)[-1]
    for row in compute["unit_timings"]:
        row["attention"] = "varlen"
    lines = gpu_check.layer_lines(gpu_check.layer_shares(compute, 989.0), 989.0)
    cells = {(c[0], c[1], c[2]): c for c in ([x.strip() for x in line.strip("|").split("|")] for line in lines
                                             if line.startswith("| qwen"))}
    assert cells["qwen2_7b", "4", "16384"][5] == "0.48"  # 4 documents of 4K: 0.48 of 989 TFLOP/s
    assert {m for m, _, _ in cells} == {"qwen2_1p5b", "qwen2_7b", "qwen2_14b"}
    assert lines[-1].startswith("\nqwen2_7b and qwen2_14b layers with varlen: at least 0.32 of peak over 26 timings "
                                "(misses the goal of 0.4)")  # qwen2_7b on one 1K document
    compute["unit_timings"] = [r for r in compute["unit_timings"] if sum(r["doc_lens"]) == 16384]
    assert "(meets the goal of 0.4)" in gpu_check.layer_lines(gpu_check.layer_shares(compute, 989.0), 989.0)[-1]


@pytest.mark.parametrize(("device", "peak"), [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H200", 989.0),
                                              ("NVIDIA L40S", None), ("NVIDIA H100 PCIe", None),
                                              ("NVIDIA H100 NVL", None)])
def test_a_devices_peak_is_its_simulator_profiles_and_none_without_one(device, peak):
    assert gpu_check.device_peak_tflops(device) == peak


def test_a_part_that_ran_eagerly_is_in_the_summary_even_when_its_step_passed(tmp_path):
    said = "WON'T CONVERT before_attention /x/decoder.py line 151"
    step = gpu_check.Step("run", [sys.executable, "-c", f"import sys; print({said!r}, file=sys.stderr)"], 30)
    quiet = gpu_check.Step("quiet", [sys.executable, "-c", "pass"], 30)
    for s in (step, quiet):
        gpu_check.run_step(s, left_s=30, logs=tmp_path / "logs")
    assert step.ok and step.eager == [said] and quiet.eager == []
    text = gpu_check.summary("a GPU", [step, quiet], 1.0, tmp_path)
    assert f"- run: {said}" in text and "None: no step printed" not in text
    assert text.index("## Acceptance on this GPU") < text.index("## Steps"), "the verdicts come first"
    assert "None: no step printed" in gpu_check.summary("a GPU", [quiet], 1.0, tmp_path)


def test_each_recompilation_a_step_logged_is_in_the_summary_with_the_guard_it_failed(tmp_path):
    # The H200's own log: the run's two compiled parts each compiled again at a size threshold.
    log = (REPO / "results" / "gpu" / "h200-2026-11-27" / "logs" / "run-longalign-x0-125-mb8.log").read_text()
    assert gpu_check.recompiled(log) == [
        "before_attention: 1536*x.size()[0] >= 5242880  # (_inductor/scheduler.py:326 in can_fuse)",
        "after_attention: 1536*attended.size()[0] >= 5242880  # (_inductor/scheduler.py:326 in can_fuse)"]
    profile = (REPO / "results" / "gpu" / "h200-2026-11-27" / "logs" / "compute-profile.log").read_text()
    assert [r.split(":")[0] for r in gpu_check.recompiled(profile)][:4] == [
        "before_attention", "after_attention", "loss_and_grad", "before_attention"]
    # Two ranks printing at once: each recompilation keeps its own guard (keyed by pid and frame).
    rank1 = [line.replace(" 1374 ", " 1375 ").replace("1536*", "7*")
             for line in log.splitlines() if "recompiles" in line]
    mixed = [line for pair in zip(log.splitlines()[1:7], rank1, strict=True) for line in pair]
    assert gpu_check.recompiled("\n".join(mixed)) == [
        "before_attention: 1536*x.size()[0] >= 5242880  # (_inductor/scheduler.py:326 in can_fuse)",
        "before_attention: 7*x.size()[0] >= 5242880  # (_inductor/scheduler.py:326 in can_fuse)",
        "after_attention: 1536*attended.size()[0] >= 5242880  # (_inductor/scheduler.py:326 in can_fuse)",
        "after_attention: 7*attended.size()[0] >= 5242880  # (_inductor/scheduler.py:326 in can_fuse)"]
    step = gpu_check.Step("run", [sys.executable, "-c", f"print({log!r})"], 30)
    quiet = gpu_check.Step("quiet", [sys.executable, "-c", "print('Recompiling function f, no guard line')"], 30)
    for s in (step, quiet):
        gpu_check.run_step(s, left_s=30, logs=tmp_path / "logs")
    assert len(step.recompiles) == 2 and quiet.recompiles == []
    text = gpu_check.summary("a GPU", [step, quiet], 1.0, tmp_path)
    assert "- run: after_attention: 1536*attended.size()[0] >= 5242880" in text
    assert "None: no step's compiled code" not in text
    assert "None: no step's compiled code" in gpu_check.summary("a GPU", [quiet], 1.0, tmp_path)


def test_the_acceptance_table_says_met_missed_or_not_measured_for_each_gpu_point(tmp_path, monkeypatch):
    shutil.copy(REPO / "results" / "gpu" / "h100-2026-11-26" / "compute.json", tmp_path / "compute.json")
    monkeypatch.setattr(gpu_check, "COMMON", [*gpu_check.COMMON[:3], "num_minibatches=2", "warmup_minibatches=0"])
    gpu_check.simulate_runs(tmp_path)
    real = pd.read_csv(tmp_path / "sim-measured" / "runs.csv")
    there = gpu_check.largest_microbatch_estimates()
    # As fast as the measured profile said, and a peak the estimate at the largest microbatch meets.
    real["peak_mem_mb"] = [there[s, m][1] * 1024 for s, m in zip(real["length_scale"], real["minibatch_size"],
                                                                  strict=True)]
    real.to_csv(tmp_path / "runs.csv", index=False)
    pd.DataFrame([dict(op="gather", size_bytes=16 << 20, ratio_to_memcpy=0.7),
                  dict(op="gather", size_bytes=1 << 20, ratio_to_memcpy=0.1)]).to_csv(tmp_path / "primitives.csv")
    odc = [gpu_check.Step(name, [], 1, status="passed")
           for name in ("cuda_ipc conformance", "odc equivalence", "odc bf16 and dead rank")]
    done = [*odc, gpu_check.Step("baseline gpu tests", [], 1, status="failed (exit 1)"),
            gpu_check.Step("nvshmem tests", [], 1)]

    def verdicts(seconds: float) -> dict[str, tuple[str, str]]:
        rows = [[c.strip() for c in line.strip("|").split("|")]
                for line in gpu_check.acceptance(gpu_check.Findings.read(tmp_path, 989.0), done, seconds)[4:]]
        return {point.split(" (")[0]: (said, value) for point, said, value in rows}

    odc_point = ("ODC's GPU tests pass: ranks sharing the GPU against one process, bf16, a dead rank, the cuda_ipc "
                 "conformance suite")
    got = verdicts(300)
    assert got[odc_point] == ("met", "cuda_ipc conformance: passed; odc equivalence: passed; odc bf16 and dead "
                                     "rank: passed")
    assert got["the baseline's GPU tests pass: NCCL on one GPU timed on the device, varlen, the chunked loss, "
               "microbatches sent without a wait"] == ("missed", "failed (exit 1)")
    assert got["NVSHMEM on one GPU: one rank runs, two are refused"][0] == "not measured"
    assert got["qwen2_7b and qwen2_14b layers at >= 0.4 of peak with varlen"][0] == "not measured"  # kernel unrecorded
    assert got["the 1.5B runs within 25% of the simulator on the measured profile"] == ("met", "1.00, 1.00")
    assert got["the memory estimate within 10% of the peak"][0] == "met"
    assert got["gather >= 0.8 of a device copy at >= 16 MiB"] == ("missed", "lowest 0.70")
    assert got["make gpu-check within 6 minutes"] == ("met", "300 s")
    odc[2].status = "not run (the command's 6 minutes were spent)"
    assert verdicts(300)[odc_point][0] == "not measured", "one of its steps did not run"
    odc[1].status = "out of time (90 s)"
    assert verdicts(300)[odc_point][0] == "missed", "one of its steps ran and did not pass"
    real["samples_per_s"] *= 1.3
    real["peak_mem_mb"] *= 2
    real.to_csv(tmp_path / "runs.csv", index=False)
    got = verdicts(400)
    assert got["the 1.5B runs within 25% of the simulator on the measured profile"] == ("missed", "1.30, 1.30")
    assert got["the memory estimate within 10% of the peak"][0] == "missed"
    assert got["make gpu-check within 6 minutes"][0] == "missed"


def test_the_summary_says_how_much_of_the_profiled_minibatch_the_device_was_busy(tmp_path):
    from odc_bench.run.profile import operator_table

    kernel = dict(ph="X", name="gemm", cat="kernel", ts=10, dur=30, pid=1, tid=9)
    host = dict(ph="X", name="aten::mm", cat="cpu_op", ts=0, dur=200, pid=1, tid=1)
    (tmp_path / "profiles" / "run1").mkdir(parents=True)
    table = operator_table([kernel, host])
    (tmp_path / "profiles" / "run1" / "rank0.txt").write_text(f"run1, minibatch 1\n\n{table}\n")
    text = gpu_check.summary("a GPU", [], 1.0, tmp_path)
    assert "- profiles/run1/rank0.txt: Span 0.200 ms, first event to last: the device busy 0.030 ms of it (15.0%;" \
        in text
