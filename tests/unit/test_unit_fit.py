"""The measured GPU compute profile: unit timings fitted as the FLOPs model's terms (sim/unit_fit.py),
the committed H100 seed, and a GPU profile that computes from it."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from odc_bench.calibrate.cost_model import (
    _forward_backward,
    fit_timings,
    shape_lengths,
    time_units,
    unit_models,
    units_record,
)
from odc_bench.config.backend import Recompute
from odc_bench.errors import ConfigError
from odc_bench.models.flops import layer_forward_flops
from odc_bench.sim import unit_fit
from odc_bench.sim.hardware import GpuProfile
from odc_bench.sim.layout import Layout
from tests.helpers import REPO, run_config

SEED = REPO / "results" / "gpu" / "h100-2026-11-26"
TRUE = {"layer": {"fwd": dict(c0=8e-4, k_mm=1.5e-15, k_attn=3e-15, k_attn_tok=2e-11)},
        "head": {"fwd": dict(c0=1e-4, k_mm=1.5e-15, k_logits=8e-12)}}
SHAPES = [[1024], [4096], [16384], [512] * 16, [4096] * 4, [8192, 4096, 2048, 1024, 512, 256, 128, 128]]


def _models():
    return {name: run_config(f"model={name}").model for name in ("qwen2_1p5b", "qwen2_7b")}


def test_the_fit_recovers_the_terms_that_made_the_timings():
    models = _models()
    rows = []
    for name, cfg in models.items():
        for lens in SHAPES:
            for kind, phases in TRUE.items():
                x = unit_fit.features(cfg, kind, lens)
                rows.append(dict(model=name, unit=kind, doc_lens=lens,
                                 fwd=float(x @ np.array(list(phases["fwd"].values())))))
    fitted = unit_fit.fit(rows, models)
    for kind, phases in TRUE.items():
        for term, value in phases["fwd"].items():
            assert fitted[kind]["fwd"][term] == pytest.approx(value, rel=1e-6), (kind, term)
        assert fitted[kind]["fwd"]["median_error"] < 1e-9


def test_a_layers_cost_row_grows_with_the_model_and_recomputation_adds_to_its_backward():
    cfg = _models()["qwen2_7b"]
    units = {"layer": {"fwd": TRUE["layer"]["fwd"], "bwd": {k: 2 * v for k, v in TRUE["layer"]["fwd"].items()}}}
    none, full = Recompute(0.0, 0.0, 0.0), Recompute(1.0, 1.0, 1.0)
    plain = unit_fit.table_rows(units, cfg, none)
    fwd = plain["layer", "fwd"]
    assert fwd[0] == 8e-4 and fwd[2] == pytest.approx(3e-15 * 2 * cfg.hidden_size)
    # Seconds of one 4K document: c0 + tokens + squared-length terms, as the features say.
    assert fwd @ [1, 4096, 4096**2] == pytest.approx(unit_fit.features(cfg, "layer", [4096])
                                                     @ list(TRUE["layer"]["fwd"].values()))
    recomputed = unit_fit.table_rows(units, cfg, full)
    np.testing.assert_allclose(recomputed["layer", "bwd"], plain["layer", "bwd"] + fwd)


def test_shape_names_give_the_documents_the_h100_timings_were_taken_on():
    table = pd.read_csv(SEED / "layer_head_times_varlen.csv")
    for row in table.itertuples():
        lens = shape_lengths(row.shape)
        assert (sum(lens), sum(n * n for n in lens), len(lens)) == (row.tokens, row.sum_sq_doc_len, row.docs)


def test_the_committed_h100_seed_fits_its_timings_and_the_h100_profile_computes_from_it():
    seed = json.loads((SEED / "compute.json").read_text())
    for kind in ("layer", "head"):
        for phase in ("fwd", "bwd"):
            assert seed["units"][kind][phase]["median_error"] < 0.05, (kind, phase)
    cfg = run_config("model=qwen2_7b").model
    layout = Layout(cfg)
    hw = run_config("backend=sim", "backend/hardware=h100").backend.hardware
    measured = GpuProfile(replace(hw, compute_calibration=str(SEED / "compute.json"))).compute_table(
        layout, Recompute(0.0, 0.0, 0.0))
    datasheet = GpuProfile(replace(hw, compute_calibration=None)).compute_table(layout, Recompute(0.0, 0.0, 0.0))
    # Layer forward on one 8K document against the measurement (9.52 ms on the H100).
    layer_fwd = measured[2] @ [1, 8192, 8192**2]
    assert layer_fwd == pytest.approx(9.5176e-3, rel=0.1)
    np.testing.assert_array_equal(measured[:2], datasheet[:2])  # embeddings were not measured: the datasheet's


def test_attentions_curve_against_document_length_is_what_the_h100_profile_takes():
    """Varlen attention on one H100: efficiency E s / (s + half), fitted to its four shapes."""
    from odc_bench.config.compose import compose_run
    from odc_bench.sim.unit_fit import attention_curve

    table = pd.read_csv(SEED / "attention_kernels.csv")
    table = table[table["impl"] == "varlen_attn"]
    lengths = [shape_lengths(s) for s in table["shape"]]
    efficiency, half = attention_curve(lengths, list((table["fwd_ms"] + table["bwd_ms"]) / 1e3), 28, 128, 989e12)
    hw = compose_run(["backend=sim", "backend/hardware=h100"]).backend.hardware
    assert (round(efficiency, 3), round(half)) == (hw.attention_efficiency, hw.attention_half_length)
    # Short documents pay the per-token term: a 512-token one runs at a fifth of the asymptote.
    assert 512 / (512 + half) == pytest.approx(0.2, abs=0.01)


def test_a_layers_share_of_peak_is_its_flops_over_its_forward_and_backward_seconds():
    cfg = run_config("model=qwen2_7b").model
    flops = 3 * layer_forward_flops(cfg, [4096] * 4)  # forward, and a backward of twice its work
    rows = [dict(model=cfg.name, unit="layer", doc_lens=[4096] * 4, fwd=flops / 3 / 400e12, bwd=flops * 2 / 3 / 400e12,
                 attention="varlen"),
            dict(model=cfg.name, unit="head", doc_lens=[4096] * 4, fwd=1.0, bwd=1.0)]
    (share,) = unit_fit.layer_peak_shares(rows, {cfg.name: cfg}, 800.0)
    assert share["tokens"] == 16384 and share["attention"] == "varlen"
    assert share["tflops"] == pytest.approx(400) and share["share"] == pytest.approx(0.5)


def test_unit_models_are_composed_by_name_and_a_wrong_one_is_refused_in_one_line():
    assert [m.hidden_size for m in unit_models("qwen2_7b,qwen2_14b")] == [3584, 5120]
    for bad, said in [("qwen2_7b,nope", "unknown model option 'nope'"), (",", "names no model")]:
        with pytest.raises(ConfigError, match=said) as refused:
            unit_models(bad)
        assert "\n" not in str(refused.value)


def test_timings_of_an_unknown_model_are_refused_in_one_line(tmp_path):
    timings = tmp_path / "t.csv"
    timings.write_text("model,unit,shape,fwd_ms,bwd_ms\nqwen2_7b,layer,1x1k,1,2\nnope,layer,1x1k,1,2\n")
    with pytest.raises(ConfigError, match=f"{timings}: unknown model option 'nope'") as refused:
        fit_timings(timings, "NVIDIA H100 80GB HBM3")
    assert "\n" not in str(refused.value)


HEADER = "model,unit,shape,fwd_ms,bwd_ms,bwd_recompute_ms\n"
GOOD = "qwen2_7b,head,1x1k,2.2,3.1,\n"  # no recomputed backward: an empty cell, the phase not timed


@pytest.mark.parametrize(("rows", "said"), [
    ("qwen2_7b,layer,1x1k,,1.7,\n", "fwd_ms must be a positive number of milliseconds, got nothing"),
    ("qwen2_7b,layer,1x1k,n/a,1.7,\n", "fwd_ms must be a positive number of milliseconds, got 'n/a'"),
    ("qwen2_7b,layer,1x1k,1.2,-1.7,\n", "bwd_ms must be a positive number of milliseconds, got -1.7"),
    ("qwen2_7b,layer,1x1k,0,1.7,\n", "fwd_ms must be a positive number of milliseconds, got 0"),
    ('qwen2_7b,layer,1x1k,"1,234",1.7,\n', "fwd_ms must be a positive number of milliseconds, got '1,234'"),
    ("qwen2_7b,layer,1x1k,1.2,1.7,-3\n", "bwd_recompute_ms must be a positive number of milliseconds, got -3"),
    ("qwen2_7b,attn,1x1k,1.2,1.7,\n", "unit 'attn' is not a unit kind; the kinds are layer, head, embed"),
    ("", "holds no timings, only its header"),
    (",layer,1x1k,1.2,1.7,\n", "row 2 (after the header) has no model"),
    ("qwen2_7b,layer,,1.2,1.7,\n", "row 2 (after the header) has no shape"),
], ids=["empty", "n/a", "negative", "zero", "thousands", "recompute", "unit", "no-rows", "no-model", "no-shape"])
def test_timings_the_fit_would_drop_or_misread_are_refused_in_one_line_naming_the_row(rows, said, tmp_path):
    """The fit leaves out a phase's missing or non-positive times (a unit not timed with
    recomputation); in the file, where the user gave them, they are a mistake to say."""
    timings = tmp_path / "t.csv"
    timings.write_text(HEADER + (GOOD + rows if rows else ""), encoding="utf-8")
    with pytest.raises(ConfigError, match=re.escape(said)) as refused:
        fit_timings(timings, "NVIDIA H100 80GB HBM3")
    assert "\n" not in str(refused.value)
    if rows and "after the header" not in said:
        assert f"{timings}, the row of qwen2_7b" in str(refused.value)


class HostClock:
    """The device clock's protocol on the host (odc_bench.run.trace.DeviceClock)."""

    def mark(self) -> float:
        return time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_ms(self, start: float, end: float) -> float:
        return (end - start) * 1e3


def test_unit_timing_times_every_unit_kind_per_shape_and_its_fit_reads_it():
    """What the CUDA profile runs, on the CPU: eager (compiling takes tens of seconds here), the
    host's clock for CUDA events, per-document SDPA for varlen."""
    cfg = run_config("model=tiny").model
    shapes = [[32], [16, 16], [8, 24]]
    rows = time_units(cfg, torch.device("cpu"), shapes, repeats=1, clock=HostClock(), compiled=False)
    assert [(r["unit"], r["doc_lens"]) for r in rows] == [(k, s) for s in shapes for k in ("embed", "layer", "head")]
    assert all(r[phase] > 0 for r in rows for phase in ("fwd", "bwd"))
    layers = [r for r in rows if r["unit"] == "layer"]
    assert all(r["bwd_recompute"] > 0 and r["attention"] == "sdpa_per_doc" for r in layers)
    units = units_record(rows, {cfg.name: cfg}, "cpu")["units"]
    assert set(units) == {"embed", "layer", "head"} and units["layer"]["bwd_recompute"]["points"] == len(shapes)



class _BackwardOnce(torch.autograd.Function):
    """Doubles x; its backward may run once per forward, as compiled code's, which frees the
    saved tensors its backward donates."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        ctx.ran = False
        return x * 2

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if ctx.ran:
            raise RuntimeError("backward ran twice on one forward")
        ctx.ran = True
        return grad * 2


def test_each_timed_backward_runs_on_a_forward_of_its_own():
    x = torch.ones(4, requires_grad=True)
    fwd, bwd = _forward_backward(lambda: _BackwardOnce.apply(x), repeats=3, clock=HostClock())
    assert fwd > 0 and bwd > 0


def test_files_a_user_hands_in_may_start_with_a_byte_order_mark(tmp_path):
    """Unit timings, a compute profile and a cost-model calibration, each saved with a byte-order
    mark (as Windows editors and spreadsheets save them), read as without one."""
    from odc_bench.balancers.cost import load_calibration

    def marked(path: Path) -> Path:
        copy = tmp_path / path.name
        copy.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
        return copy

    timings = SEED / "layer_head_times_varlen.csv"
    assert fit_timings(marked(timings), "NVIDIA H100 80GB HBM3")["units"] == \
        fit_timings(timings, "NVIDIA H100 80GB HBM3")["units"]
    hw = run_config("backend=sim", "backend/hardware=h100").backend.hardware
    layout, none = Layout(run_config("model=qwen2_7b").model), Recompute(0.0, 0.0, 0.0)
    tables = [GpuProfile(replace(hw, compute_calibration=str(p))).compute_table(layout, none)
              for p in (SEED / "compute.json", marked(SEED / "compute.json"))]
    np.testing.assert_array_equal(*tables)
    calibration = REPO / "results" / "calibration" / "tiny-cpu.json"
    assert load_calibration(marked(calibration)).b == load_calibration(calibration).b


def test_a_compute_profile_named_relative_to_the_working_folder_is_read_there(tmp_path, monkeypatch):
    """Where calibrate.cost_model wrote it (results/calibration/ under the working folder), as its
    last line names it; not only from the repository's root."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "measured.json").write_bytes((SEED / "compute.json").read_bytes())
    monkeypatch.chdir(tmp_path)
    hw = run_config("backend=sim", "backend/hardware=h100").backend.hardware
    layout, none = Layout(run_config("model=qwen2_7b").model), Recompute(0.0, 0.0, 0.0)
    np.testing.assert_array_equal(
        GpuProfile(replace(hw, compute_calibration="results/measured.json")).compute_table(layout, none),
        GpuProfile(replace(hw, compute_calibration=str(SEED / "compute.json"))).compute_table(layout, none))


@pytest.mark.parametrize(("rows", "said"), [
    ("qwen2_7b,layer,1x1k,1.2,1.7,\n", "the layer timings hold 1 shape(s), which its fit matches exactly whatever "
                                       "they measured; time at least 4 shapes"),
    ("qwen2_7b,layer,1x1k,1.2,1.7,\nqwen2_7b,layer,1x4k,2,3,\nqwen2_7b,layer,4x4k,5,9,\n",
     "the layer timings hold 3 shape(s)"),
    ("qwen2_7b,head,1x4k,4,5,\n", "the head timings hold 2 shape(s), which its fit matches exactly whatever they "
                                  "measured; time at least 3 shapes"),
    ("qwen2_7b,layer,0x1k,1.2,1.7,\n", "shape '0x1k' in the timings holds no tokens"),
    ("qwen2_7b,layer,2x0,1.2,1.7,\n", "shape '2x0' in the timings holds no tokens"),
], ids=["one-layer", "three-layers", "two-heads", "no-documents", "empty-documents"])
def test_timings_too_few_to_judge_their_fit_are_refused_in_one_line(rows, said, tmp_path):
    """One layer timing was fitted exactly and the calibration reported a median error of 0.0%;
    a shape of no tokens was taken as one."""
    timings = tmp_path / "t.csv"
    timings.write_text(HEADER + GOOD + rows, encoding="utf-8")
    with pytest.raises(ConfigError, match=re.escape(said)) as refused:
        fit_timings(timings, "NVIDIA H100 80GB HBM3")
    assert "\n" not in str(refused.value)
    enough = "".join(f"qwen2_7b,{kind},{shape},{1 + i},{2 + i},\n" for kind in ("layer", "head")
                     for i, shape in enumerate(("1x1k", "1x4k", "4x4k", "16x512")))
    timings.write_text(HEADER + enough, encoding="utf-8")
    assert set(fit_timings(timings, "NVIDIA H100 80GB HBM3")["units"]) == {"layer", "head"}
