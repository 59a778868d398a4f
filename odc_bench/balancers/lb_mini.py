"""LB-Mini, the paper's balancer (the reference's DynamicDiffMicro); it runs only with ODC.

ODC synchronizes once per minibatch, so a rank's time is the sum of its microbatches and
only the per-rank totals need balancing: Karmarkar-Karp on total cost, sample counts free,
then each rank packs its share into as few microbatches as max_tokens allows (each
microbatch costs a pass of parameter gathers). Counts differ across ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from odc_bench.balancers.cost import CostModel
from odc_bench.balancers.packing import pack_fewest_each
from odc_bench.balancers.partition import balanced_partition
from odc_bench.balancers.plan import Plan


@dataclass(frozen=True, kw_only=True)
class LbMiniOptions:
    # Equal sample counts per rank, for RL frameworks such as verl that shard rollouts equally
    # across devices; microbatch counts may still differ.
    equal_samples: bool = False


def lb_mini(lengths: Sequence[int], world_size: int, max_tokens: int, cost: CostModel,
            options: LbMiniOptions = LbMiniOptions()) -> Plan:
    if options.equal_samples and len(lengths) % world_size:
        raise ValueError(f"equal_samples needs the sample count ({len(lengths)}) to divide by the ranks "
                         f"({world_size})")
    shares = balanced_partition(cost.each(lengths).tolist(), world_size, equal_size=options.equal_samples)
    return pack_fewest_each(shares, lengths, cost, max_tokens)
