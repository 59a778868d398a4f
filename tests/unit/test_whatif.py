"""`python -m odc_bench.whatif`: the verdict's rows are the `backend=sim` runs it names, bad input
is refused in one line with nothing written, and the table, verdict and figure say what they show.

The timing target (under 10 s for 64 devices) is a measurement, not a test: docs/whatif.md, "How long".
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from odc_bench.provenance import host_fingerprint
from odc_bench.results.table import read_table
from odc_bench.whatif.accuracy import VALIDATION, Accuracy, best_validated, calibrated_elsewhere, validated
from odc_bench.whatif.answer import answer, plan
from odc_bench.whatif.cli import DEFAULT_GPU, main, parser, profile_advice, split_overrides
from odc_bench.whatif.fit import ways_to_fit
from odc_bench.whatif.question import CONF, DERIVED, HARDWARE, Question, Series, in_user_terms, series
from odc_bench.whatif.report import _range, describe_pool, verdict_lines
from tests.helpers import REPO, exit_status, odc_bench

EXAMPLE = REPO / "examples" / "lengths.jsonl"
# Small enough for a unit test: 8 devices on two nodes, two minibatch sizes, three minibatches.
SMALL = ["--model", "qwen2_1p5b", "--nodes", "2", "--devices-per-node", "4", "--minibatch", "1", "2",
         "--minibatches", "3"]


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def whatif(tmp_path, monkeypatch, capsys):
    """`python -m odc_bench.whatif ARGS` in this process, in a scratch folder, 200 columns wide."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")

    def run(*args: str) -> Done:
        capsys.readouterr()
        status = exit_status(main, *args)
        return Done(status, *capsys.readouterr())

    return run


@pytest.fixture
def sweep(tmp_path, monkeypatch, capsys):
    """`python -m odc_bench -m ARGS` in this process: its exit status (its output is not read)."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> int:
        status = odc_bench("-m", *args)
        capsys.readouterr()
        return status

    return run


def _files_under(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_the_series_are_the_registries_paper_comparison_with_the_baseline_first():
    assert [s.label for s in series()] == ["Collective + LocalSort", "Collective + LB-Micro", "ODC + LocalSort",
                                          "ODC + LB-Micro", "ODC + LB-Mini"]
    assert [s for s in series() if s.is_baseline] == [Series("collective", "lb_micro")]
    every = series(all_balancers=True)
    assert Series("odc", "dynamic") in every and Series("collective", "dynamic") not in every, \
        "a pair that cannot run is never a series"


def test_stale_series_come_after_the_verdicts_one_per_staleness_with_the_carry_planner():
    assert series(staleness=(1, 2)) == [*series(), Series("odc", "lb_carry", 1), Series("odc", "lb_carry", 2)]
    assert series(staleness=(2, 1, 2)) == series(staleness=(1, 2))
    assert Series("odc", "lb_carry", 2).label == "ODC [s=2] + LB-Carry"
    assert "engine.staleness=2" in Question(lengths="longalign").run(Series("odc", "lb_carry", 2), 4)
    assert not any("staleness" in o for o in Question(lengths="longalign").run(Series("odc", "lb_mini"), 4))


def test_a_stale_row_has_no_validated_range_a_synchronous_odc_row_has_one():
    acc = Accuracy(ratio=(-0.05, 0.10), throughput=(0.0, 0.1), configs=6, source=REPO)
    row = pd.Series(dict(engine="odc", staleness=0, speedup=1.2))
    assert _range(acc, row) == f"{1.2 / 1.10:.2f}-{1.2 / 0.95:.2f}x"
    assert _range(acc, pd.Series(dict(engine="odc", staleness=1, speedup=1.2))) == "-"
    assert _range(acc, pd.Series(dict(engine="collective", staleness=0, speedup=1.2))) == "-"


@pytest.mark.slow
def test_stale_rows_are_their_backend_sim_runs_and_stand_beside_the_verdict(tmp_path, whatif, sweep):
    # Every balancer too: more series than a palette has colours still draws (it did not).
    done = whatif("longalign", *SMALL, "--all-balancers", "--staleness", "1", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "verdict.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    verdict = pd.read_csv(tmp_path / "out" / "verdict.csv")
    assert len(verdict) == 2 * (len(series(all_balancers=True)) + 1)
    stale = verdict[verdict.staleness == 1]
    assert stale.series.unique().tolist() == ["ODC [s=1] + LB-Carry"] and stale.minibatch_size.tolist() == [1, 2]
    question = Question(lengths="longalign", model="qwen2_1p5b", hardware=parser().get_default("hardware"),
                        nodes=2, devices_per_node=4, minibatch_sizes=(1, 2), num_minibatches=3)
    assert sweep(*question.shared(), "engine=odc", "engine.staleness=1", "balancer=lb_carry", "minibatch_size=1,2",
                 f"results_dir={tmp_path / 'sim'}", f"hydra.sweep.dir={tmp_path / 'm'}") == 0
    rows = read_table(tmp_path / "sim" / "runs.csv").set_index("run_id")
    assert set(rows.index) == set(stale.run_id)
    for _, v in stale.iterrows():
        assert v.samples_per_s == pytest.approx(rows.loc[v.run_id, "samples_per_s"], rel=1e-12)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("minibatch ")]
    verdicts = [ln for ln in lines if "stale-synchronous" not in ln]
    assert len(verdicts) == 2 and not any("[s=" in v for v in verdicts), "the verdict is the paper's series'"
    beside = [ln for ln in lines if "stale-synchronous" in ln]
    assert [ln.split(",")[0] for ln in beside] == ["minibatch 1/device", "minibatch 2/device"]
    for m, line in zip((1, 2), beside, strict=True):
        top = stale[stale.minibatch_size == m].iloc[0]
        assert f"ODC [s=1] + LB-Carry runs at {top.speedup:.2f}x" in line and "gradients 1 step old" in line


@pytest.mark.slow
def test_the_verdict_rows_equal_the_backend_sim_runs_they_name(tmp_path, whatif, sweep):
    # A copy of the example, so its lengths cache lands in the scratch folder.
    data = tmp_path / "lengths.jsonl"
    data.write_text(EXAMPLE.read_text())
    done = whatif(str(data), *SMALL, "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    verdict = pd.read_csv(tmp_path / "out" / "verdict.csv")
    assert len(verdict) == 2 * 5 and verdict["fits"].all()

    question = Question(lengths=str(data), model="qwen2_1p5b", hardware=parser().get_default("hardware"), nodes=2,
                        devices_per_node=4, minibatch_sizes=(1, 2), num_minibatches=3)
    assert verdict["overrides"].tolist() == [" ".join(question.run(s, m)) for m in (1, 2) for s in series()]
    assert sweep(*question.shared(), "engine=collective,odc", "balancer=local_sort,lb_micro,lb_mini",
                 "minibatch_size=1,2", f"results_dir={tmp_path / 'sim'}", f"hydra.sweep.dir={tmp_path / 'm'}") == 0
    rows = read_table(tmp_path / "sim" / "runs.csv").set_index("run_id")
    assert set(rows.index) == set(verdict["run_id"]), "the same runs, by their keys"
    for _, v in verdict.iterrows():
        row = rows.loc[v.run_id]
        for col in ("samples_per_s", "tokens_per_s", "bubble_rate", "predicted_bubble_rate"):
            # The sweep's rows are summarised from their traces, the verdict's from the timeline
            # (no trace written): the same numbers, to the last bits of rounding.
            assert v[col] == pytest.approx(row[col], rel=1e-12), (v.series, v.minibatch_size, col)
        assert v.mem_gib * 2**30 == pytest.approx(row.mem_estimate_mb * 2**20)
    base = verdict[verdict.series == "Collective + LB-Micro"]
    assert (base.speedup == 1).all()
    assert verdict.loc[verdict.series == "ODC + LB-Mini", "speedup"].tolist() == [
        v.samples_per_s / b.samples_per_s for (_, v), (_, b) in
        zip(verdict[verdict.series == "ODC + LB-Mini"].iterrows(), base.iterrows(), strict=True)]


def test_ctrl_c_while_the_figure_is_drawn_keeps_the_earlier_question_s_table_and_figure(tmp_path, whatif,
                                                                                        monkeypatch):
    """verdict.csv and verdict.png answer one question: stopped between the two, the folder keeps
    the earlier answer's pair (the new table beside the old figure, before)."""
    from odc_bench.whatif import cli

    out = tmp_path / "out"
    out.mkdir()
    (out / "verdict.csv").write_text("the earlier question's table")
    (out / "verdict.png").write_text("the earlier question's figure")

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "draw_figure", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        whatif("longalign", *SMALL, "--jobs", "0", "--out", str(out))
    assert (out / "verdict.csv").read_text() == "the earlier question's table"
    assert (out / "verdict.png").read_text() == "the earlier question's figure"
    assert sorted(p.name for p in out.iterdir()) == ["verdict.csv", "verdict.png"], "no temporary left"


@pytest.mark.slow
def test_the_verdict_prints_its_table_error_and_commands_and_draws_one_figure(tmp_path, whatif):
    done = whatif("longalign", *SMALL, "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    default = parser().get_default("hardware")
    assert out.startswith("lengths: ") and "samples of longalign (as given)" in out.splitlines()[0]
    assert f"Simulated: qwen2_1p5b on 8 x {default} (2 nodes x 4), lengths longalign; speedup over Collective + " \
           "LB-Micro" in out
    for header in ("samples/s", "tokens/s", "speedup", "if it errs as validated", "bubble", "unavoidable",
                   "GiB/device", "fits"):
        assert header in out
    verdicts = [ln for ln in out.splitlines() if ln.startswith("minibatch ")]
    assert [v.split(":")[0] for v in verdicts] == ["minibatch 1/device", "minibatch 2/device"]
    assert all(("pays off" in v or "too close to call" in v or "does not pay off" in v) for v in verdicts)
    accuracy = validated(hardware=default)
    assert accuracy.ratio is not None and accuracy.gpu is not None, "the committed GPU validation is read"
    said = out.replace("\n", " ")
    assert f"ratios between a source's configurations {accuracy.ratio[0]:+.0%} to {accuracy.ratio[1]:+.0%}" in said
    assert "published GPU measurements" in said
    assert "both engines run there (engine=odc on the cuda_ipc heap within a node" in out
    assert f"Each row is `python -m odc_bench backend=sim backend/hardware={default}" in out
    png = tmp_path / "out" / "verdict.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_worker_processes_give_the_verdict_to_the_bit_and_the_lengths_cache_is_written(tmp_path, whatif):
    """The command as a user runs it (its workers, and the helper that draws the figure) against
    everything in one process."""
    data = tmp_path / "lengths.jsonl"
    data.write_text(EXAMPLE.read_text())
    outputs = {}
    for jobs in ("3", "0"):  # the workers' run first, so that it is the one to read the file and cache it
        args = [str(data), *SMALL, "--staleness", "1", "--jobs", jobs, "--out", str(tmp_path / jobs)]
        if jobs == "0":
            done = whatif(*args)
        else:
            # UTF-8 as in this process's capture, whatever the locale: a Latin-1 terminal gets ASCII boxes.
            done = subprocess.run([sys.executable, "-m", "odc_bench.whatif", *args], cwd=tmp_path, capture_output=True,
                                  encoding="utf-8", timeout=300,
                                  env=dict(os.environ, COLUMNS="200", PYTHONPATH=str(REPO), PYTHONIOENCODING="utf-8"))
        assert done.returncode == 0, done.stderr
        outputs[jobs] = done.stdout.splitlines()[:-1]  # the last line names the folder and the time taken
        if jobs == "3":
            assert list(tmp_path.glob("lengths.jsonl.lengths-*.npy")), "the lengths cache is written"
    for name in ("verdict.csv", "verdict.png"):
        assert (tmp_path / "3" / name).read_bytes() == (tmp_path / "0" / name).read_bytes(), name
    assert outputs["3"] == outputs["0"]


@pytest.mark.parametrize(("args", "message", "derived"), [
    (["--hardware", "h100", "--devices-per-node", "3"], "must divide --devices-per-node (3): give "
     "--devices-per-node a multiple of 8, or set backend.hardware.nic_rails to a divisor of 3", "gpus_per_node"),
    (["--minibatches", "1", "warmup_minibatches=3"], "warmup_minibatches (3) must be below --minibatches (1)",
     "num_minibatches"),
    (["--length-scale", "4", "max_tokens=1000"], "or lower --length-scale", "dataset.length_scale"),
])
def test_errors_about_derived_settings_name_the_option_given(tmp_path, whatif, args, message, derived):
    done = whatif("longalign", *args, "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and message in done.stderr and derived not in done.stderr, done.stderr


@pytest.mark.parametrize(("text", "message"), [
    ("name: mine\n", "is not a GPU profile (kind: None); the what-if asks about GPUs: give a profile that says "
                     "kind: gpu"),
    ("- a\n- b\n", "holds a list at its top, not a profile's settings by name (key: value); fix the file"),
    ("", "holds nothing at its top"),
    ("name: [mine,\n", "mine.yaml cannot be read as a config (expected the node content, but found '<stream end>', "
                         "line 2, column 1); fix the file"),
])
def test_a_profile_file_that_is_not_a_gpus_is_refused_naming_the_file(tmp_path, text, message):
    """Not a GPU profile (no kind: gpu), a list, not YAML: said of the file, before anything is
    composed (the what-if's node-size setting would otherwise be the key an error names)."""
    from odc_bench.errors import ConfigError

    profile = tmp_path / "backend" / "hardware" / "mine.yaml"
    profile.parent.mkdir(parents=True)
    profile.write_text(text)
    with pytest.raises(ConfigError) as refused:
        Question(lengths="longalign", hardware=str(profile))
    assert message in str(refused.value) and "\n" not in str(refused.value) and "devices" not in str(refused.value)


def test_a_profile_file_named_as_a_stock_profile_is_refused_as_never_read(tmp_path):
    """DIR/backend/hardware/h100.yaml: Hydra composed the stock h100 in its place, the what-if
    answering on a profile the user had not given."""
    from odc_bench.errors import ConfigError

    profile = tmp_path / "backend" / "hardware" / "h100.yaml"
    profile.parent.mkdir(parents=True)
    stock = (CONF / "backend" / "hardware" / "h100.yaml").read_text()
    profile.write_text(stock.replace("nic_gbps: 400", "nic_gbps: 7"))  # a cluster's own network
    with pytest.raises(ConfigError, match="a profile file named as the stock profile h100 is not read"):
        Question(lengths="longalign", hardware=str(profile))
    mine = profile.rename(profile.with_name("mine.yaml"))
    assert Question(lengths="longalign", hardware=str(mine)).hardware_name == "mine"


def test_every_derived_key_reads_as_its_option():
    for key, option in DERIVED:
        assert in_user_terms(f"{key} is wrong; change {key}=7") == f"{option} is wrong; change {option} 7"
    untouched = "model.world_size_x and my_minibatch_size stay"
    assert in_user_terms(untouched) == untouched


def test_a_size_or_staleness_given_twice_is_asked_once():
    """`--minibatch 2 1 2 --staleness 1 1`: each row of the verdict once, sizes in the order given."""
    question = Question(lengths="longalign", model="tiny", minibatch_sizes=(2, 1, 2), staleness=(1, 1))
    assert question.minibatch_sizes == (2, 1) and question.staleness == (1,)
    runs = plan(question)
    assert len(runs) == len({(s, size) for s, size, _, _ in runs}) == 2 * len(series(False, (1,)))


def test_the_pool_line_says_from_which_minibatch_size_samples_repeat_and_how_often():
    question = Question(lengths="mine.jsonl", nodes=4, devices_per_node=8, minibatch_sizes=(1, 2, 8))
    line = describe_pool(np.arange(100, 400), question, "mine.jsonl")
    assert line.endswith("; from minibatch 2 on a run draws more samples than there are, so samples repeat (at "
                         "minibatch 8: 2048 drawn, each used 6.83 times on average)")
    assert "repeat" not in describe_pool(np.arange(100, 3000), question, "mine.jsonl")


def test_a_cpu_profile_from_another_machine_says_so_and_how_to_calibrate_this_one(tmp_path, whatif):
    committed = REPO / "results" / "calibration" / "sim-tiny-cpu.json"
    here = host_fingerprint()
    data = json.loads(committed.read_text())
    assert calibrated_elsewhere({**data, "fingerprint": here}, committed, here) is None, "this machine: no line"
    unknown = calibrated_elsewhere({k: v for k, v in data.items() if k != "fingerprint"}, committed, here)
    assert unknown is not None and "records no hardware fingerprint" in unknown
    foreign = {**data, "fingerprint": {"cpu_model": "Some Other CPU", "logical_cores": 96}}
    (tmp_path / "sim-tiny-cpu.json").write_text(json.dumps(foreign))
    done = whatif("longalign", "--model", "tiny", "--hardware", "cpu", "--nodes", "1", "--devices-per-node", "2",
                  "--minibatch", "2", "--minibatches", "2", "--out", str(tmp_path / "out"),
                  f"backend.hardware.calibration={tmp_path / 'sim-tiny-cpu.json'}")
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("The cpu profile"))
    assert "was calibrated on another machine (Some Other CPU, 96 logical cores; this one: " in line
    assert line.endswith("To calibrate this machine (a few minutes): python -m odc_bench.calibrate.cpu_profile "
                         "model=tiny --engines collective odc")


def test_settings_stand_anywhere_on_the_line():
    ap = parser()
    options, overrides = split_overrides(ap, ["longalign", "--minibatch", "1", "2", "dataset.num_samples=5000",
                                              "--out", "a=b", "+model.x=1", "--nodes", "2", "~max_tokens"])
    args = ap.parse_intermixed_args(options)
    assert args.minibatch == [1, 2] and args.lengths == "longalign" and args.nodes == 2
    assert str(args.out) == "a=b", "a one-value option keeps its value, = or not"
    assert overrides == ["dataset.num_samples=5000", "+model.x=1", "~max_tokens"]


def _long_tail(path: Path) -> Path:
    """3,000 samples from 200 to 60,000 tokens, Pareto-tailed: the trial of issue 46, where a sample per device
    leaves the cost model's bound a larger bubble than the simulated run's."""
    lengths = np.clip((np.random.default_rng(0).pareto(1.2, 3000) + 1) * 200, 200, 60000).astype(int)
    path.write_text("\n".join(map(str, lengths)) + "\n", encoding="utf-8")
    return path


def _bubbles_ordered(table: pd.DataFrame) -> None:
    fitting = table[table.fits]
    assert fitting.unavoidable_bubble_rate.notna().all()
    assert ((fitting.unavoidable_bubble_rate >= 0) & (fitting.unavoidable_bubble_rate <= fitting.bubble_rate)).all(), \
        fitting[["series", "minibatch_size", "bubble_rate", "unavoidable_bubble_rate"]]


def test_the_unavoidable_bubble_never_exceeds_the_bubble_and_is_all_of_it_where_no_balancer_can_help(tmp_path):
    question = Question(lengths=str(_long_tail(tmp_path / "lt.jsonl")), model="qwen2_1p5b", hardware="h100",
                        nodes=1, devices_per_node=8, minibatch_sizes=(1,), num_minibatches=3)
    runs = plan(question)
    table = answer(runs)
    _bubbles_ordered(table)
    # One sample per device: every plan is the bound, so the whole bubble is unavoidable, though the cost
    # model's own bound has a larger bubble than the simulated collective run (the old column's 73% against 72%).
    assert all(spec.predicted_bubble_rate() == pytest.approx(spec.bound_bubble_rate()) for *_, spec in runs)
    assert table.unavoidable_bubble_rate.tolist() == pytest.approx(table.bubble_rate.tolist())
    assert any(spec.bound_bubble_rate() > bubble for (*_, spec), bubble in zip(runs, table.bubble_rate, strict=True))
    line = verdict_lines(table, Accuracy(None, None, 0, REPO))[0]
    best = table[table.series == "ODC + LocalSort"].iloc[0]
    assert f"bubble {best.bubble_rate:.0%} ({best.unavoidable_bubble_rate:.0%} unavoidable) against " in line


# The what-if cases the docs show, as (lengths, options): README and docs/tutorial.md (sections 2 and 4:
# the first 1,000 lengths of the example), docs/staleness.md.
DOC_CASES = [
    ("examples/lengths.jsonl", dict(model="qwen2_7b", nodes=8)),
    ("first1000", dict(model="qwen2_14b", hardware="h100", nodes=2, minibatch_sizes=(2, 4))),
    ("longalign", dict(model="qwen2_7b", nodes=8, minibatch_sizes=(2, 4), staleness=(1, 2))),
]


@pytest.mark.slow
@pytest.mark.parametrize(("lengths", "options"), DOC_CASES, ids=[c[0] for c in DOC_CASES])
def test_no_row_of_the_documented_verdicts_has_a_bubble_below_its_unavoidable_bubble(tmp_path, lengths, options):
    if lengths == "first1000":
        lengths = str(tmp_path / "my_lengths.jsonl")
        Path(lengths).write_text("".join(EXAMPLE.read_text().splitlines(keepends=True)[:1000]), encoding="utf-8")
    elif lengths.endswith(".jsonl"):
        lengths = str(tmp_path / "lengths.jsonl")  # a copy: its lengths cache lands in the scratch folder
        Path(lengths).write_text(EXAMPLE.read_text(), encoding="utf-8")
    _bubbles_ordered(answer(plan(Question(lengths=lengths, **options))))


def test_the_best_validated_profile_of_a_gpu_is_the_one_with_the_narrower_band(tmp_path):
    for path in VALIDATION.glob("gpu-*.csv"):
        shutil.copy(path, tmp_path / path.name)
    committed = best_validated("h100", HARDWARE, tmp_path)
    assert committed in ("h100", "h100_fit")
    other = "h100_fit" if committed == "h100" else "h100"
    # The stock profile's errors are its own, the fit's held out; the other's a tenth as large make it the better.
    column = "held_out_error" if other.endswith("_fit") else "stock_error"
    for name in ("gpu-points.csv", "gpu-ratios.csv"):
        table = pd.read_csv(tmp_path / name)
        table.loc[table["profile"] == "h100", column] *= 0.1
        table.to_csv(tmp_path / name, index=False)
    assert best_validated("h100", HARDWARE, tmp_path) == other
    assert best_validated("b200", HARDWARE, tmp_path) is None


def test_the_whatif_names_the_best_validated_profile_and_defaults_to_it(capsys):
    assert parser().get_default("hardware") == best_validated(DEFAULT_GPU, HARDWARE)
    best = best_validated("h100", HARDWARE)
    other = "h100_fit" if best == "h100" else "h100"
    worse = profile_advice(Question(lengths="longalign", hardware=other))
    assert worse is not None and worse.startswith(f"Best validated h100 profile: {best} (tokens/s per GPU ")
    assert worse.endswith(f"--hardware {best} gives the narrower band.")
    said = profile_advice(Question(lengths="longalign", hardware=best))
    assert said is not None and said.startswith(f"{best} is the best validated h100 profile (against {other}: ")
    assert profile_advice(Question(lengths="longalign", hardware="cpu")) is None
    main(["--hardware", "list"])  # no lengths needed
    listed = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line for line in listed[:len(HARDWARE)]}
    assert set(rows) == set(HARDWARE)
    assert rows[best].endswith("(best validated h100 profile)") and "best" not in rows[other]
    ratio = validated(hardware=other).ratio
    assert ratio is not None and f"ratios {ratio[0]:+.0%} to {ratio[1]:+.0%}" in rows[other]
    how = "held out" if other.endswith("_fit") else "never seen by the profile"
    assert how in rows[other]


def test_the_measured_range_divides_by_the_validated_error():
    acc = Accuracy(ratio=(-0.05, 0.10), throughput=(0.0, 0.1), configs=6, source=REPO)
    low, high = acc.measured_range(1.2)
    assert low == pytest.approx(1.2 / 1.10) and high == pytest.approx(1.2 / 0.95)
    assert Accuracy(None, None, 0, REPO).measured_range(1.2) is None


@pytest.mark.slow
def test_a_run_that_does_not_fit_has_no_numbers_and_says_so(tmp_path, whatif):
    done = whatif("longalign", "--model", "qwen2_32b", "--nodes", "1", "--devices-per-node", "2", "--minibatch", "1",
                  "--minibatches", "1", "backend.recompute=false", "--out", str(tmp_path / "out"))
    assert done.returncode == 3, "no series fits: its own exit status"
    verdict = pd.read_csv(tmp_path / "out" / "verdict.csv")
    assert not verdict["fits"].any() and verdict["samples_per_s"].isna().all()
    assert (verdict["mem_gib"] > verdict["mem_limit_gib"]).all()
    assert not (tmp_path / "out" / "verdict.png").exists(), "no empty figure"
    assert ("minibatch 1/device: does not fit in memory (see GiB/device); it would fit with recomputed activations "
            "(leave out backend.recompute=false) and --nodes ") in done.stdout
    assert "no figure: no series fits in memory" in done.stdout and "max_tokens" not in done.stdout


def _too_big(question: Question) -> list:
    return [spec for s, _, _, spec in plan(question) if s.staleness == 0 and not spec.fits]


@pytest.mark.slow
def test_fit_advice_names_only_changes_that_fit_when_replanned():
    question = Question(lengths="longalign", model="qwen2_14b", nodes=1, devices_per_node=2, minibatch_sizes=(1,),
                        num_minibatches=1)
    ways = ways_to_fit(_too_big(question), question)
    nodes = [w for w in ways if w.startswith("--nodes ")]
    assert len(nodes) == 1 and not any("max_tokens" in w for w in ways), ways
    fewest = int(nodes[0].split()[1].rstrip(","))
    assert not _too_big(replace(question, nodes=fewest)), "the suggested node count fits"
    assert _too_big(replace(question, nodes=fewest - 1)), "and it is the fewest"
    # More nodes than the data fills a minibatch with are not offered: a 4-sample pool.
    small = replace(question, overrides=("dataset.num_samples=4",))
    assert not any(w.startswith("--nodes") for w in ways_to_fit(_too_big(small), small))


@pytest.mark.parametrize(("args", "setup", "message"), [
    (["{tmp}/bad.jsonl"], "12\n[1, 2.5]\n", "line 2: token ids must be integers >= 0"),
    (["{tmp}/none.jsonl"], None, "is neither a length profile"),
    (["longalign", "--model", "nosuch"], None, "--model nosuch is neither a model config"),
    (["longalign", "--model", "{tmp}"], None, "nor a Hugging Face model folder holding a config.json"),
    (["longalign", "--nodes", "0"], None, "--nodes must be at least 1"),
    (["longalign", "engine=odc"], None, "the what-if sets engine itself"),
    (["longalign", "backend.hardware.link_gbps=0"], None, "backend.hardware.link_gbps must be a positive number"),
    (["longalign", "--minibatch", "0"], None, "--minibatch takes one or more sizes >= 1"),
    (["longalign", "--staleness", "0"], None, "--staleness takes values >= 1"),
    (["longalign", "engine.staleness=1"], None, "the what-if sets engine.staleness itself"),
    # A setting after a many-valued option is a setting, not one more value of it.
    (["longalign", "--minibatch", "1", "2", "engine=odc"], None, "the what-if sets engine itself"),
    (["longalign", "--jobs", "-1"], None, "--jobs takes 0 or more worker processes"),
    # Valid for the first series, composed here; the others' workers refuse it.
    (["longalign", "-j", "2", "balancer.options.pack=true"], None, "belongs to balancer=local_sort"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, whatif, args, setup, message):
    if setup is not None:
        (tmp_path / "bad.jsonl").write_text(setup)
    before = _files_under(tmp_path)
    done = whatif(*[a.format(tmp=tmp_path) for a in args], "--out", str(tmp_path / "out"))
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("python -m odc_bench.whatif: error: ") and message in lines[0]
    assert _files_under(tmp_path) == before, "no verdict, no lengths cache"


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the name (state, parent, ...), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _children(pid: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").glob("[0-9]*")
            if (fields := _stat(int(p.name))) is not None and int(fields[1]) == pid and fields[0] != "Z"]


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads the processes' parents from /proc")
@pytest.mark.parametrize("children", [1, 2], ids=["while-loading", "while-workers-run"])
def test_ctrl_c_ends_the_workers_and_the_command_in_one_line_writing_nothing(tmp_path, children):
    """Ctrl-C once the figure's helper is forked (the command still loading the harness), or once
    the first worker is (beside the helper)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200")
    # 128 devices, every balancer: seconds of work, so the Ctrl-C lands while the workers run.
    proc = subprocess.Popen([sys.executable, "-m", "odc_bench.whatif", "longalign", "--model", "qwen2_14b", "--nodes",
                             "16", "--all-balancers", "--jobs", "2", "--out", str(tmp_path / "out")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        # The moment the first worker is forked: a Ctrl-C inside the fork's own handlers was swallowed.
        while len(workers := _children(proc.pid)) < children:
            assert proc.poll() is None and time.monotonic() < deadline, "the workers never started"
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and [ln for ln in err.splitlines() if ln.strip()] == [
        "python -m odc_bench.whatif: interrupted"], err
    assert not any(_alive(w) for w in workers), "a worker outlived the command"
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_command_line_refuses_bad_input_in_one_line_with_exit_status_2(tmp_path):
    """The entry point itself, as a shell runs it (the cases above run its main() in-process)."""
    (tmp_path / "bad.jsonl").write_text("12\n[1, 2.5]\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200")
    done = subprocess.run([sys.executable, "-m", "odc_bench.whatif", str(tmp_path / "bad.jsonl"), "--out",
                           str(tmp_path / "out")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("python -m odc_bench.whatif: error: ")
    assert "line 2: token ids must be integers >= 0" in lines[0]
    assert {p.name for p in tmp_path.iterdir()} == {"bad.jsonl"}, "no verdict, no lengths cache"


def test_output_cut_short_ends_quietly(tmp_path):
    """`... | head`: what reads the output goes away before the command writes; no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "odc_bench.whatif", "--hardware", "list"], cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 1 and err == "", err


def test_a_lengths_file_and_profile_whose_paths_hold_quotes_and_accents_are_read(tmp_path):
    """Hydra refused `dataset.path=/tmp/d/l's.jsonl` (and a folder named josé) as an override the
    user never wrote; each path now reaches the runs as it is."""
    from odc_bench.config.compose import compose_run

    folder = tmp_path / "josé's data"
    folder.mkdir()
    lengths = folder / "l's, [1].jsonl"
    lengths.write_text("".join(f"{n}\n" for n in range(100, 900, 10)))
    profile = folder / "backend" / "hardware" / "mine.yaml"
    profile.parent.mkdir(parents=True)
    shutil.copy(Path(__file__).parents[2] / "odc_bench" / "conf" / "backend" / "hardware" / "h100.yaml", profile)
    question = Question(lengths=str(lengths), model="tiny", hardware=str(profile), nodes=1, devices_per_node=8)
    config = compose_run(question.run(Series("odc", "lb_mini"), 2))
    assert config.dataset.path == str(lengths) and config.backend.hardware.name == "h100"
