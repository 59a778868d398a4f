"""LocalSort: each rank takes its strided share of the minibatch and sorts it by length.

No cross-rank balancing at all: the paper's weakest baseline. By default one sample per
microbatch, longest first. With `pack`, each rank packs its share under max_tokens and the
counts are made equal across ranks (collective FSDP needs that), which isolates what packing
alone buys against LB-Micro's cross-rank balancing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from odc_bench.balancers.cost import CostModel
from odc_bench.balancers.packing import pack_equal_counts
from odc_bench.balancers.plan import Plan


@dataclass(frozen=True, kw_only=True)
class LocalSortOptions:
    # Pack each rank's share under max_tokens (counts made equal across ranks).
    pack: bool = False


def local_sort(lengths: Sequence[int], world_size: int, max_tokens: int, cost: CostModel,
               options: LocalSortOptions = LocalSortOptions()) -> Plan:
    shares = [sorted(range(rank, len(lengths), world_size), key=lambda i: (-lengths[i], i))
              for rank in range(world_size)]
    if options.pack:
        return pack_equal_counts(shares, lengths, cost, max_tokens)
    return [[[i] for i in share] for share in shares]
