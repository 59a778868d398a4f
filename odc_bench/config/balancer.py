"""How a minibatch is split into per-rank microbatches, and the cost model it plans with
(conf/balancer/*.yaml). The balancer's own options are checked by its record
(odc_bench/balancers/registry.py), which this stage of the data flow does not know yet."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

CostModelName = Literal["linear", "quadratic", "flops", "calibrated"]
QuadraticFit = Literal["1p5b", "7b"]


@dataclass(frozen=True, kw_only=True, slots=True)
class BalancerConfig:
    name: str
    # The predicted compute of a document (odc_bench/balancers/cost.py).
    cost_model: CostModelName = "linear"
    quadratic_fit: QuadraticFit = "1p5b"
    # calibrated only: the coefficients file; None = results/calibration/<model>-<device>.json
    calibration: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
