"""The discrete-event simulator behind `backend=sim`.

It takes the same RunSpec as real ranks (the balancer's plan for every minibatch), computes
every rank's timeline from a hardware profile, and returns the same event trace, so the run's
row comes from the same metrics as a real run's. The model and its assumptions:
docs/simulator.md.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from odc_bench.balancers.schedule import list_schedule
from odc_bench.config.backend import CalibratedHardwareConfig, SimBackendConfig
from odc_bench.errors import ConfigError
from odc_bench.forked import first_here, usable_cpus
from odc_bench.models.memory import estimate
from odc_bench.plan.spec import RunSpec
from odc_bench.sim.events import totals, trace_frame
from odc_bench.sim.hardware import EngineCosts, load_profile
from odc_bench.sim.layout import Layout, doc_features
from odc_bench.sim.stale import StaleTimeline, stale_odc, stale_totals, stale_trace
from odc_bench.sim.timeline import Timeline, collective, concatenated, odc
from odc_bench.sizes import host_available_bytes

# ODC timelines of fewer (minibatch, rank) pairs than this are computed in one process: below
# it, forking a worker and sending its share back costs about what the split saves.
SIDE_BY_SIDE_FROM = 16_384


@dataclass
class Simulation:
    """A simulated run: its timeline, compute per (unit kind, direction) column (M, R, J, K;
    layout.position_cost_index names each position's), microbatch counts (M, R), tokens and
    samples per microbatch (M, R, J)."""

    layout: Layout
    timeline: Timeline
    comp: np.ndarray
    nmb: np.ndarray
    tokens: np.ndarray
    samples: np.ndarray
    # Stale-synchronous ODC's (engine.staleness >= 1): its times are absolute, its steps its own.
    stale: StaleTimeline | None = None

    @cached_property
    def events(self) -> pd.DataFrame:
        """The run's trace, as real ranks write it (needs simulate(..., trace=True))."""
        if self.stale is not None:
            return stale_trace(self.layout, self.stale, self.comp, self.nmb, self.tokens, self.samples)
        return trace_frame(self.layout, self.timeline, self.comp, self.nmb, self.tokens, self.samples)

    def totals(self, warmup: int) -> dict[str, float]:
        """What the row's timing columns come from (record.metrics.summary), without the trace."""
        if self.stale is not None:
            return stale_totals(self.layout, self.stale, self.comp, self.nmb, warmup)
        return totals(self.layout, self.timeline, self.comp, self.nmb, warmup)


def plan_arrays(spec: RunSpec, costs: EngineCosts, table: np.ndarray, layout: Layout, knots: tuple[float, ...] = ()
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Compute seconds per (kind, phase) column (M, R, J, 6), microbatch counts (M, R), tokens
    and samples (M, R, J)."""
    world = spec.world_size
    plans: list[list[list[list[int]]]] = []
    for mb in spec.minibatches:
        if mb.queue is not None:
            plans.append(claimed(mb.lengths, mb.queue, world, table, costs, layout, knots))
        else:
            plans.append(mb.plan)
    M, J = len(plans), max((len(rank) for plan in plans for rank in plan), default=0)
    J = max(J, 1)
    nmb = np.array([[len(rank) for rank in plan] for plan in plans], dtype=np.int64).reshape(M, world)
    # Every document once, with the flat (m, r, j) slot of its microbatch: the features of all
    # microbatches are then sums over slots (layout.doc_features, vectorised).
    micro_sizes: list[int] = []
    docs: list[np.ndarray] = []
    for plan, mb in zip(plans, spec.minibatches, strict=True):
        micros = list(itertools.chain.from_iterable(plan))
        micro_sizes.extend(map(len, micros))
        docs.append(np.asarray(mb.lengths, dtype=np.float64)[list(itertools.chain.from_iterable(micros))])
    lens = np.concatenate(docs) if docs else np.zeros(0)
    # Microbatches in plan order: rank by rank, j = 0 .. nmb - 1 within each.
    first = np.cumsum(nmb.ravel()) - nmb.ravel()
    j = np.arange(int(nmb.sum())) - np.repeat(first, nmb.ravel())
    slot = np.repeat(np.repeat(np.arange(M * world) * J, nmb.ravel()) + j, micro_sizes)
    size = M * world * J
    columns = [np.bincount(slot, minlength=size).astype(float), np.bincount(slot, lens, size),
               np.bincount(slot, lens * lens, size)]
    columns += [np.bincount(slot, np.maximum(lens - k, 0.0) ** 2, size) for k in knots]
    feats = np.stack([(columns[0] > 0).astype(float), *columns[1:]], axis=-1).reshape(M, world, J, -1)
    return feats @ table.T, nmb, feats[..., 1], columns[0].reshape(M, world, J)


def microbatch_estimate(features: np.ndarray, table: np.ndarray, costs: EngineCosts, layout: Layout) -> float:
    """A microbatch's seconds on one rank without contention: what a rank claiming from a
    queue would take (used to order claims, not to time them)."""
    per_kind = table @ features
    tok = features[1]
    serial = costs.pre.sum() + costs.tail + costs.prep + (costs.pre_tok.sum() + costs.tail_tok) * tok
    return float(per_kind[layout.position_cost_index].sum() + serial)


def claimed(lengths: list[int], queue: list[list[int]], world: int, table: np.ndarray,
            costs: EngineCosts, layout: Layout, knots: tuple[float, ...] = ()) -> list[list[list[int]]]:
    """The dynamic balancer at run time: each rank claims the queue's next microbatch as soon
    as it is free, so microbatch k goes to the rank that frees up first."""
    seconds = [microbatch_estimate(doc_features([lengths[i] for i in micro], knots), table, costs, layout)
               for micro in queue]
    return [[queue[i] for i in rank] for rank in list_schedule(seconds, world)]


def check_hardware(spec: RunSpec) -> None:
    """ConfigError when the run's hardware profile cannot simulate it: before anything is written.

    The CPU profile is fitted from real runs of the model on this host, so a model that cannot
    train here has none and never will: the fix is a GPU profile, not a calibration."""
    config = spec.config
    backend = config.backend
    assert isinstance(backend, SimBackendConfig)
    hw = backend.hardware
    if isinstance(hw, CalibratedHardwareConfig) and not hw.calibration_file(config.model.name).exists():
        local = estimate(config.model, spec.world_size, config.precision, spec.max_tokens,
                         cpu_longest=spec.max_tokens, compute_shard_copy=config.engine.spec.runtime.compute_shard_copy)
        per_rank = host_available_bytes() // spec.world_size
        if local.total > per_rank:
            raise ConfigError(
                f"backend/hardware={hw.name} simulates this machine's CPU ranks as fitted from real runs of the model "
                f"here, but model {config.model.name} would need about {local.total / 2**30:.1f} GiB per rank, over "
                f"the {per_rank / 2**30:.1f} GiB this host has for each; simulate it on a GPU profile "
                f"(backend/hardware=a100 or h100)")
    profile = load_profile(hw, config.model.name)
    profile.check_ranks(config, spec.world_size)
    layout = Layout(config.model)
    timeline = config.engine.spec.simulated_as
    assert timeline is not None, "resolve() refuses engines the simulator does not model"
    profile.compute_table(layout, backend.recomputed)
    profile.engine_costs(timeline, layout, spec.world_size, config.precision, backend.odc_gather_bytes,
                         config.engine.options.shard, backend.odc_fetch, backend.odc_internode_slowdown)


def simulate(spec: RunSpec, trace: bool = True) -> Simulation:
    """Every rank's timeline for the whole run; with `trace`, also what its event trace needs
    (Simulation.events): per-position start times, (M, R, J, P)."""
    config = spec.config
    backend = config.backend
    assert isinstance(backend, SimBackendConfig)
    timeline = config.engine.spec.simulated_as
    assert timeline is not None, "resolve() refuses engines the simulator does not model"
    layout = Layout(config.model)
    profile = load_profile(backend.hardware, config.model.name)
    profile.check_ranks(config, spec.world_size)
    table = profile.compute_table(layout, backend.recomputed)
    costs = profile.engine_costs(timeline, layout, spec.world_size, config.precision, backend.odc_gather_bytes,
                                 config.engine.options.shard, backend.odc_fetch, backend.odc_internode_slowdown)
    comp, nmb, tokens, samples = plan_arrays(spec, costs, table, layout, profile.knots)
    columns = layout.position_cost_index
    if timeline == "odc" and config.engine.staleness:
        st = stale_odc(comp, nmb, tokens, costs, config.engine.staleness, columns=columns, record=trace)
        return Simulation(layout, st.timeline, comp, nmb, tokens, samples, stale=st)
    if timeline == "collective":
        tl = collective(comp, nmb, tokens, costs, columns=columns)
    else:
        tl = odc_side_by_side(comp, nmb, tokens, costs, backend.contention_passes, columns, record=trace)
    return Simulation(layout, tl, comp, nmb, tokens, samples)


def odc_side_by_side(comp: np.ndarray, nmb: np.ndarray, tokens: np.ndarray, costs: EngineCosts, passes: int,
                     columns: np.ndarray, record: bool) -> Timeline:
    """timeline.odc, a large run's minibatches split into runs of consecutive ones: one run here,
    one in a process forked for each other CPU this process may use (forked.py). A minibatch's
    timeline depends on its own plan alone (contention.py), so the split changes no bit. A
    recorded timeline (per-position start times, for a trace) is computed here: sending it back
    would cost more than the split saves."""
    M, R = nmb.shape
    ways = min(usable_cpus(), M) if not record and M * R >= SIDE_BY_SIDE_FROM else 1
    if ways <= 1:
        return odc(comp, nmb, tokens, costs, passes=passes, columns=columns, record=record)
    bounds = np.linspace(0, M, ways + 1).round().astype(int)
    calls = [(comp[a:b], nmb[a:b], tokens[a:b], costs, passes, columns) for a, b in itertools.pairwise(bounds)]
    return concatenated(first_here(_odc_share, calls, ways - 1))


def _odc_share(comp: np.ndarray, nmb: np.ndarray, tokens: np.ndarray, costs: EngineCosts, passes: int,
               columns: np.ndarray) -> Timeline:
    """One share of odc_side_by_side."""
    return odc(comp, nmb, tokens, costs, passes=passes, columns=columns, record=False)
