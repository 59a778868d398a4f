"""The plan stage's balancers: pure functions from a minibatch's sample lengths to a per-rank
microbatch plan (one record each in registry.py), the cost models they plan with (cost.py),
and how good a plan is predicted to be (quality.py).

A library too: `balance(lengths, world_size, max_tokens, "lb_mini", cost)` plans one minibatch
for any training loop (docs/use_odc.md); the names below are the public API.
"""

from odc_bench.balancers.cost import CostModel, flops, linear, quadratic
from odc_bench.balancers.dynamic import dynamic_queue
from odc_bench.balancers.lb_carry import lb_carry
from odc_bench.balancers.lb_micro import lb_micro
from odc_bench.balancers.lb_mini import lb_mini
from odc_bench.balancers.local_sort import local_sort
from odc_bench.balancers.plan import Microbatch, Plan, check_plan
from odc_bench.balancers.quality import predict
from odc_bench.balancers.registry import BALANCERS, balance

__all__ = ["BALANCERS", "CostModel", "Microbatch", "Plan", "balance", "check_plan", "dynamic_queue", "flops",
           "lb_carry", "lb_micro", "lb_mini", "linear", "local_sort", "predict", "quadratic"]
