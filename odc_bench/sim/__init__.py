"""The discrete-event simulator behind `backend=sim`.

It takes the same RunSpec as real ranks (the balancer's plan for every minibatch), computes
every rank's timeline from a hardware profile, and returns the same event trace, so the run's
row comes from metrics.summarize exactly as for a real run. The model and its assumptions:
docs/simulator.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from odc_bench.balancers.schedule import list_schedule
from odc_bench.config.backend import SimBackendConfig
from odc_bench.plan.spec import RunSpec
from odc_bench.sim.events import trace_frame
from odc_bench.sim.hardware import EngineCosts, load_profile
from odc_bench.sim.layout import Layout, doc_features
from odc_bench.sim.stale import stale_odc, stale_trace
from odc_bench.sim.timeline import Timeline, collective, odc


@dataclass
class Simulation:
    events: pd.DataFrame
    timeline: Timeline
    comp: np.ndarray
    nmb: np.ndarray


def plan_arrays(spec: RunSpec, costs: EngineCosts, table: np.ndarray, layout: Layout, knots: tuple[float, ...] = ()
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Compute seconds (M, R, J, P), microbatch counts (M, R), tokens and samples (M, R, J)."""
    world = spec.world_size
    plans: list[list[list[tuple[np.ndarray, int]]]] = []
    for mb in spec.minibatches:
        if mb.queue is not None:
            plans.append(claimed(mb.lengths, mb.queue, world, table, costs, layout, knots))
        else:
            plans.append([[_micro(mb.lengths, micro, knots) for micro in rank] for rank in mb.plan])
    M, J = len(plans), max((len(rank) for plan in plans for rank in plan), default=0)
    feats = np.zeros((M, world, max(J, 1), table.shape[1]))
    samples = np.zeros((M, world, max(J, 1)))
    nmb = np.zeros((M, world), dtype=np.int64)
    for m, plan in enumerate(plans):
        for r, rank in enumerate(plan):
            nmb[m, r] = len(rank)
            for j, (f, n) in enumerate(rank):
                feats[m, r, j] = f
                samples[m, r, j] = n
    per_kind = feats @ table.T  # (M, R, J, 6): seconds per (kind, phase)
    comp = per_kind[..., layout.position_cost_index]
    return comp, nmb, feats[..., 1], samples


def _micro(lengths: list[int], micro: list[int], knots: tuple[float, ...]) -> tuple[np.ndarray, int]:
    """A microbatch's compute features (layout.doc_features) and its number of samples."""
    return doc_features([lengths[i] for i in micro], knots), len(micro)


def microbatch_estimate(features: np.ndarray, table: np.ndarray, costs: EngineCosts, layout: Layout) -> float:
    """A microbatch's seconds on one rank without contention: what a rank claiming from a
    queue would take (used to order claims, not to time them)."""
    per_kind = table @ features
    tok = features[1]
    serial = costs.pre.sum() + costs.tail + costs.prep + (costs.pre_tok.sum() + costs.tail_tok) * tok
    return float(per_kind[layout.position_cost_index].sum() + serial)


def claimed(lengths: list[int], queue: list[list[int]], world: int, table: np.ndarray,
            costs: EngineCosts, layout: Layout, knots: tuple[float, ...] = ()
            ) -> list[list[tuple[np.ndarray, int]]]:
    """The dynamic balancer at run time: each rank claims the queue's next microbatch as soon
    as it is free, so microbatch k goes to the rank that frees up first."""
    micros = [_micro(lengths, micro, knots) for micro in queue]
    seconds = [microbatch_estimate(f, table, costs, layout) for f, _ in micros]
    return [[micros[i] for i in rank] for rank in list_schedule(seconds, world)]


def simulate(spec: RunSpec) -> Simulation:
    """Every rank's events for the whole run, as a real run's trace."""
    config = spec.config
    backend = config.backend
    assert isinstance(backend, SimBackendConfig)
    timeline = config.engine.spec.simulated_as
    assert timeline is not None, "resolve() refuses engines the simulator does not model"
    layout = Layout(config.model)
    profile = load_profile(backend.hardware, config.model.name)
    table = profile.compute_table(layout, backend.recompute)
    costs = profile.engine_costs(timeline, layout, spec.world_size, config.precision, backend.odc_gather_bytes)
    comp, nmb, tokens, samples = plan_arrays(spec, costs, table, layout, profile.knots)
    if timeline == "odc" and config.engine.staleness:
        st = stale_odc(comp, nmb, tokens, costs, config.engine.staleness)
        return Simulation(stale_trace(layout, st, comp, nmb, tokens, samples), st.timeline, comp, nmb)
    if timeline == "collective":
        tl = collective(comp, nmb, tokens, costs)
    else:
        tl = odc(comp, nmb, tokens, costs, passes=backend.contention_passes)
    return Simulation(trace_frame(layout, tl, comp, nmb, tokens, samples), tl, comp, nmb)
