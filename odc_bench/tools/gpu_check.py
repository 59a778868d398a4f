"""`make gpu-check`: everything a GPU machine can tell us, in one command of at most 6 minutes on
one GPU, written with provenance under results/gpu/<device>-<date>/.

The steps, in this order (steps() says why), each a subprocess with a time limit of its own (one
that fails or runs out does not stop the others, and is killed with every process it started;
the command ends with status 1 if any failed; each step's whole output is kept in logs/):
1. the tests, at the same time (none of them times the device, so they share it and the
   host's cores, and the whole takes as long as the longest): the transport conformance suite
   on cuda_ipc, 3 ranks sharing the GPU (tests-conformance.xml); ODC's equivalence tests, ranks
   sharing the GPU against one process (tests-odc.xml); ODC's bf16 and dead-rank tests
   (tests-odc-more.xml); NVSHMEM's, what one GPU allows (nvshmem.xml); the baseline's
   (tests/integration/test_gpu.py: tests.xml);
then, one at a time, as each times the device:
2. the primitives on cuda_ipc, 2 ranks sharing the GPU, 1 MiB to 256 MiB, against a device copy;
3. two collective runs of qwen2_1p5b on one GPU (the configs the 2026-11-26 H100 measurement
   ran: shared/gpu/h100-2026-11-26), the first with its second warm-up minibatch under
   torch.profiler (profiles/<run_id>/: where a minibatch's host and device time go);
4. the unit compute profile (odc_bench.calibrate.cost_model on CUDA, reduced grid), with one layer
   of qwen2_7b and of qwen2_14b timed beside qwen2_1p5b's: compute.json;
then, in this process, the simulator's prediction of each run on the H100 profile and on the
profile this machine just measured (compute.json, with the gap per unit the collective engine
left in the runs' device-timed traces), and summary.md: the GPU acceptance points of issues 43
and 44, each met, missed or not measured, then every number and ratio (the memory estimate
beside the peak, each timed layer's share of the device's peak), and what did not pass.

On a machine without CUDA it says so and exits 0: there is nothing to check. With `--command` it
prints the one command that runs it on a lent GPU machine (docs/gpu.md), for this checkout;
with `--deadline=SECONDS` it runs under another deadline than 6 minutes (its summary says so, and
the 6-minute point is judged as ever); with `--steps=NAME,...` only those steps (a rerun of what
failed, in the same results folder).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from odc_bench.config.compose import string_override
from odc_bench.errors import CommandParser, command_name, ends_cleanly, positive_int
from odc_bench.files import atomic_write_text
from odc_bench.provenance import COMMIT_ENV, REPO_ROOT, git_commit

# The two runs the H100 measurement made (shared/gpu/h100-2026-11-26/README.md), shortened to a
# few minibatches: the first two are warm-up (compilation, then the profiled one) and excluded
# from every metric.
RUNS = {
    "longalign-x0.125-mb8": ["dataset.length_scale=0.125", "minibatch_size=8", "max_tokens=8192"],
    "longalign-x1/32-mb32": ["dataset.length_scale=0.03125", "minibatch_size=32", "max_tokens=4096"],
}
COMMON = ["model=qwen2_1p5b", "world_size=1", "precision=bf16", "num_minibatches=5", "warmup_minibatches=2"]
PROFILED = "profile_minibatch=1"  # the first run's: after compilation, before the measured minibatches
GOAL_RATIO = 0.8  # gather against a device copy at >= 16 MiB (issue 44)
# Timed beside qwen2_1p5b in the compute profile: their layers' share of the device's peak with
# the varlen kernel (goal: LAYER_GOAL, issue 43), and the profile's fit across model sizes.
LARGE_MODELS = ("qwen2_7b", "qwen2_14b")
LAYER_GOAL = 0.4
RUN_GOAL = 0.25  # the 1.5B runs' samples/s against the simulator's on the measured profile (issue 43)
MEMORY_GOAL = 0.10  # the memory estimate against the measured peak (issue 43)
# The whole command fits a device loan's slot: no step runs past the deadline less what the
# simulator and the summary need after the last one, whatever the steps' own limits add up to.
DEADLINE_S = 360.0
RESERVE_S = 25.0
MIN_STEP_S = 5.0  # a step with less time left than this is not started: it could tell nothing


# What torch.compile prints where a compiled part of the model runs eagerly after all:
# compile_dense suppresses the error (the run goes on) and Dynamo logs it, or it hit the limit
# of recompilations. A run that passes can be slow for this reason alone: the summary says so.
EAGER_MARKERS = ("WON'T CONVERT", "torch._dynamo hit config.")
# What TORCH_LOGS=recompiles prints (the steps' default): a function compiled again, then the
# guards of its earlier compilations that the new inputs failed. Each costs seconds per process;
# a different model's sizes must recompile, a size crossing a compiler's heuristic need not.
# Lines are keyed by their process (the pid the log prints) and Dynamo's frame id, so the ranks of
# one step, printing at once, do not mix their lines up.
RECOMPILED = re.compile(r" (\d+) \S+\] \[(\d+/\d+)\] \[__recompiles\] Recompiling function (\S+)")
FAILED_GUARD = re.compile(r" (\d+) \S+\] \[(\d+/\d+)\] \[__recompiles\]\s+- \S+: (.*)$")

# A step out of time: SIGABRT to its process group (each Python process prints its stack), then
# SIGKILL, each followed by a bounded wait for the output: a process that left the group may
# still hold the pipe, and the command must go on.
KILL_WAITS = ((signal.SIGABRT, 5.0), (signal.SIGKILL, 20.0))


@dataclass
class Step:
    name: str
    argv: list[str]
    timeout_s: float
    status: str = "not run"
    seconds: float = 0.0
    tail: str = ""
    eager: list[str] = field(default_factory=list)  # the step's EAGER_MARKERS lines, the first few
    recompiles: list[str] = field(default_factory=list)  # recompiled(): "function: first failed guard"
    shared: bool = False  # times nothing, so it runs beside the other shared steps next to it (steps())

    @property
    def ok(self) -> bool:
        return self.status == "passed"


def device_folder(device_name: str, now: float | None = None) -> str:
    """<device>-<date>: the GPU's short name (h100, h200, a100, ...) and the day."""
    short = re.search(r"\b([A-Z]\d{2,3}[A-Z]?)\b", device_name)
    tag = (short.group(1) if short else re.sub(r"\W+", "-", device_name).strip("-")).lower()
    return f"{tag}-{time.strftime('%Y-%m-%d', time.localtime(now))}"


def provenance() -> dict:
    """Where the numbers come from: the device, its driver, CUDA, torch, Triton, the commit, the command."""
    driver = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    triton_version = ""
    with contextlib.suppress(ImportError):
        import triton

        triton_version = triton.__version__
    return dict(device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "", driver=driver,
                cuda=torch.version.cuda or "", torch=torch.__version__, triton=triton_version,
                python=platform.python_version(), host=platform.node(), commit=git_commit(),
                date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                command="make gpu-check" if os.environ.get("MAKELEVEL") else
                " ".join([f"{Path(sys.executable).name} -m odc_bench.tools.gpu_check", *sys.argv[1:]]))


def device_command(commit: str, wheels: list[str]) -> str:
    """The one command for a lent GPU machine: install the wheels that machine lacks (carried in
    .whl), name the commit (the copy it gets may have no .git, or an older one), run the check
    with the machine's own python3 (what `make gpu-check` runs there; make itself may be
    missing), pack what it wrote. The profiles' Chrome traces go in an archive of their own: the
    device tool returns no file over 16 MiB, and a large trace must not cost the results."""
    return ("python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "
            f"{' '.join('.whl/' + w for w in wheels)} && export PYTHONPATH=/tmp/site:$PWD {COMMIT_ENV}={commit} "
            "&& python3 -m odc_bench.tools.gpu_check; tar czf $OUT/gpu.tgz --exclude='*.trace.json.gz' results/gpu; "
            "find results/gpu -name '*.trace.json.gz' | tar czf $OUT/gpu-traces.tgz -T -")


def command_here() -> str:
    """device_command for this checkout: its commit (marked -dirty where the tree has changes the
    commit lacks) and the wheels `make gpu-wheels` left in .whl."""
    wheels = sorted(p.name for p in (REPO_ROOT / ".whl").glob("*.whl"))
    if not wheels:
        print("gpu-check: no wheels in .whl: run make gpu-wheels first (docs/gpu.md)", file=sys.stderr)
        sys.exit(2)
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                             capture_output=True, text=True).stdout.strip()
    return device_command(git_commit() + ("-dirty" if changed else ""), wheels)


def steps(out: Path) -> list[Step]:
    """The steps in the order they run: where the command's time runs out, the later ones are cut.
    The tests first, all at once (`shared`): none of them times anything, so running them side
    by side costs no number its meaning, and the whole takes as long as the longest of them
    rather than their sum (on the H200, one after another, they spent the step's 110 s before
    ODC's bf16 test ended: results/gpu/h200-2026-11-27). Each test file, or part of one, is a
    step of its own, so that no file's time starves another's, and ODC's tests, which the GPU
    has run the least of, are split in two. Then the steps that time the device, one at a time,
    by what each has left to tell: the primitives, short and ODC's one measured goal; the runs
    (they alone decide the memory point and hold the profiled minibatch); the compute profile.
    The steps' own limits add up to more than the deadline: each is what that step may need,
    and where the earlier ones need less, the later ones run."""
    py = [sys.executable]
    # -v with each test's time, and the durations: which test took the step's time; pytest's own
    # faulthandler_timeout prints where a test is after that long, so a hang shows where it hangs.
    pytest = [*py, "-m", "pytest", "-v", "-o", "console_output_style=times", "-rs", "-p", "no:cacheprovider",
              "--durations=0", "-o", "faulthandler_timeout=40"]
    odc, conformance = "tests/integration/test_gpu_odc.py", "tests/integration/test_transport_conformance.py"

    def tests(name: str, xml: str, args: list[str], limit: float) -> Step:
        return Step(name, [*pytest, f"--junitxml={out / xml}", *args], limit, shared=True)

    listed = [tests("cuda_ipc conformance", "tests-conformance.xml",
                    ["-k", "cuda_ipc", conformance], 60),
              tests("odc equivalence", "tests-odc.xml", ["-k", "sharing_the_gpu_match", odc], 90),
              tests("odc bf16 and dead rank", "tests-odc-more.xml", ["-k", "bf16 or dead_rank", odc], 75),
              # NVSHMEM may hang at its start where it does not refuse: the step's limit bounds it.
              tests("nvshmem tests", "nvshmem.xml", ["-k", "nvshmem", conformance, odc], 45),
              tests("baseline gpu tests", "tests.xml", ["tests/integration/test_gpu.py"], 75),
              Step("primitives", [*py, "-m", "odc_bench", "task=primitives", "world_size=2",
                                  "primitives.transport=cuda_ipc", "primitives.min_bytes=1048576",
                                  "primitives.max_bytes=268435456", "primitives.rounds=5", "primitives.turn_s=0.02",
                                  string_override("results_dir", out)], 25)]
    listed += [Step(f"run {name}", [*py, "-m", "odc_bench", "device=cuda", *COMMON, *overrides,
                                    *([PROFILED] if i == 0 else []), string_override("results_dir", out)], limit)
               for i, ((name, overrides), limit) in enumerate(zip(RUNS.items(), (75, 60), strict=True))]
    listed.append(Step("compute profile", [*py, "-m", "odc_bench.calibrate.cost_model", "--reduced",
                                           f"--unit-models={','.join(LARGE_MODELS)}", "device=cuda",
                                           "model=qwen2_1p5b", "precision=bf16",
                                           string_override("balancer.calibration", out / "compute.json"),
                                           "max_tokens=8192"], 100))
    return listed


def batches(listed: list[Step]) -> list[list[Step]]:
    """The steps as they run: each run of consecutive shared steps together, every other step alone."""
    out: list[list[Step]] = []
    for step in listed:
        if step.shared and out and out[-1][0].shared:
            out[-1].append(step)
        else:
            out.append([step])
    return out


def run_batch(batch: list[Step], left_s: float, logs: Path) -> None:
    """Run the steps of a batch at once (run_step each, on a thread of its own: each waits for its
    own process and reads its output), within their own limits and the `left_s` seconds left."""
    if len(batch) == 1:
        run_step(batch[0], left_s, logs)
        return
    with ThreadPoolExecutor(len(batch)) as pool:
        for finished in [pool.submit(run_step, step, left_s, logs) for step in batch]:
            finished.result()


def run_step(step: Step, left_s: float, logs: Path) -> None:
    """Run one step within its own limit and the `left_s` seconds the command has left; its whole
    output goes to logs/<step>.log. The step runs in a process group of its own, killed whole when
    it runs out of time: a test's ranks left running would hold the GPU through the next steps."""
    step.timeout_s = min(step.timeout_s, left_s)
    if step.timeout_s < MIN_STEP_S:
        step.status = "not run (the command's 6 minutes were spent)"
        print(f"gpu-check: {step.name}: {step.status}", flush=True)
        return
    t0 = time.monotonic()
    # Python's faulthandler in every process of the step, and SIGABRT first at the time limit:
    # each process prints where it was before it goes (TORCH_LOGS: what Dynamo recompiled, where
    # compiled code broke its graph, the reasons a run is slow for its compiling alone).
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1",
           "TORCH_LOGS": os.environ.get("TORCH_LOGS", "recompiles,graph_breaks")}
    proc = subprocess.Popen(step.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT,
                            env=env, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=step.timeout_s)
        step.status = "passed" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired:
        output, step.status = "", f"out of time ({step.timeout_s:.0f} s)"
        for sig, wait_s in KILL_WAITS:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                output, _ = proc.communicate(timeout=wait_s)
                break
        else:
            step.status += "; its output was lost: a process outside its group held the pipe"
    step.tail = output[-4000:]
    step.eager = [line for line in output.splitlines() if any(m in line for m in EAGER_MARKERS)][:5]
    step.recompiles = recompiled(output)
    logs.mkdir(exist_ok=True)
    atomic_write_text(logs / (slug(step.name) + ".log"), output)
    step.seconds = time.monotonic() - t0
    print(f"gpu-check: {step.name}: {step.status} in {step.seconds:.0f} s", flush=True)


def recompiled(output: str) -> list[str]:
    """Each recompilation TORCH_LOGS=recompiles printed, as "function: the first guard it failed",
    in order (a rank's lines stay in order within the merged output)."""
    found: list[str] = []
    pending: dict[tuple[str, str], str] = {}  # (pid, frame) -> the function awaiting its guard line
    for line in output.splitlines():
        if started := RECOMPILED.search(line):
            pending[started.group(1), started.group(2)] = started.group(3)
        elif (guard := FAILED_GUARD.search(line)) and (function := pending.pop((guard[1], guard[2]), None)):
            found.append(f"{function}: {guard.group(3).strip()}")
    return found


def engine_gap(trace: pd.DataFrame, warmup: int = 0) -> float:
    """Device seconds per unit span that lie in a microbatch but in no unit's span: what the
    engine's own work leaves the device idle for, in line with compute (median over the
    microbatches of the measured minibatches: the `warmup` first ones compile and profile)."""
    gaps = []
    measured = trace[(trace["microbatch"] >= 0) & (trace["minibatch"] >= warmup)]
    for _, mb in measured.groupby(["rank", "minibatch", "microbatch"]):
        spans, whole = mb[mb["kind"].isin(["fwd", "bwd"])], mb[mb["kind"] == "microbatch"]
        if len(whole) and len(spans):
            idle = float((whole["t1"] - whole["t0"]).iloc[0] - (spans["t1"] - spans["t0"]).sum())
            gaps.append(max(0.0, idle) / len(spans))
    return float(pd.Series(gaps).median()) if gaps else 0.0


def add_engine_gap(out: Path) -> None:
    """Put the collective engine's measured gap into compute.json, where the simulator reads it."""
    runs, compute = out / "runs.csv", out / "compute.json"
    if not (runs.exists() and compute.exists()):
        return
    table = pd.read_csv(runs)
    ok = table[(table["status"] == "ok") & (table["engine"] == "collective")]
    gaps = [engine_gap(pd.read_csv(out / trace), int(warmup))
            for trace, warmup in zip(ok["trace"], ok["warmup_minibatches"], strict=True)]
    if gaps:
        record = json.loads(compute.read_text())
        record["engine_gaps"] = {"collective": float(pd.Series(gaps).median())}
        atomic_write_text(compute, json.dumps(record, indent=1) + "\n")


def simulate_runs(out: Path) -> None:
    """The simulator on the runs' configs, on the H100 profile as committed and, where this
    machine measured one, on its own compute profile; rows under sim-<profile>/."""
    from odc_bench.config.compose import compose_run
    from odc_bench.jobs.train import execute
    from odc_bench.plan.spec import resolve

    profiles: dict[str, list[str]] = {"h100": []}
    if (out / "compute.json").exists():
        profiles["measured"] = [string_override("backend.hardware.compute_calibration", out / "compute.json"),
                                "backend.hardware.name=measured"]
    for profile, extra in profiles.items():
        for overrides in RUNS.values():
            config = compose_run(["backend=sim", "backend/hardware=h100", *COMMON, *overrides, *extra,
                                  string_override("results_dir", out / f"sim-{profile}")])
            execute(resolve(config), Path(config.results_dir))


def largest_microbatch_estimates() -> dict[tuple[float, int], tuple[int, float]]:
    """Per run (length scale, minibatch size): its largest planned microbatch in tokens and the
    memory estimate (GiB) at that size. The row's estimate is at max_tokens, the largest
    microbatch the limit allows; a run whose samples are all shorter never gets near it."""
    from odc_bench.config.compose import compose_run
    from odc_bench.plan.spec import resolve

    out = {}
    for overrides in RUNS.values():
        spec = resolve(compose_run(["backend=sim", "backend/hardware=h100", *COMMON, *overrides]))
        largest = max(sum(mb.lengths[i] for i in micro) for mb in spec.minibatches for rank in mb.plan
                      for micro in rank)
        out[spec.config.dataset.length_scale, spec.config.minibatch_size] = (
            largest, spec.memory_at(largest).total / 2**30)
    return out


def device_peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of this GPU's simulator profile (conf/backend/hardware/<tag>.yaml), or
    None where the project has no profile of it. The profiles are of the SXM parts; a PCIe or NVL
    card of the same name runs at a lower power limit (350 W for the H100 PCIe, against up to
    700 W for the SXM part, in NVIDIA's product briefs), so its peak is not the profile's: None."""
    from odc_bench.config.backend import GpuHardwareConfig, SimBackendConfig
    from odc_bench.config.compose import compose_run

    if re.search(r"\b(PCIe|NVL)\b", device_name, re.IGNORECASE):
        return None
    tag = device_folder(device_name).rsplit("-", 3)[0]
    if not (REPO_ROOT / "odc_bench" / "conf" / "backend" / "hardware" / f"{tag}.yaml").exists():
        return None
    backend = compose_run(["backend=sim", f"backend/hardware={tag}"]).backend
    hardware = backend.hardware if isinstance(backend, SimBackendConfig) else None
    return hardware.peak_tflops if isinstance(hardware, GpuHardwareConfig) else None


def layer_shares(compute: dict, peak_tflops: float) -> pd.DataFrame:
    """The compute profile's layer timings against the device's peak (sim/unit_fit.py)."""
    from odc_bench.config.compose import compose_runs
    from odc_bench.sim.unit_fit import layer_peak_shares

    rows = compute.get("unit_timings", [])
    names = sorted({r["model"] for r in rows})
    models = dict(zip(names, (c.model for c in compose_runs([[f"model={n}"] for n in names])), strict=True))
    return pd.DataFrame(layer_peak_shares(rows, models, peak_tflops),
                        columns=["model", "doc_lens", "tokens", "attention", "tflops", "share"])


def large_layers_worst(shares: pd.DataFrame) -> float | None:
    """The lowest share of peak of a LARGE_MODELS layer timed with varlen; None where none was."""
    varlen = shares[shares["model"].isin(LARGE_MODELS) & (shares["attention"] == "varlen")]
    return float(varlen["share"].min()) if len(varlen) else None


def layer_lines(shares: pd.DataFrame, peak_tflops: float) -> list[str]:
    """summary.md's layers against the device's peak (layer_shares of the compute profile), and
    the larger models' against LAYER_GOAL."""
    if shares.empty:
        return []
    lines = [f"\nOne layer, forward + backward, against the device's peak ({peak_tflops:g} TFLOP/s, bf16 dense; "
             "FLOPs as models/flops.py counts them):", "",
             "| model | documents | tokens | attention | TFLOP/s | share of peak |", "|---|---|---|---|---|---|"]
    lines += [f"| {r.model} | {len(r.doc_lens)} | {r.tokens} | {r.attention or 'not recorded'} | {r.tflops:.0f} | "
              f"{r.share:.2f} |" for r in shares.itertuples()]
    if shares["model"].isin(LARGE_MODELS).any():
        worst = large_layers_worst(shares)
        if worst is None:
            lines.append(f"\n{' and '.join(LARGE_MODELS)} layers: none timed with the varlen kernel, so the goal of "
                         f"{LAYER_GOAL} of peak with varlen is not checked")
        else:
            timed = int((shares["model"].isin(LARGE_MODELS) & (shares["attention"] == "varlen")).sum())
            verdict = "meets" if worst >= LAYER_GOAL else "misses"
            lines.append(f"\n{' and '.join(LARGE_MODELS)} layers with varlen: at least {worst:.2f} of peak over "
                         f"{timed} timings ({verdict} the goal of {LAYER_GOAL})")
    return lines


@dataclass
class RunCheck:
    """One real run beside the simulator's prediction of it and its memory estimates."""

    name: str
    samples_per_s: float
    simulated: dict[str, float]  # samples/s by profile (h100, measured); NaN where not simulated
    peak_gib: float
    estimate_gib: float  # the row's: at max_tokens
    largest_tokens: int  # the largest microbatch the plan holds, and the estimate there
    estimate_there_gib: float


def run_checks(out: Path) -> list[RunCheck]:
    """The runs that ended ok in runs.csv, each with what sim-<profile>/ predicted for its config."""
    if not (out / "runs.csv").exists():
        return []
    real = pd.read_csv(out / "runs.csv")
    sims = {p: pd.read_csv(out / f"sim-{p}" / "runs.csv") for p in ("h100", "measured")
            if (out / f"sim-{p}" / "runs.csv").exists()}
    at_largest = largest_microbatch_estimates()
    checks = []
    for _, r in real[real["status"] == "ok"].iterrows():
        simulated = {}
        for profile in ("h100", "measured"):
            table = sims.get(profile, pd.DataFrame(columns=["length_scale", "minibatch_size", "samples_per_s"]))
            match = table[(table["length_scale"] == r["length_scale"])
                          & (table["minibatch_size"] == r["minibatch_size"])]
            simulated[profile] = float(match["samples_per_s"].iloc[-1]) if len(match) else float("nan")
        tokens, there = at_largest.get((r["length_scale"], r["minibatch_size"]), (0, float("nan")))
        checks.append(RunCheck(f"length x{r['length_scale']}, minibatch {r['minibatch_size']}", r["samples_per_s"],
                               simulated, r["peak_mem_mb"] / 1024, r["mem_estimate_mb"] / 1024, tokens, there))
    return checks


def gather_worst(out: Path) -> float | None:
    """gather's lowest ratio to the device copy at >= 16 MiB in primitives.csv; None without one."""
    if not (out / "primitives.csv").exists():
        return None
    table = pd.read_csv(out / "primitives.csv")
    gather = table[(table["op"] == "gather") & (table["size_bytes"] >= 16 << 20)]
    return float(gather["ratio_to_memcpy"].min()) if len(gather) else None


@dataclass(frozen=True)
class Findings:
    """What summary.md reads of the results, read once for its acceptance table and its
    comparisons: the runs beside the simulator, the layers against the device's peak (None
    without a peak or a compute profile), and gather's lowest ratio to a device copy."""

    checks: list[RunCheck]
    shares: pd.DataFrame | None
    peak_tflops: float | None
    gather: float | None

    @classmethod
    def read(cls, out: Path, peak_tflops: float | None) -> Findings:
        compute = out / "compute.json"
        shares = (layer_shares(json.loads(compute.read_text()), peak_tflops)
                  if peak_tflops is not None and compute.exists() else None)
        return cls(run_checks(out), shares, peak_tflops, gather_worst(out))


def comparisons(found: Findings, out: Path) -> list[str]:
    """The lines of summary.md that set the results side by side: each run against the simulator,
    its memory against the estimate, the layers against the device's peak (where known), the
    profiles written under `out`, and the primitives against their goal."""
    lines = []
    checks = found.checks
    if checks:
        lines += ["| run | measured samples/s | simulated, h100 | measured / simulated | simulated, measured profile "
                  "| measured / simulated | peak memory GiB | estimate GiB (at max_tokens) | estimate / peak | largest "
                  "microbatch, tokens | estimate there GiB | estimate there / peak |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in checks:
            cells = [f"{c.simulated[p]:.3g} | {c.samples_per_s / c.simulated[p]:.2f}" for p in ("h100", "measured")]
            lines.append(f"| {c.name} | {c.samples_per_s:.3g} | {' | '.join(cells)} | {c.peak_gib:.1f} | "
                         f"{c.estimate_gib:.1f} | {c.estimate_gib / c.peak_gib:.2f} | {c.largest_tokens} | "
                         f"{c.estimate_there_gib:.1f} | {c.estimate_there_gib / c.peak_gib:.2f} |")
    if found.shares is not None and found.peak_tflops is not None:
        lines += layer_lines(found.shares, found.peak_tflops)
    profiled = sorted(out.glob("profiles/*/rank*.txt"))
    if profiled:
        lines.append("\nOne warm-up minibatch under torch.profiler, operators by device time: "
                     + ", ".join(str(p.relative_to(out)) for p in profiled))
        # run/profile.py's first line where the device ran: how much of the minibatch it was busy
        lines += [f"- {p.relative_to(out)}: {line}" for p in profiled
                  for line in p.read_text().splitlines() if line.startswith("Span ")]
    if found.gather is not None:
        verdict = "meets" if found.gather >= GOAL_RATIO else "misses"
        lines.append(f"\ngather at >= 16 MiB: at least {found.gather:.2f} of the device copy's rate ({verdict} the "
                     f"goal of {GOAL_RATIO})")
    return lines


def acceptance(found: Findings, done: list[Step], seconds: float) -> list[str]:
    """The GPU acceptance points of issues 43 and 44, each met, missed or not measured, with what
    decided it: the table a session reads first."""
    def verdict(ok: bool | None) -> str:
        return "not measured" if ok is None else "met" if ok else "missed"

    def step(*names: str) -> tuple[str, str]:
        """Missed where one of the named steps ran and did not pass, met where all passed, else not
        measured."""
        found = [s for s in done if s.name in names]
        ran = [s for s in found if not s.status.startswith("not run")]
        ok = False if not all(s.ok for s in ran) else True if len(ran) == len(names) else None
        return (verdict(ok),
                "; ".join(f"{s.name}: {s.status}" if len(names) > 1 else s.status for s in found) or "not run")

    rows = [("ODC's GPU tests pass: ranks sharing the GPU against one process, bf16, a dead rank, the cuda_ipc "
             "conformance suite (44)", *step("cuda_ipc conformance", "odc equivalence", "odc bf16 and dead rank")),
            ("the baseline's GPU tests pass: NCCL on one GPU timed on the device, varlen, the chunked loss, "
             "microbatches sent without a wait (43)", *step("baseline gpu tests")),
            ("NVSHMEM on one GPU: one rank runs, two are refused (44)", *step("nvshmem tests"))]
    worst = None if found.shares is None else large_layers_worst(found.shares)
    rows.append((f"{' and '.join(LARGE_MODELS)} layers at >= {LAYER_GOAL} of peak with varlen (43)",
                 verdict(None if worst is None else worst >= LAYER_GOAL),
                 "no varlen timing of them" if worst is None else f"lowest {worst:.2f}"))
    checks = found.checks
    ratios = [c.samples_per_s / c.simulated["measured"] for c in checks]
    measured = [r for r in ratios if r == r]  # NaN where the measured profile was not simulated
    rows.append((f"the 1.5B runs within {RUN_GOAL:.0%} of the simulator on the measured profile (43)",
                 verdict(None if len(measured) < len(RUNS) else all(abs(r - 1) <= RUN_GOAL for r in measured)),
                 ", ".join(f"{r:.2f}" for r in ratios) or "no run"))
    there = [c.estimate_there_gib / c.peak_gib for c in checks]
    rows.append((f"the memory estimate within {MEMORY_GOAL:.0%} of the peak (43)",
                 verdict(None if len(there) < len(RUNS) else all(abs(r - 1) <= MEMORY_GOAL for r in there)),
                 "estimate / peak at the largest planned microbatch " + (", ".join(f"{r:.2f}" for r in there) or "-")
                 + "; at max_tokens " + (", ".join(f"{c.estimate_gib / c.peak_gib:.2f}" for c in checks) or "-")))
    gather = found.gather
    rows.append((f"gather >= {GOAL_RATIO} of a device copy at >= 16 MiB (44)",
                 verdict(None if gather is None else gather >= GOAL_RATIO),
                 "no primitives" if gather is None else f"lowest {gather:.2f}"))
    rows.append((f"make gpu-check within {DEADLINE_S / 60:.0f} minutes (43)", verdict(seconds <= DEADLINE_S),
                 f"{seconds:.0f} s"))
    return ["## Acceptance on this GPU", "", "| point (issue) | verdict | measured |", "|---|---|---|",
            *(f"| {point} | {said} | {value} |" for point, said, value in rows)]


def summary(device: str, done: list[Step], seconds: float, out: Path, deadline_s: float = DEADLINE_S) -> str:
    found = Findings.read(out, device_peak_tflops(device))
    lines = [f"# make gpu-check on {device}", "", *acceptance(found, done, seconds), "", "## Steps", "",
             "| step | status | seconds |", "|---|---|---|",
             *(f"| {s.name} | {s.status} | {s.seconds:.0f} |" for s in done), "",
             *([f"At the same time (they time nothing): {', '.join(s.name for s in together)}; the others one at a "
                "time.", ""] if (together := [s for s in done if s.shared and s.seconds]) else []),
             f"In all {seconds:.0f} s" + (f", under a deadline of {deadline_s:.0f} s (--deadline; "
                                          f"{DEADLINE_S:.0f} s by default)." if deadline_s != DEADLINE_S else "."), "",
             *comparisons(found, out)]
    eager = [s for s in done if s.eager]
    lines += ["", "## Compiled parts that ran eagerly", ""]
    lines += [f"- {s.name}: {line.strip()}" for s in eager for line in s.eager] or [
        "None: no step printed Dynamo's WON'T CONVERT or a recompile limit."]
    lines += ["", "## Recompilations (TORCH_LOGS=recompiles)", ""]
    lines += [f"- {s.name}: {line}" for s in done for line in s.recompiles] or [
        "None: no step's compiled code was compiled again."]
    failed = [s for s in done if not s.ok]
    if failed:
        lines += ["", "## What the failed steps printed", ""]
        for s in failed:
            lines += [f"### {s.name}", "", f"`{shlex.join(s.argv)}`", "", "```", s.tail, "```", ""]
    return "\n".join(lines) + "\n"


def slug(name: str) -> str:
    """A step's name as --steps and logs/ spell it: odc-gpu-tests, compute-profile, ..."""
    return re.sub(r"\W+", "-", name).strip("-")


def parse_args(args: list[str]) -> tuple[float, set[str] | None, bool]:
    """(deadline in seconds, the steps --steps selects or None for all, --command); one line and
    exit status 2 for anything else."""
    known = [slug(s.name) for s in steps(Path("."))]

    def deadline(text: str) -> float:
        value = positive_int(text)
        if value <= RESERVE_S:
            raise argparse.ArgumentTypeError(f"must be more than {RESERVE_S:.0f} seconds, what the simulator and the "
                                             f"summary need after the steps; got {value}")
        return float(value)

    def step_names(text: str) -> set[str]:
        names = text.split(",")
        unknown = [n for n in names if n not in known]
        if unknown:
            raise argparse.ArgumentTypeError(f"no step {', '.join(map(repr, unknown))}; the steps are "
                                             f"{','.join(known)}")
        return set(names)

    ap = CommandParser(command_name(__spec__.name), description=__doc__.split("\n\n")[0])
    ap.add_argument("--deadline", type=deadline, default=DEADLINE_S, metavar="SECONDS",
                    help="run under this deadline instead of 6 minutes (the summary says so)")
    ap.add_argument("--steps", type=step_names, default=None, metavar="NAME[,NAME...]",
                    help=f"only these steps, a rerun of what failed in the same results folder: {', '.join(known)}")
    ap.add_argument("--command", action="store_true",
                    help="print the one command that runs this on a lent GPU machine, for this checkout (docs/gpu.md)")
    parsed = ap.parse_args(args)
    if parsed.command and len(args) > 1:
        ap.error("--command takes no other argument")
    return parsed.deadline, parsed.steps, parsed.command


def main() -> None:
    deadline_s, selected, command = parse_args(sys.argv[1:])
    if command:
        print(command_here())
        return
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device on this machine: nothing to check here (run make gpu-check on a GPU "
              "machine; docs/gpu.md)")
        return
    device = torch.cuda.get_device_name(0)
    out = REPO_ROOT / "results" / "gpu" / device_folder(device)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "provenance.json", json.dumps(provenance(), indent=1) + "\n")
    started = time.monotonic()
    done = steps(out)
    for step in done:
        if selected is not None and slug(step.name) not in selected:
            step.status = "not run (not among --steps; this folder may hold an earlier run's results of it)"
    for batch in batches([s for s in done if selected is None or slug(s.name) in selected]):
        run_batch(batch, deadline_s - RESERVE_S - (time.monotonic() - started), out / "logs")
    add_engine_gap(out)
    simulated = Step("simulator", [sys.executable, "-m", "odc_bench.tools.gpu_check"], 60)
    t0 = time.monotonic()
    try:
        simulate_runs(out)
        simulated.status = "passed"
    except Exception as e:  # the summary reports it; the other steps' results stand
        simulated.status, simulated.tail = "failed", repr(e)
    simulated.seconds = time.monotonic() - t0
    done.append(simulated)
    text = summary(device, done, time.monotonic() - started, out, deadline_s)
    atomic_write_text(out / "summary.md", text)
    print(text + f"gpu-check: wrote {out}")
    sys.exit(0 if all(s.ok for s in done) else 1)


if __name__ == "__main__":
    with ends_cleanly(command_name(__spec__.name)):
        main()
