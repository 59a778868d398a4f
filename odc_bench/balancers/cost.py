"""Cost models: the predicted compute time of a document, from its length.

Balancers decide from these predictions, and the predicted bubble rate is computed from
them, so they only need to be right in proportion. All four are quadratic in the document
length s (attention grows as s^2, everything else as s), which keeps them comparable:

- linear: s, in tokens;
- quadratic: a x^2 + b x with x = s / 32000, the reference implementation's fits of measured
  A100 time (`1p5b`: a=1.982122 b=2.611821; `7b`: a=4.348357 b=8.768377);
- flops: forward plus backward FLOPs of the run's model (models/flops.py), in TFLOP;
- calibrated: a x^2 + b x with x = s / 1000, in seconds, plus a per-microbatch constant c,
  fitted on this machine by `python -m odc_bench.calibrate.cost_model`.

A microbatch costs the sum of its documents (attention is per document) plus the model's
per-microbatch constant c (zero except when calibrated).

Costs are always evaluated on the lengths the run actually trains on, i.e. after
dataset.length_scale: the reference fits describe real lengths on A100s, so on a scaled-down
CPU run they are almost linear (x is tiny), while a calibration on this machine describes
what the run really does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from odc_bench.config.balancer import BalancerConfig
from odc_bench.config.model import ModelConfig
from odc_bench.errors import ConfigError
from odc_bench.models.flops import train_flops
from odc_bench.provenance import REPO_ROOT
from odc_bench.sums import left_sum

# The reference implementation's fits of measured time, with x = length / 32000.
QUADRATIC_FITS: dict[str, tuple[float, float]] = {
    "1p5b": (1.982122, 2.611821),
    "7b": (4.348357, 8.768377),
}
QUADRATIC_UNIT = 32_000
CALIBRATION_UNIT = 1_000
# Where `python -m odc_bench.calibrate.cost_model` writes, and runs read, a calibration when
# balancer.calibration does not say: the repository's, as the simulator's CPU profiles are, so
# that a command run from another folder finds the committed ones (sweep=demo plans with one).
CALIBRATION_DIR = REPO_ROOT / "results" / "calibration"


@dataclass(frozen=True)
class CostModel:
    """cost(s) = a (s/unit)^2 + b (s/unit) per document; c once per microbatch."""

    label: str
    a: float
    b: float
    c: float = 0.0
    unit: float = 1.0

    def __call__(self, length: int) -> float:
        x = length / self.unit
        return self.a * x * x + self.b * x

    def microbatch(self, lengths: Iterable[int]) -> float:
        return self.c + left_sum(self(n) for n in lengths)

    def each(self, lengths: Sequence[int] | np.ndarray) -> np.ndarray:
        """The cost of every document at once: elementwise the same arithmetic as calling the
        model on each, so equal to it to the last bit."""
        x = np.asarray(lengths, dtype=np.float64) / self.unit
        return self.a * x * x + self.b * x


def linear() -> CostModel:
    return CostModel("linear", a=0.0, b=1.0)


def quadratic(fit: str) -> CostModel:
    if fit not in QUADRATIC_FITS:
        raise KeyError(fit)
    a, b = QUADRATIC_FITS[fit]
    return CostModel(f"quadratic:{fit}", a=a, b=b, unit=QUADRATIC_UNIT)


def flops(cfg: ModelConfig) -> CostModel:
    """The model's training FLOPs per document, in TFLOP, read off models/flops.py.

    train_flops is a quadratic without constant term in the document length, so two
    evaluations determine it exactly: f(1) = a + b and f(2) = 4a + 2b.
    """
    f1, f2 = train_flops(cfg, [1]) / 1e12, train_flops(cfg, [2]) / 1e12
    a = (f2 - 2 * f1) / 2
    return CostModel("flops", a=a, b=f1 - a)


def device_tag(device_type: str, device_name: str = "") -> str:
    """A file-name-safe name of the hardware a calibration is valid for."""
    if device_type == "cpu":
        return "cpu"
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    return f"{device_type}-{slug}" if slug else device_type


def calibration_path(model_name: str, tag: str, override: str | None = None) -> Path:
    return Path(override).expanduser() if override else CALIBRATION_DIR / f"{model_name}-{tag}.json"


def load_calibration(path: Path) -> CostModel:
    """The fitted coefficients written by `python -m odc_bench.calibrate.cost_model`.

    Raises FileNotFoundError if the file is missing and ValueError if it is not a calibration.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark, as an editor may save one
        a, b, c, unit = (float(data[k]) for k in ("a", "b", "c", "unit"))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path} is not a calibration file ({type(e).__name__}: {e})") from None
    if min(a, b, c) < 0 or a + b <= 0 or unit <= 0:
        raise ValueError(f"{path} has invalid coefficients a={a} b={b} c={c} unit={unit}")
    return CostModel(f"calibrated:{path.stem}", a=a, b=b, c=c, unit=unit)


def cost_model_for(b: BalancerConfig, model: ModelConfig, device_tag_: str) -> CostModel:
    """The cost model a run's balancer plans with; ConfigError when its calibration is missing."""
    if b.cost_model == "linear":
        return linear()
    if b.cost_model == "quadratic":
        return quadratic(b.quadratic_fit)
    if b.cost_model == "flops":
        return flops(model)
    path = calibration_path(model.name, device_tag_, b.calibration)
    fix = f"run `python -m odc_bench.calibrate.cost_model model={model.name}` on this machine first"
    try:
        return load_calibration(path)
    except FileNotFoundError:
        raise ConfigError(f"no calibration at {path}; {fix}, or choose another balancer.cost_model") from None
    except ValueError as e:
        raise ConfigError(f"{e}; {fix}") from None
