"""verl's own balancing with use_dynamic_bsz, for comparison with LB-Micro (collective engine).

Read in volcengine/verl at b178a3cd (2026-01-29) and at the v0.6.0 tag (2025-10-15):
verl/utils/seqlen_balancing.py (karmarkar_karp, get_seqlen_balanced_partitions,
rearrange_micro_batches, calculate_workload) and its callers, RayPPOTrainer._balance_batch
(verl/trainer/ppo/ray_trainer.py) and DataParallelPPOActor.update_policy
(verl/workers/actor/dp_actor.py). For one minibatch verl does:

1. ranks: Karmarkar-Karp (largest differencing, no refinement) into world_size sets of equal
   sample count, on a per-sample workload;
2. microbatch count: each rank takes min(its samples, ceil(its tokens / max_tokens)), then
   all ranks take the largest (an all-reduce MAX);
3. microbatches: Karmarkar-Karp again, sample counts free, on each rank's share into that
   many sets, ordered costliest first.

The ODC reference's LB-Micro (DynamicSameMicro in sail-sg/odc examples/llm_training/packing.py)
is this procedure with four changes: the run's cost model as workload, swap refinement after
each differencing, a second try with equal-size sets (the better balanced kept), and a check
that every microbatch fits, growing the count on all ranks until it does. `refine=True` with
`workload="cost"` gives that (refinement as balancers/partition.py does it). This harness's
LB-Micro (balancers/lb_micro.py) packs differently: each rank's fewest microbatches (a
balanced split if one fits below first-fit decreasing's count, else first-fit decreasing),
then splits ranks up to the largest count.

Where verl itself differs from both:
- no refinement after differencing, and no second try with equal-size sets;
- the workload is fixed, not the run's cost model: the token count in verl up to v0.6.0
  (`workload="tokens"`, whose microbatches were then ordered by the sum of squared lengths)
  and 24576 s + s^2 from v0.6.1 on (`workload="verl_flops"`, verl's estimate for a 7B model);
  `workload="cost"` uses the run's cost model to separate the algorithm from the formula;
- the count starts from the token lower bound and verl never checks that a microbatch fits:
  differencing on workload can put more than max_tokens into one set. verl then runs the
  oversized microbatch (more memory than asked for); this harness cannot, so here the count
  grows, on every rank at once, until all sets fit, as the ODC reference does;
- scope: verl balances ranks over the whole training batch and then cuts each rank's share
  into PPO minibatches in order; this function sees one minibatch, which is verl's behaviour
  when the training batch is one PPO minibatch, or with `_balance_batch(keep_minibatch=True)`.

verl orders microbatches costliest first (up to v0.6.0) or costliest in the middle (v0.6.1 on,
for pipeline parallelism); either order is the same on every rank, so the k-th costliest
microbatches of all ranks share a step and the collective time is the same. Here: costliest first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from odc_bench.balancers.cost import CostModel
from odc_bench.balancers.partition import balanced_partition, largest_differencing
from odc_bench.balancers.plan import Microbatch, Plan
from odc_bench.sums import left_sum


@dataclass(frozen=True, kw_only=True)
class VerlOptions:
    # What verl balances: token counts (up to v0.6.0), its FLOPs formula (v0.6.1 on), or the
    # run's cost model.
    workload: Literal["tokens", "verl_flops", "cost"] = "tokens"
    # Swap refinement after Karmarkar-Karp, as the ODC reference's DynamicSameMicro does; verl has none.
    refine: bool = False


def verl_flops(length: int) -> float:
    """verl's calculate_workload (v0.6.1 on): 24576 s + s^2, dense attention and MLP of a 7B model."""
    return 24576.0 * length + float(length) ** 2


def _workload(name: str, cost: CostModel) -> Callable[[int], float]:
    if name == "tokens":
        return float
    if name == "verl_flops":
        return verl_flops
    return cost


def _split(share: Sequence[int], keys: Sequence[float], k: int, refine: bool) -> list[Microbatch]:
    sub = [keys[i] for i in share]
    parts = balanced_partition(sub, k) if refine else largest_differencing(sub, k)
    return [[share[j] for j in p] for p in parts if p]


def verl(lengths: Sequence[int], world_size: int, max_tokens: int, cost: CostModel,
         options: VerlOptions = VerlOptions()) -> Plan:
    """verl's plan; with workload="cost" and refine=True, the ODC reference's DynamicSameMicro."""
    workload, refine = options.workload, options.refine
    if len(lengths) % world_size:
        raise ValueError(f"verl needs equal samples per rank: {len(lengths)} samples on {world_size} ranks")
    weigh = _workload(workload, cost)
    keys = [weigh(n) for n in lengths]
    shares = (balanced_partition if refine else largest_differencing)(keys, world_size, equal_size=True)
    if max(lengths, default=0) > max_tokens:
        raise ValueError(f"a sample of {max(lengths)} tokens cannot fit in microbatches of {max_tokens}")
    k = max(min(len(s), math.ceil(sum(lengths[i] for i in s) / max_tokens)) for s in shares)
    while True:
        plan = [_split(share, keys, min(k, len(share)), refine) for share in shares]
        if all(sum(lengths[i] for i in mb) <= max_tokens for rank in plan for mb in rank):
            break
        k += 1
    # Up to v0.6.0 verl partitioned on tokens but ordered by squared lengths (attention).
    order_key = (lambda n: float(n) ** 2) if workload == "tokens" else weigh
    return [sorted(rank, key=lambda mb: (-left_sum(order_key(lengths[i]) for i in mb), min(mb))) for rank in plan]
