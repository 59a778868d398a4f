"""The balancers, one record each: config checks, planning, the simulator and figures read
these, so adding a balancer is its module, one entry below and one config file
(odc_bench/conf/balancer/NAME.yaml)."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from odc_bench.balancers.cost import CostModel, linear
from odc_bench.balancers.dynamic import DynamicOptions, dynamic_queue, scheduled
from odc_bench.balancers.lb_carry import LbCarryOptions, lb_carry
from odc_bench.balancers.lb_micro import LbMicroOptions, lb_micro
from odc_bench.balancers.lb_mini import LbMiniOptions, lb_mini
from odc_bench.balancers.local_sort import LocalSortOptions, local_sort
from odc_bench.balancers.plan import Microbatch, Plan, check_plan
from odc_bench.balancers.verl import VerlOptions, verl
from odc_bench.config.fields import build, require

# (lengths, world_size, max_tokens, cost, options) -> what the balancer makes of one minibatch
Planner = Callable[[Sequence[int], int, int, CostModel, Any], Plan]
Queuer = Callable[[Sequence[int], int, int, CostModel, Any], list[Microbatch]]
# (lengths, world_size, max_tokens, cost, options, ready) -> a plan for ranks free at ready[r]
CarryPlanner = Callable[[Sequence[int], int, int, CostModel, Any, Sequence[float]], Plan]


@dataclass(frozen=True)
class BalancerSpec:
    name: str
    label: str  # how figures and tables name it
    options: type  # a frozen dataclass: its fields are balancer.options.*
    # Every rank gets the same number of microbatches (engines that synchronise per unit need it).
    equal_counts: bool
    # A static plan, a queue that ranks claim from at run time (the plan is then its
    # predicted outcome under the cost model), or a static plan made knowing when each rank
    # will be free (stale-synchronous ODC, balancers/quality.py StaleClock): exactly one.
    plan: Planner | None = None
    queue: Queuer | None = None
    # One of the series the what-if verdict simulates by default (odc_bench/whatif): the paper's
    # comparison; the others on request (--all-balancers).
    verdict: bool = False
    carry: CarryPlanner | None = None


BALANCERS: dict[str, BalancerSpec] = {
    "local_sort": BalancerSpec("local_sort", "LocalSort", LocalSortOptions, equal_counts=True, plan=local_sort,
                               verdict=True),
    "lb_micro": BalancerSpec("lb_micro", "LB-Micro", LbMicroOptions, equal_counts=True, plan=lb_micro, verdict=True),
    "lb_mini": BalancerSpec("lb_mini", "LB-Mini", LbMiniOptions, equal_counts=False, plan=lb_mini, verdict=True),
    "dynamic": BalancerSpec("dynamic", "Dynamic", DynamicOptions, equal_counts=False, queue=dynamic_queue),
    "verl": BalancerSpec("verl", "verl", VerlOptions, equal_counts=True, plan=verl),
    "lb_carry": BalancerSpec("lb_carry", "LB-Carry", LbCarryOptions, equal_counts=False, carry=lb_carry),
}


def balancer_spec(name: str) -> BalancerSpec:
    require(name in BALANCERS, f"unknown balancer {name!r}; choose one of {', '.join(sorted(BALANCERS))}")
    return BALANCERS[name]


def balancer_options(name: str, values: Mapping[str, Any]) -> Any:
    """balancer.options.* as the balancer's options object; ConfigError naming a bad key."""
    return build(balancer_spec(name).options, values, "balancer.options.")


def plan_minibatch(spec: BalancerSpec, options: Any, lengths: Sequence[int], world_size: int, max_tokens: int,
                   cost: CostModel, ready: Sequence[float] | None = None) -> tuple[Plan, list[Microbatch] | None]:
    """One minibatch's plan, checked, and the claim queue of a run-time balancer (else None).
    `ready`: when each rank will be free for the minibatch (None: all at once)."""
    queue = None
    if spec.queue is not None:
        queue = spec.queue(lengths, world_size, max_tokens, cost, options)
        plan = scheduled(queue, lengths, cost, world_size)
    elif spec.carry is not None:
        plan = spec.carry(lengths, world_size, max_tokens, cost, options, ready or [0.0] * world_size)
    else:
        assert spec.plan is not None
        plan = spec.plan(lengths, world_size, max_tokens, cost, options)
    check_plan(plan, lengths, world_size, max_tokens)
    return plan, queue


def balance(lengths: Sequence[int], world_size: int, max_tokens: int, balancer: str = "lb_mini",
            cost: CostModel | None = None, ready: Sequence[float] | None = None, **options: Any) -> Plan:
    """One minibatch's plan by the balancer named: for each rank, its microbatches as lists of
    indices into `lengths`, each microbatch within max_tokens. `cost` prices a sample of n
    tokens (default linear: tokens); `options` are the balancer's (e.g. equal_samples=True for
    lb_mini). A run-time balancer (dynamic) gives its predicted outcome under `cost`."""
    _check_arguments(lengths, world_size, max_tokens, cost)
    world_size, max_tokens = int(world_size), int(max_tokens)  # 8.0 from a config read as floats
    spec = balancer_spec(name=balancer)
    plan, _ = plan_minibatch(spec, balancer_options(balancer, options), lengths, world_size, max_tokens,
                             linear() if cost is None else cost, ready)
    return plan


def _whole(value: object) -> bool:
    """An integer, or a float of one (a length read from a table of floats); not a bool."""
    if isinstance(value, bool | np.bool_):
        return False
    return isinstance(value, numbers.Integral) or (isinstance(value, numbers.Real) and float(value).is_integer())


def _check_arguments(lengths: object, world_size: object, max_tokens: object, cost: object) -> None:
    """balance()'s arguments, each refused in one line: before, a length of -1 or 5.5, or a string,
    was planned without a word (or failed deep in one balancer), world_size=True planned one
    rank, and max_tokens=0 and a cost model given by name failed in a ZeroDivisionError and an
    AttributeError."""
    for name, value in (("world_size", world_size), ("max_tokens", max_tokens)):
        if not _whole(value) or value < 1:  # type: ignore[operator]
            raise ValueError(f"balance(): {name} must be a whole number of at least 1, got {value!r}")
    if isinstance(lengths, str | bytes) or not isinstance(lengths, Sequence | np.ndarray):
        raise TypeError(f"balance(): lengths must be a list or an array of the samples' token counts, got "
                        f"{type(lengths).__name__}")
    bad = next(((i, x) for i, x in enumerate(lengths) if not _whole(x) or x < 1), None)
    if bad is not None:
        raise ValueError(f"balance(): lengths[{bad[0]}] must be a sample's token count, a whole number of at least 1, "
                         f"got {bad[1]!r}")
    if cost is not None and not isinstance(cost, CostModel):
        raise TypeError(f"balance(): cost must be a cost model (linear(), quadratic(fit), flops(model_config)) or "
                        f"None, got {type(cost).__name__}")
