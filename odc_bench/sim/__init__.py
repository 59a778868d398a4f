"""The discrete-event simulator behind `backend=sim`.

It takes the same RunSpec as real ranks (the balancer's plan for every minibatch), computes
every rank's timeline from a hardware profile, and returns the same event trace, so the run's
row comes from metrics.summarize exactly as for a real run. The model and its assumptions:
docs/simulator.md.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from odc_bench.config import SIM_ENGINES, ConfigError, RunSpec, model_config
from odc_bench.models.qwen2 import Qwen2Config
from odc_bench.sim.events import trace_frame
from odc_bench.sim.hardware import EngineCosts, Profile, load_profile
from odc_bench.sim.layout import Layout, doc_features
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
    plans = []
    for mb in spec.minibatches:
        queue = getattr(mb, "queue", None)
        if queue is not None:
            plans.append(list_schedule(mb.lengths, queue, world, table, costs, layout, knots))
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


def list_schedule(lengths: list[int], queue: list[list[int]], world: int, table: np.ndarray,
                  costs: EngineCosts, layout: Layout, knots: tuple[float, ...] = ()
                  ) -> list[list[tuple[np.ndarray, int]]]:
    """The dynamic balancer at run time: each rank claims the queue's next microbatch as soon
    as it is free, so microbatch k goes to the rank that frees up first."""
    free = [(0.0, r) for r in range(world)]
    ranks: list[list[tuple[np.ndarray, int]]] = [[] for _ in range(world)]
    for micro in queue:
        t, r = heapq.heappop(free)
        f = _micro(lengths, micro, knots)
        ranks[r].append(f)
        heapq.heappush(free, (t + microbatch_estimate(f[0], table, costs, layout), r))
    return ranks


def profile_for(spec: RunSpec) -> Profile:
    return load_profile(dict(spec.config["backend"]["hardware"]), spec.config["model"]["name"])


def simulate(spec: RunSpec) -> Simulation:
    """Every rank's events for the whole run, as a real run's trace."""
    config = spec.config
    backend = config["backend"]
    engine = config["engine"]["name"]
    if engine not in SIM_ENGINES:
        raise ConfigError(f"the simulator models engines {', '.join(SIM_ENGINES)}, not {engine!r}")
    layout = Layout(model_config_from(config))
    profile = profile_for(spec)
    table = profile.compute_table(layout, bool(backend.get("recompute", False)), engine)
    costs = profile.engine_costs(engine, layout, spec.world_size, config["precision"],
                                 int(backend.get("odc_gather_bytes", 4)))
    comp, nmb, tokens, samples = plan_arrays(spec, costs, table, layout, profile.knots)
    if engine == "collective":
        tl = collective(comp, nmb, tokens, costs)
    else:
        tl = odc(comp, nmb, tokens, costs, passes=int(backend.get("contention_passes", 3)))
    return Simulation(trace_frame(layout, tl, comp, nmb, tokens, samples), tl, comp, nmb)


def model_config_from(config: dict) -> Qwen2Config:
    return model_config(OmegaConf.create({"model": config["model"]}))


__all__ = ["SIM_ENGINES", "Simulation", "simulate"]
