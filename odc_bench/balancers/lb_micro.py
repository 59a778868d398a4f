"""LB-Micro: the strongest collective baseline (the reference's DynamicSameMicro).

Karmarkar-Karp splits the minibatch across ranks with equal sample counts and balanced
cost; each rank packs its share under max_tokens; every rank then gets the largest count any
rank needs (collective FSDP runs microbatch steps in lock step), heaviest first so that the
steps pair microbatches of similar cost. It needs the sample count to divide by the ranks,
which the harness guarantees (a minibatch is world_size x minibatch_size samples).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from odc_bench.balancers.cost import CostModel
from odc_bench.balancers.packing import pack_equal_counts
from odc_bench.balancers.partition import balanced_partition
from odc_bench.balancers.plan import Plan


@dataclass(frozen=True, kw_only=True)
class LbMicroOptions:
    """LB-Micro has no options."""


def lb_micro(lengths: Sequence[int], world_size: int, max_tokens: int, cost: CostModel,
             options: LbMicroOptions = LbMicroOptions()) -> Plan:
    if len(lengths) % world_size:
        raise ValueError(f"lb_micro needs equal samples per rank: {len(lengths)} samples on {world_size} ranks")
    shares = balanced_partition(cost.each(lengths).tolist(), world_size, equal_size=True)
    return pack_equal_counts(shares, lengths, cost, max_tokens)
