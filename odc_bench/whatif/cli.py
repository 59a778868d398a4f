"""The what-if's command line, `python -m odc_bench.whatif LENGTHS [options] [key=value ...]`
(settings anywhere on the line): its options, and the verdict it prints and writes. See
odc_bench/whatif/__init__.py; __main__.py starts it."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from collections.abc import Sequence
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from odc_bench.config.backend import CalibratedHardwareConfig, GpuHardwareConfig, SimBackendConfig
from odc_bench.data.lengths import dataset_lengths
from odc_bench.data.profiles import PROFILES
from odc_bench.errors import CommandParser, ConfigError, fail
from odc_bench.files import atomic_paths, writable_folder
from odc_bench.forked import Helper, HelperGone, usable_cpus
from odc_bench.models.memory import unit_params
from odc_bench.plan.spec import RunSpec
from odc_bench.provenance import host_fingerprint
from odc_bench.whatif import PROG
from odc_bench.whatif.accuracy import Accuracy, best_validated, calibrated_elsewhere, gpu_of, summary, validated
from odc_bench.whatif.answer import verdict
from odc_bench.whatif.fit import advice as ways
from odc_bench.whatif.question import HARDWARE, MODELS, Question, in_user_terms
from odc_bench.whatif.report import describe_pool, print_table, verdict_lines, write_csv

if TYPE_CHECKING:
    import pandas as pd

# The GPU the what-if asks about when --hardware is not given: its best validated profile is the default.
DEFAULT_GPU = "a100"
# Exit status when no series fits in memory at any minibatch size (2 stays bad input).
NOTHING_FITS = 3
# A harness setting as Hydra writes it (key=value, +key=value, ++key=value, ~key): never an option.
OVERRIDE = re.compile(r"^(\+{0,2}[A-Za-z_][\w.@/-]*=|~[A-Za-z_])")


def parser() -> argparse.ArgumentParser:
    ap = CommandParser(
        PROG,
        description="Will ODC pay off for my data, my model and my cluster? Simulates every series the registries "
                    "name (Collective and ODC with LocalSort, LB-Micro, LB-Mini) at each minibatch size and prints "
                    "the verdict: predicted throughput, speedup over Collective + LB-Micro with the simulator's "
                    "validated error, bubble, the bubble no balancer can remove, and memory per device. On GPUs the "
                    "collective baseline has been measured; ODC's GPU path has run its first tests on one GPU but "
                    "has not been measured there yet (docs/transport.md), so its GPU numbers come from here.",
        epilog="Example: python -m odc_bench.whatif examples/lengths.jsonl --model qwen2_7b --hardware a100 "
               "--nodes 8 --devices-per-node 8 --minibatch 2 4 8")
    ap.add_argument("lengths", nargs="?", help=f"a length profile ({', '.join(PROFILES)}), a lengths file (one token "
                    "count per line) or JSONL file (counts, token-id lists, or objects: --field), or a dataset "
                    "datasets reads: a folder written by save_to_disk, a Parquet, Arrow or CSV file, a JSON array, "
                    "or a folder of them as on the Hub (--text-field, --tokenizer)")
    ap.add_argument("overrides", nargs="*", metavar="key=value",
                    help="any other setting of `python -m odc_bench`, anywhere on the line, e.g. model.num_layers=40 "
                         "max_tokens=32768 "
                         "packing_ratio=2 backend.hardware.nic_gbps=200 precision=fp32")
    ap.add_argument("--model", default="qwen2_7b", help=f"a model config ({', '.join(MODELS)}), or a Hugging Face "
                    "model folder (or its config.json) whose shape is read with transformers; change the shape with "
                    "model.KEY=VALUE overrides (default: %(default)s)")
    ap.add_argument("--hardware", default=best_validated(DEFAULT_GPU, HARDWARE) or DEFAULT_GPU,
                    help=f"a hardware profile, with its validated error on speedups (10th to 90th percentile): "
                         f"{escape_percent(ratio_bands())} (cpu: this machine, calibrated; NAME_fit: fitted to "
                         f"published GPU runs); or a profile file fitted to your own cluster (python -m "
                         f"odc_bench.calibrate.cluster_profile; docs/calibrate.md). `--hardware list` shows the "
                         f"errors in full "
                         f"(default: the best validated {DEFAULT_GPU} profile, %(default)s)")
    ap.add_argument("--nodes", type=int, default=1, help="nodes (default: %(default)s)")
    ap.add_argument("--devices-per-node", type=int, default=8, help="devices per node (default: %(default)s)")
    ap.add_argument("--minibatch", type=int, nargs="+", default=[1, 2, 4, 8], metavar="N",
                    help="minibatch sizes, in samples per device (default: 1 2 4 8)")
    ap.add_argument("--minibatches", type=int, default=8, help="minibatches simulated per run (default: %(default)s)")
    ap.add_argument("--field", help="JSONL objects: the key holding the token count or ids")
    ap.add_argument("--tokenizer", help="a dataset's text: a local tokenizer folder or tokenizer.json")
    ap.add_argument("--text-field", help="a dataset's column to measure (default: --field, else text)")
    ap.add_argument("--length-scale", type=float, default=1.0,
                    help="multiply every length (default: 1, the lengths as they are)")
    ap.add_argument("--all-balancers", action="store_true",
                    help="every balancer of the registry (Dynamic, verl too), not only the paper's comparison")
    ap.add_argument("--staleness", type=int, nargs="+", default=[], metavar="S",
                    help="also stale-synchronous ODC with LB-Carry at these staleness values (beyond the paper: "
                         "ranks run up to S minibatches apart and train on gradients S steps old; "
                         "docs/staleness.md), beside the verdict")
    ap.add_argument("-j", "--jobs", type=int, default=usable_cpus(),
                    help="worker processes that plan and simulate series beside this one, which takes a share too "
                         "(and a helper that draws the figure); 0: all here (default: the CPUs this process may use, "
                         "%(default)s). The verdict is the same to the bit with any number")
    ap.add_argument("--out", type=writable_folder, default="results/local/whatif",
                    help="where verdict.csv and verdict.png go (default: %(default)s)")
    return ap


def split_overrides(ap: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The options and the key=value settings of a command line, wherever the settings stand.

    argparse alone reads `--minibatch 1 2 dataset.num_samples=5000` as three sizes, so the
    settings are taken out first. A token that is the value of a one-value option (`--out a=b`)
    stays that option's value."""
    takes_one = {flag for action in ap._actions if action.option_strings and action.nargs is None
                 for flag in action.option_strings}
    options: list[str] = []
    overrides: list[str] = []
    for i, token in enumerate(argv):
        if OVERRIDE.match(token) and not (i > 0 and argv[i - 1] in takes_one):
            overrides.append(token)
        else:
            options.append(token)
    return options, overrides


def ratio_bands() -> str:
    """Every stock profile with its validated error on speedups, for --hardware's help."""
    bands = {p: validated(hardware=p).ratio for p in HARDWARE}
    return ", ".join(f"{p} ({b[0]:+.0%} to {b[1]:+.0%})" if b else f"{p} (unknown)" for p, b in bands.items())


def escape_percent(text: str) -> str:
    """Text for argparse's help, which formats it with %."""
    return text.replace("%", "%%")


def print_profiles() -> None:
    """`--hardware list`: every stock profile with its validated error, the best of each GPU marked."""
    best = {gpu_of(p): best_validated(gpu_of(p), HARDWARE) for p in HARDWARE if p != "cpu"}
    for p in HARDWARE:
        mark = f"  (best validated {gpu_of(p)} profile)" if best.get(gpu_of(p)) == p else ""
        print(f"{p:<10} {summary(validated(hardware=p))}{mark}")
    print("validated errors: simulated over measured, 10th to 90th percentile (docs/gpu_validation.md); cpu: this "
          "repository's host (docs/simulator.md). A profile fitted to your cluster: python -m "
          "odc_bench.calibrate.cluster_profile (docs/calibrate.md)")


def profile_advice(question: Question) -> str | None:
    """A line naming the best validated profile of the GPU asked, and how the one asked compares."""
    if question.hardware_file is not None or question.hardware == "cpu":
        return None
    gpu = gpu_of(question.hardware)
    best = best_validated(gpu, HARDWARE)
    others = [p for p in HARDWARE if gpu_of(p) == gpu and p != question.hardware]
    if best is None or not others:
        return None
    if best == question.hardware:
        compared = "; ".join(f"{p}: {summary(validated(hardware=p))}" for p in others)
        return f"{best} is the best validated {gpu} profile (against {compared}; --hardware list shows them all)."
    return (f"Best validated {gpu} profile: {best} ({summary(validated(hardware=best))}), not {question.hardware} "
            f"({summary(validated(hardware=question.hardware))}): --hardware {best} gives the narrower band.")


def main(argv: Sequence[str] | None = None, figure: Helper | None = None) -> None:
    """The what-if on `argv` (default: the process's). `figure`: a helper that has loaded
    odc_bench.whatif.figure (__main__.py starts it), to draw there; without one (or with --jobs
    0) the figure is drawn here."""
    ap = parser()
    options, overrides = split_overrides(ap, sys.argv[1:] if argv is None else list(argv))
    args = ap.parse_intermixed_args(options)
    if args.hardware == "list":
        print_profiles()
        return
    if args.lengths is None:
        ap.error("the following arguments are required: lengths")
    if not args.lengths.strip():  # Path('') is the working folder, which datasets then tried to load
        ap.error("argument lengths: an empty path; give a length profile or a file or folder of lengths")
    for option in ("model", "hardware"):
        if not str(getattr(args, option)).strip():
            ap.error(f"argument --{option}: empty; give a name or a path")
    args.overrides = [*args.overrides, *overrides]
    t0 = time.perf_counter()
    console = Console(width=max(Console().width, 140))  # the table's columns, also in logs
    try:
        question = Question(lengths=args.lengths, model=args.model, hardware=args.hardware, nodes=args.nodes,
                            devices_per_node=args.devices_per_node, minibatch_sizes=tuple(args.minibatch),
                            num_minibatches=args.minibatches, field=args.field, tokenizer=args.tokenizer,
                            text_field=args.text_field, length_scale=args.length_scale,
                            all_balancers=args.all_balancers, staleness=tuple(args.staleness),
                            overrides=tuple(args.overrides))
    except ConfigError as e:
        fail(e, PROG)
    try:
        if args.jobs < 0:
            raise ConfigError(f"--jobs takes 0 or more worker processes, got {args.jobs}")
        if figure is not None and args.jobs == 0:
            figure.close()
            figure = None
        # Without a helper, matplotlib, a good part of the start-up, loads here while the workers plan and simulate.
        runs, table = verdict(question, args.jobs, meanwhile=None if figure is not None else
                              lambda: import_module("odc_bench.whatif.figure"))
    except ConfigError as e:
        fail(ConfigError(in_user_terms(str(e))), PROG)
    def say(text: str) -> None:  # verbatim and unwrapped: paths and commands stay whole
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    spec = runs[0][3]
    source = spec.config.dataset.profile or Path(str(spec.config.dataset.path)).name
    lengths = dataset_lengths(spec.config.dataset, spec.config.seed)
    say(describe_pool(lengths, question, source))
    accuracy = validated(hardware=question.hardware, profile_file=question.hardware_file)
    print_table(table, question, accuracy, console)
    too_big: dict[int, list[RunSpec]] = {}
    for s, m, _, run_spec in runs:
        if s.staleness == 0 and not run_spec.fits:
            too_big.setdefault(m, []).append(run_spec)
    advice = {m: ways(specs, question) for m, specs in too_big.items()}
    for line in verdict_lines(table, accuracy, advice):
        say(line)
    error = accuracy.describe(question.hardware_name)
    say(f"Simulated, not measured. The simulator's error: {error}.")
    hardware = spec.config.backend.hardware if isinstance(spec.config.backend, SimBackendConfig) else None
    if accuracy.gpu is not None and isinstance(hardware, GpuHardwareConfig):
        beyond = accuracy.gpu.outside(float(sum(unit_params(spec.config.model))), question.world_size,
                                      int(lengths.max()), question.devices_per_node, 8 * hardware.nic_gbps)
        changed = [o for o in question.overrides if o.lstrip("+").startswith("backend.hardware.")]
        if changed:
            beyond.append(f"a changed {question.hardware} profile ({', '.join(changed)}; the validation is of the "
                          f"profile as it stands)")
        if beyond:
            say(f"Outside what the GPU validation covers: {'; '.join(beyond)}; read the band as a floor there.")
    if isinstance(hardware, CalibratedHardwareConfig):
        path = hardware.calibration_file(question.model_name)
        elsewhere = calibrated_elsewhere(json.loads(path.read_text(encoding="utf-8-sig")), path, host_fingerprint())
        if elsewhere:
            say(elsewhere)
    best = profile_advice(question)
    if best:
        say(best)
    if question.hardware != "cpu":
        say("To measure on GPUs: both engines run there (engine=odc on the cuda_ipc heap within a node, nvshmem "
            "across NVLink), but ODC on GPUs has not been measured yet (docs/gpu.md), so its rows here are "
            "predictions. Measure both on your cluster and set them beside this table's rows.")
    stale = " (with engine.staleness=S in the stale rows)" if question.staleness else ""
    say(f"Each row is `python -m odc_bench {shlex.join(question.shared())} engine=E balancer=B minibatch_size=N"
        f"{''.join(' ' + shlex.quote(o) for o in question.overrides)}`{stale}.")
    # The table and its figure replace an earlier question's together, or not at all (a Ctrl-C
    # while the figure is drawn would have left this table beside the earlier figure).
    csv_path, png_path = args.out / "verdict.csv", args.out / "verdict.png"
    if not table["fits"].any():
        with atomic_paths(csv_path) as (csv,):
            write_csv(table, csv)
            png_path.unlink(missing_ok=True)  # an earlier question's figure
        say(f"Wrote {csv_path} and no figure: no series fits in memory at any minibatch size "
            f"({time.perf_counter() - t0:.1f} s).")
        sys.exit(NOTHING_FITS)
    with atomic_paths(csv_path, png_path) as (csv, png):
        write_csv(table, csv)
        draw_figure(figure, table, question, accuracy, png)
    say(f"Wrote {csv_path} and {png_path} ({time.perf_counter() - t0:.1f} s).")


def draw_figure(figure: Helper | None, table: pd.DataFrame, question: Question, accuracy: Accuracy, path: Path) -> None:
    """verdict.png, drawn by the helper `figure` if there is one (it has matplotlib loaded), else here."""
    if figure is not None:
        try:
            figure.call("draw", table, question, accuracy, path)
            return
        except HelperGone:  # killed from outside: the figure is still owed
            pass
    from odc_bench.whatif.figure import draw  # imported here, not above: see verdict's meanwhile

    draw(table, question, accuracy, path)
