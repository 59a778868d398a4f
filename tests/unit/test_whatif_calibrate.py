"""python -m odc_bench.calibrate.cluster_profile: a GPU profile fitted to measured runs.

The measured runs here are synthetic: simulated on a known profile (the A100 one with three of
its constants changed), so the fit, started from the stock A100 profile, must find that profile.
"""

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from odc_bench.calibrate import cluster_profile as cc
from odc_bench.config.compose import compose_run
from odc_bench.whatif.accuracy import validated
from odc_bench.whatif.cli import main as whatif
from odc_bench.whatif.report import verdict_lines

HEADER = "model,lengths,gpus,gpus_per_node,minibatch_size,tokens_per_s_per_gpu\n"
# Two length profiles (attention's share differs), one and four nodes (the NIC matters only across nodes).
SETTINGS = [("qwen2_1p5b", "longalign", 8, 8, 4), ("qwen2_1p5b", "swe_smith", 8, 8, 2),
            ("qwen2_1p5b", "longalign", 32, 8, 2), ("qwen2_7b", "aime", 16, 8, 8)]
TRUTH = dict(matmul_efficiency=0.45, attention_efficiency=0.3, nic_efficiency=0.05)


def _csv(path: Path, values: list[float], settings=SETTINGS) -> Path:
    path.write_text(HEADER + "".join(f"{m},{ln},{g},{n},{b},{v!r}\n" for (m, ln, g, n, b), v in
                                     zip(settings, values, strict=True)), encoding="utf-8")
    return path


def _measured(tmp_path: Path) -> Path:
    """The settings' tokens/s per GPU on the known profile, as a runs file."""
    runs = cc.read_runs(_csv(tmp_path / "plan.csv", [1.0] * len(SETTINGS)), "a100")
    truth = replace(cc.base_profile("a100"), **TRUTH)
    return _csv(tmp_path / "runs.csv", [float(v) for v in cc.predict(runs, truth)])


@pytest.mark.slow
def test_the_fit_recovers_the_profile_the_runs_were_measured_on_and_the_whatif_runs_on_it(tmp_path, capsys):
    out = tmp_path / "out"
    cc.main([str(_measured(tmp_path)), "--name", "mine", "--out", str(out)])
    printed = capsys.readouterr().out
    profile = out / "backend" / "hardware" / "mine.yaml"
    config = compose_run(["backend=sim", f"hydra.searchpath=[file://{out}]", "backend/hardware=mine"])
    hardware = config.backend.hardware
    for name, value in TRUTH.items():
        assert getattr(hardware, name) == pytest.approx(value, rel=1e-3), (name, printed)
    assert hardware.peak_tflops == cc.base_profile("a100").peak_tflops, "constants not fitted stay the base's"
    assert "fitted matmul_efficiency, attention_efficiency, nic_efficiency to 4 runs" in printed

    whatif(["longalign", "--hardware", str(profile), "--minibatch", "2", "--minibatches", "2",
            "--out", str(tmp_path / "verdict")])
    said = capsys.readouterr().out.replace("\n", " ")
    assert "on 8 x mine (1 node x 8)" in said
    assert "the mine profile was fitted to 4 runs measured on its cluster" in said
    # The band is the fit's: 4 runs cannot fit the profile's 6 constants, which the verdict line says.
    assert ("within the mine profile's fit residuals (4 runs for the profile's 6 constants (3 fitted, the rest as "
            "in a100): read it as a floor)") in said
    assert (tmp_path / "verdict" / "verdict.csv").exists()
    assert (profile.parent / "mine-fit.csv").exists(), "the fit table lies beside the profile, where the band is read"


def _refused(tmp_path: Path, capsys, text: str, *args: str) -> str:
    runs = tmp_path / "bad.csv"
    runs.write_bytes(text.encode())
    with pytest.raises(SystemExit) as exit_:
        cc.main([str(runs), "--out", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists(), "a refused file writes nothing"
    return err


ROW = "qwen2_1p5b,longalign,8,8,4,"


@pytest.mark.parametrize("text, says", [
    (HEADER + ROW + "1000\n", "holds 1 run; a fit needs at least two"),
    ("model,lengths,gpus,minibatch_size,tokens_per_s_per_gpu\n" + "qwen2_1p5b,longalign,8,4,1000\n" * 2,
     "lacks the column gpus_per_node"),
    (HEADER + ROW + "1000\n" + ROW + "3.2k\n", "row 2: tokens_per_s_per_gpu is '3.2k', not a number"),
    (HEADER + ROW + "1000\n" + ROW + "2000\n", "rows 1 and 2 are the same setting measured 1000 to 2000"),
    (HEADER + ROW + "1000\nllama_9b,longalign,8,8,4,900\n", "row 2:"),
    (HEADER + ROW + "1000\nqwen2_1p5b,longalign,12,8,4,900\n", "row 2: gpus (12) must be a multiple of gpus_per_node"),
    (HEADER.replace("\n", ",speed\n") + (ROW + "1000,fast\n") * 2, "unknown column speed"),
    # A lone row's own fault before the count (it said only "holds 1 run").
    (HEADER + ROW + "0\n", "row 1: tokens_per_s_per_gpu must be a positive number, got 0"),
    # pandas renamed the second gpus to gpus.1: "unknown column gpus.1".
    (HEADER.replace("\n", ",gpus\n") + (ROW + "1000,8\n") * 2, "the column gpus appears twice in its header"),
    # A spreadsheet's export in a locale whose decimal mark is a comma: "lacks the columns model, ...".
    (HEADER.replace(",", ";") + (ROW.replace(",", ";") + "1000\n") * 2, "is separated by ';', not commas"),
    (HEADER.replace(",", "\t") + (ROW.replace(",", "\t") + "1000\n") * 2, "is separated by '\\t', not commas"),
])
def test_input_the_fit_cannot_use_is_refused_in_one_line(tmp_path, capsys, text, says):
    assert says in _refused(tmp_path, capsys, text)


@pytest.mark.parametrize("name", ["h100", "a100_fit", "cpu"])
def test_a_profile_cannot_take_a_stock_profiles_name(tmp_path, capsys, name):
    """Hydra finds the stock profile of a name first: a profile written under it would never be read."""
    text = HEADER + ROW + "1000\n" + "qwen2_1p5b,swe_smith,8,8,2,1500\n"
    assert f"--name {name}: a stock profile's name" in _refused(tmp_path, capsys, text, "--name", name)


def test_runs_no_profile_meets_are_refused(tmp_path, capsys):
    # Twice the minibatch on the same data and GPUs cannot run at a hundredth of the throughput.
    text = HEADER + ROW + "2000\n" + "qwen2_1p5b,longalign,8,8,8,20\n"
    assert "no profile fits these runs" in _refused(tmp_path, capsys, text)


def test_a_byte_order_mark_and_spaces_after_commas_are_read(tmp_path):
    runs = tmp_path / "runs.csv"
    runs.write_text("\ufeff" + HEADER.replace(",", ", ") + ROW.replace(",", ", ") + "1000\n"
                    + "qwen2_1p5b, swe_smith, 8, 8, 2, 800\n", encoding="utf-8")
    measured = cc.read_runs(runs, "a100")
    assert [r.tokens_per_s_per_gpu for r in measured] == [1000.0, 800.0]


def test_a_runs_file_in_utf16_with_its_byte_order_mark_is_read(tmp_path):
    """As Windows PowerShell's `>` writes it."""
    runs = tmp_path / "runs.csv"
    runs.write_text(HEADER + ROW + "1000\n" + "qwen2_1p5b,swe_smith,8,8,2,800\n", encoding="utf-16")
    assert [r.tokens_per_s_per_gpu for r in cc.read_runs(runs, "a100")] == [1000.0, 800.0]


def test_each_run_keeps_its_own_node_size_when_a_profile_is_tried_on_it(tmp_path):
    # 16 GPUs in one node talk over NVLink, in two nodes of 8 over the NICs: a slow NIC in the
    # tried profile must slow only the second, whatever node size the base profile has
    settings = [("qwen2_7b", "longalign", 16, 16, 4), ("qwen2_7b", "longalign", 16, 8, 4)]
    runs = cc.read_runs(_csv(tmp_path / "plan.csv", [1.0, 1.0], settings), "a100")
    one_node, two_nodes = cc.predict(runs, replace(cc.base_profile("a100"), nic_efficiency=0.02))
    assert one_node > 2 * two_nodes


def test_the_run_without_which_the_others_fit_is_named_and_a_per_job_number_is_said(tmp_path, capsys):
    # Row 3 ran on 32 GPUs and is entered as the job's tokens/s, 32 times its per-GPU value.
    runs = cc.read_runs(_csv(tmp_path / "plan.csv", [1.0] * 3, SETTINGS[:3]), "a100")
    values = [float(v) for v in cc.predict(runs, replace(cc.base_profile("a100"), **TRUTH))]
    values[2] *= 32
    err = _refused(tmp_path, capsys, _csv(tmp_path / "runs.csv", values, SETTINGS[:3]).read_text())
    assert "no profile fits these runs: without row 3 the other 2 fit (residuals " in err
    assert "x it looks like tokens/s of the whole job (32 GPUs): divide it by 32" in err


def test_a_calibrated_profiles_band_is_its_fits_residuals_and_says_what_makes_it_a_floor(tmp_path):
    # The trial of issue 46: six runs, residuals -31.6% to +22.1%, one constant at its bound.
    profile = tmp_path / "backend" / "hardware" / "mycluster.yaml"
    profile.parent.mkdir(parents=True)
    profile.write_text("name: mycluster\n")
    residuals = [-0.316, -0.1, 0.0, 0.05, 0.1, 0.221]
    pd.DataFrame({"row": range(1, 7), "residual": residuals, "base": "h100",
                  "fitted": "matmul_efficiency attention_efficiency nic_efficiency", "at_bound": "nic_efficiency",
                  "constants": len(cc.FREE)}).to_csv(cc.fit_table_path(profile), index=False)
    band = validated(hardware=str(profile), profile_file=profile)
    assert band.throughput == pytest.approx((-0.316, 0.221))
    assert band.ratio == pytest.approx((0.684 / 1.221 - 1, 1.221 / 0.684 - 1)), "between its runs' residuals"
    assert band.band() == "the mycluster profile's fit residuals (nic_efficiency at its bound: read it as a floor)"
    assert band.measured_range(1.05)[0] < 1 < band.measured_range(1.05)[1], "no longer 'pays off (1.02-1.08x)'"
    table = pd.DataFrame([dict(series="Collective + LB-Micro", engine="collective", balancer="lb_micro", staleness=0,
                               minibatch_size=2, samples_per_s=1.0, speedup=1.0, bubble_rate=0.5,
                               unavoidable_bubble_rate=0.4, saved=""),
                          dict(series="ODC + LB-Mini", engine="odc", balancer="lb_mini", staleness=0, minibatch_size=2,
                               samples_per_s=1.05, speedup=1.05, bubble_rate=0.45, unavoidable_bubble_rate=0.4,
                               saved="idle 100%")])
    (line,) = verdict_lines(table, band)
    assert "too close to call" in line and f"within {band.band()}" in line
    assert "the mycluster profile was fitted to 6 runs" in band.describe("mycluster")
    profile.with_name("mycluster-fit.csv").unlink()
    missing = validated(hardware=str(profile), profile_file=profile)
    assert missing.ratio is None and "the mycluster profile's fit residuals" in missing.describe("mycluster")


def test_each_profiles_band_names_where_it_comes_from():
    assert validated(hardware="cpu").band() == "the CPU host's validated error"
    assert validated(hardware="a100").band() == "the a100 profile's error on published GPU runs"
    assert validated(hardware="a100_fit").band() == "the a100_fit profile's held-out error on published GPU runs"
    unvalidated = "the CPU host's validated error (the b200 profile has no GPU validation)"
    assert validated(hardware="b200").band() == unvalidated
