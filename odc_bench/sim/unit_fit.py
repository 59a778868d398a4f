"""A GPU's measured unit compute, as the simulator's cost table: fitted from CUDA-event timings
of real units (odc_bench.calibrate.cost_model on CUDA), read through backend.hardware.compute_calibration.

Every unit's seconds are fitted as a linear function of what it computes, counted by the FLOPs
model (models/flops.py), so that one fit serves every model shape of the family:

    layer:  c0 + k_mm * 2 * linear_params * tokens + k_attn * 2q * (sum len^2 + half * sum len)
    head:   c0 + k_mm * 2 * h * vocab * tokens + k_logits * vocab * tokens
    embed:  c0 + k_mem * h * tokens

(h the hidden size, q the query heads' width: heads x head size) per phase (forward, backward,
and backward with the layer's forward recomputed). The attention
term is the FLOPs model's at an efficiency that rises with document length and saturates,
len / (len + half) of its asymptote: what the H100 measured (0.06 of peak on 512-token
documents, 0.31 on 16K), where one constant fits neither end. The head's second term is its
work on the logits (the fp32 log-softmax and loss: memory-bound, whatever the hidden size),
which made the head's time grow less than its FLOPs across 1.5B, 7B and 14B. c0 is the fixed cost a unit pays
per call whatever its size (kernel launches: large for a 1.5B layer). Coefficients are
non-negative (scipy's NNLS), so costs grow with every document's length.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from odc_bench.config.backend import Recompute
from odc_bench.config.model import ModelConfig
from odc_bench.models.flops import layer_forward_flops, layer_linear_params

# (kind, phase) fitted, and the coefficient names of each kind, in feature order.
PHASES = ("fwd", "bwd", "bwd_recompute")
TERMS = {"layer": ("c0", "k_mm", "k_attn", "k_attn_tok"), "head": ("c0", "k_mm", "k_logits"),
         "embed": ("c0", "k_mem")}


def features(cfg: ModelConfig, kind: str, doc_lens: Sequence[int]) -> np.ndarray:
    """The regressors of one unit call (module docstring), in TERMS[kind]'s order."""
    lens = np.asarray(doc_lens, dtype=float)
    tokens, h, q = float(lens.sum()), float(cfg.hidden_size), float(cfg.attention_width)
    if kind == "layer":
        return np.array([1.0, 2.0 * layer_linear_params(cfg) * tokens, 2.0 * q * float((lens * lens).sum()),
                         2.0 * q * tokens])
    if kind == "head":
        return np.array([1.0, 2.0 * h * cfg.vocab_size * tokens, float(cfg.vocab_size) * tokens])
    if kind == "embed":
        return np.array([1.0, h * tokens])
    raise ValueError(f"unknown unit kind {kind!r}; the kinds are {', '.join(TERMS)}")


def fit(rows: Iterable[Mapping[str, Any]], models: Mapping[str, ModelConfig]) -> dict[str, dict[str, Any]]:
    """Per kind and phase, the coefficients that fit the timings, and how well (median and worst
    relative error). A row: model, unit (kind), doc_lens, and seconds per phase (fwd, bwd, and
    bwd_recompute for layers timed with checkpointing); a phase with no timings is left out."""
    # scipy takes 0.25 s to import: a simulation reads fitted profiles and never fits.
    from scipy.optimize import nnls

    grouped: dict[tuple[str, str], list[tuple[np.ndarray, float]]] = {}
    for row in rows:
        x = features(models[row["model"]], row["unit"], row["doc_lens"])
        for phase in PHASES:
            seconds = row.get(phase)
            if seconds is not None and np.isfinite(seconds) and seconds > 0:
                grouped.setdefault((row["unit"], phase), []).append((x, float(seconds)))
    out: dict[str, dict[str, Any]] = {}
    for (kind, phase), points in sorted(grouped.items()):
        design = np.array([x for x, _ in points])
        y = np.array([s for _, s in points])
        # Fit relative errors (short and long units alike), columns scaled to one.
        scale = np.maximum(np.abs(design).max(axis=0), 1e-300)
        coef, _ = nnls(design / scale / y[:, None], np.ones_like(y))
        coef = coef / scale
        errors = design @ coef / y - 1
        out.setdefault(kind, {})[phase] = {**dict(zip(TERMS[kind], (float(c) for c in coef), strict=True)),
                                           "median_error": float(np.median(np.abs(errors))),
                                           "worst_error": float(errors[np.argmax(np.abs(errors))]),
                                           "points": len(points)}
    return out


def layer_peak_shares(rows: Iterable[Mapping[str, Any]], models: Mapping[str, ModelConfig],
                      peak_tflops: float) -> list[dict[str, Any]]:
    """Each layer timing's forward + backward in TFLOP/s, as the FLOPs model counts them (the
    backward twice the forward), and as a share of the device's peak: one dict per timing."""
    out = []
    for row in rows:
        if row["unit"] != "layer":
            continue
        tflops = 3 * layer_forward_flops(models[row["model"]], row["doc_lens"]) / (row["fwd"] + row["bwd"]) / 1e12
        out.append(dict(model=row["model"], doc_lens=list(row["doc_lens"]), tokens=sum(row["doc_lens"]),
                        attention=row.get("attention", ""), tflops=tflops, share=tflops / peak_tflops))
    return out


def _row(coef: Mapping[str, float], cfg: ModelConfig, kind: str) -> np.ndarray:
    """A cost-table row (c0, per token, per squared document length) of a unit of this model."""
    h, q = float(cfg.hidden_size), float(cfg.attention_width)
    if kind == "layer":
        return np.array([coef["c0"], coef["k_mm"] * 2.0 * layer_linear_params(cfg) + coef["k_attn_tok"] * 2.0 * q,
                         coef["k_attn"] * 2.0 * q])
    if kind == "head":
        return np.array([coef["c0"], (coef["k_mm"] * 2.0 * h + coef["k_logits"]) * cfg.vocab_size, 0.0])
    return np.array([coef["c0"], coef["k_mem"] * h, 0.0])


def table_rows(units: Mapping[str, Mapping[str, Mapping[str, float]]], cfg: ModelConfig,
               recompute: Recompute) -> dict[tuple[str, str], np.ndarray]:
    """The (kind, phase) rows the fit covers, for this model and checkpointing. A layer's
    backward with recomputation: measured with full recomputation where the fit has it,
    interpolated by the shares recomputed; else the backward plus those shares of the forward."""
    rows: dict[tuple[str, str], np.ndarray] = {}
    for kind, phases in units.items():
        for phase in ("fwd", "bwd"):
            if phase in phases:
                rows[kind, phase] = _row(phases[phase], cfg, kind)
        if kind == "layer" and recompute.any and ("layer", "bwd") in rows:
            shares = np.array([recompute.matmul, recompute.matmul, recompute.attention])
            if "bwd_recompute" in phases:
                extra = _row(phases["bwd_recompute"], cfg, kind) - rows["layer", "bwd"]
            else:
                extra = rows.get(("layer", "fwd"), np.zeros(3))
            rows["layer", "bwd"] = rows["layer", "bwd"] + shares * np.maximum(extra, 0.0)
    return rows


def attention_curve(lengths: Sequence[Sequence[int]], seconds: Sequence[float], heads: int, head_dim: int,
                    peak_flops: float, passes: float = 3.0) -> tuple[float, float]:
    """Attention's efficiency against document length from timings of attention alone: each
    microbatch's seconds fitted as k (sum s^2 + half sum s) (NNLS), which is its causal FLOPs
    (2 s^2 heads head_dim per document and pass) at efficiency E s / (s + half). Returns
    (E, half). `passes`: forward 1, backward 2, both 3."""
    from scipy.optimize import nnls  # as in fit(): simulations never import scipy

    design = np.array([[float(sum(s * s for s in lens)), float(sum(lens))] for lens in lengths])
    y = np.asarray(seconds, dtype=float)
    scale = design.max(axis=0)
    (k_sq, k_s), _ = nnls(design / scale / y[:, None], np.ones_like(y))
    k_sq, k_s = k_sq / scale[0], k_s / scale[1]
    return passes * 2.0 * heads * head_dim / (k_sq * peak_flops), k_s / k_sq
