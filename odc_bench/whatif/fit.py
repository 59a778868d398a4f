"""What would make the runs that do not fit in device memory fit, checked before it is said.

Each way out the what-if can name (recomputation, bf16, more nodes, shorter samples) is tried on
the runs themselves: the config changed that way is planned again, so a way the data cannot take
(more devices than one minibatch has samples) is not offered, and its memory estimate is held
against the device's. A way is suggested only when every run at that minibatch size fits with
it. When no single change is enough, recomputation and bf16 are taken together first and the
nodes or sample lengths that then fit are searched for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from odc_bench.config.backend import SimBackendConfig
from odc_bench.errors import ConfigError
from odc_bench.plan.spec import Planner, RunSpec
from odc_bench.whatif.question import Question

# More nodes are tried up to this many times the question's: past it, the answer is another model.
MAX_NODE_FACTOR = 64


def _replanned(planner: Planner, spec: RunSpec, recompute: bool = False, bf16: bool = False,
               world_size: int | None = None) -> RunSpec | None:
    """The run with these changes, planned anew with `planner` (recomputation and precision leave
    the plans as they are: the planner makes them once); None when the data or config refuses them."""
    config = spec.config
    backend = config.backend
    assert isinstance(backend, SimBackendConfig), "the what-if's runs are simulated"
    if recompute:
        config = replace(config, backend=replace(backend, recompute=True))
    if bf16:
        config = replace(config, precision="bf16")
    if world_size is not None:
        config = replace(config, world_size=world_size)
    try:
        return planner.resolve(config)
    except ConfigError:
        return None


def _all_fit(specs: Sequence[RunSpec | None]) -> bool:
    return all(s is not None and s.fits for s in specs)


def _fewest_nodes(planner: Planner, specs: list[RunSpec], question: Question) -> int | None:
    """The smallest multiple of the question's nodes at which every run fits (up to
    MAX_NODE_FACTOR times). The estimate finds the candidate, as
    more ranks only shrink the owned shards; planning then checks that the data fills
    minibatches that large."""
    limit = specs[0].memory_limit
    assert limit is not None
    for factor in range(2, MAX_NODE_FACTOR + 1):
        world = question.nodes * factor * question.devices_per_node
        if all(replace(s, config=replace(s.config, world_size=world)).memory_at(s.max_tokens).total <= limit
               for s in specs):
            fits = _all_fit([_replanned(planner, s, world_size=world) for s in specs])
            return question.nodes * factor if fits else None
    return None


def _shortest_cut(specs: list[RunSpec]) -> tuple[int, int] | None:
    """(the longest sample, the longest that would fit) when shorter samples would make every run fit."""
    limit = specs[0].memory_limit
    assert limit is not None
    longest = max(int(s.length_stats()["len_max"]) for s in specs)
    fitting = min(s.longest_fitting(limit) for s in specs)
    return (longest, fitting) if 2 <= fitting < longest else None


def ways_to_fit(specs: list[RunSpec], question: Question) -> list[str]:
    """The changes that make every one of these runs fit, in the user's terms; [] when none the
    what-if knows of does (then only a smaller model or bigger devices will)."""
    backend = specs[0].config.backend
    assert isinstance(backend, SimBackendConfig)
    planner = Planner()
    cheap = {"recompute": not backend.recompute, "bf16": specs[0].config.precision != "bf16"}
    named = {"recompute": "recomputed activations (leave out backend.recompute=false)",
             "bf16": "bf16 (leave out precision=fp32)"}
    ways = [named[k] for k, wanted in cheap.items() if wanted and _all_fit([_replanned(planner, s, **{k: True})
                                                                           for s in specs])]
    nodes = _fewest_nodes(planner, specs, question)
    if nodes is not None:
        ways.append(f"--nodes {nodes}, the fewest nodes that fit")
    cut = _shortest_cut(specs)
    if cut is not None:
        ways.append(f"samples of at most {cut[1]} tokens (the longest has {cut[0]}): truncate or drop the longer ones "
                    f"in your data")
    if ways or not any(cheap.values()):
        return ways
    # No single change is enough: take the cheap ones together, then look for nodes or lengths.
    both = [_replanned(planner, s, **cheap) for s in specs]
    if any(s is None for s in both):
        return []
    together = " and ".join(named[k].split(" (")[0] for k, wanted in cheap.items() if wanted)
    leave_out = ", ".join(named[k].split("(leave out ")[1].rstrip(")") for k, wanted in cheap.items() if wanted)
    prefix = f"{together} (leave out {leave_out})"
    planned = [s for s in both if s is not None]
    if _all_fit(planned):
        return [prefix]
    nodes = _fewest_nodes(planner, planned, question)
    if nodes is not None:
        ways.append(f"{prefix} and --nodes {nodes}")
    cut = _shortest_cut(planned)
    if cut is not None:
        ways.append(f"{prefix} and samples of at most {cut[1]} tokens (the longest has {cut[0]})")
    return ways


def advice(specs: list[RunSpec], question: Question) -> str:
    """What makes these runs fit, or that nothing the what-if can change does."""
    ways = ways_to_fit(specs, question)
    if not ways:
        return (f"nothing the what-if can change makes {question.model_name} fit (recomputation, bf16, up to "
                f"{MAX_NODE_FACTOR}x the nodes, shorter samples): use a smaller model or devices with more memory")
    return "it would fit with " + ", or with ".join(ways)
