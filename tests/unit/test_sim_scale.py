"""The simulator at scale: topologies, hybrid sharding, topology-aware fetch, and a cost that
grows with ranks x minibatches. Timelines are small cases worked by hand (in each docstring)."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odc_bench.balancers.cost import linear
from odc_bench.balancers.local_sort import LocalSortOptions, local_sort
from odc_bench.balancers.registry import BalancerSpec
from odc_bench.config.backend import GpuHardwareConfig
from odc_bench.forked import first_here
from odc_bench.plan import plans as plan_plans
from odc_bench.plan import spec as plan_spec
from odc_bench.plan.plans import Plans
from odc_bench.plan.spec import Planner, plan_digest, resolve
from odc_bench.record.row import sim_timing, timing
from odc_bench.sim import simulate
from odc_bench.sim.contention import Contention, Holders, _SortedRows
from odc_bench.sim.hardware import EngineCosts, GpuProfile, Network
from odc_bench.sim.layout import Layout
from odc_bench.sim.timeline import collective, odc
from tests.helpers import REPO, odc_bench, run_config


def costs(P: int, *, ag=0.0, rs=0.0, ar=None, gather=0.0, network=None, nearest=False, sync=0.0) -> EngineCosts:
    def arr(x):
        return np.broadcast_to(np.asarray(x, dtype=float), (P,)).copy()

    return EngineCosts(pre=arr(0.0), pre_tok=arr(0.0), tail=0.0, tail_tok=0.0, prep=0.0, ag=arr(ag), rs=arr(rs),
                       ar=None if ar is None else arr(ar), gather_load=arr(gather), push_load=arr(0.0),
                       gather_bytes=arr(gather), sync_s=sync, optimizer_s=0.0, barrier_s=0.0, network=network,
                       fetch_nearest=nearest)


def no_tokens(comp: np.ndarray) -> np.ndarray:
    return np.zeros(comp.shape[:3])


# -- hybrid sharding ------------------------------------------------------------------------

def test_hsdp_all_reduces_each_units_gradient_after_its_reduce_scatter_and_the_microbatch_waits():
    """Two positions, one microbatch, compute 1 s each; all-gathers 0.2 s, the backward
    position's reduce-scatter 0.3 s and its all-reduce across nodes 2 s.

    AG(0) [0, .2]; position 0 [.2, 1.2] while AG(1) [.2, .4]; position 1 [1.2, 2.2]; RS(1)
    [2.2, 2.5]; AR(1) [2.5, 4.5] on its own channel. The microbatch (and the minibatch, no
    optimizer time) ends with the all-reduce at 4.5; without it, with the reduce-scatter at 2.5.
    A second microbatch starts at 4.5 (FSDP2 waits for its reductions at the end of backward),
    its first all-gather prefetched long before: positions [4.5, 5.5] and [5.5, 6.5], RS
    [6.5, 6.8], AR [6.8, 8.8].
    """
    comp = np.ones((1, 2, 2, 2))
    one, two = np.array([[1, 1]]), np.array([[2, 2]])
    plain = dict(ag=0.2, rs=[0.0, 0.3])
    assert collective(comp[:, :, :1], one, no_tokens(comp[:, :, :1]), costs(2, **plain)).duration[0] == \
        pytest.approx(2.5)
    tl = collective(comp[:, :, :1], one, no_tokens(comp[:, :, :1]), costs(2, **plain, ar=[0.0, 2.0]))
    assert tl.duration[0] == pytest.approx(4.5)
    tl = collective(comp, two, no_tokens(comp), costs(2, **plain, ar=[0.0, 2.0]))
    assert tl.mb_t0[0, 0, 1] == pytest.approx(4.5) and tl.duration[0] == pytest.approx(8.8)


def test_hybrid_odc_reduces_across_nodes_once_per_minibatch_after_the_barrier():
    """Rank 0 computes 3 s, rank 1 1 s, within one node (no contention); the all-reduce
    across nodes (sync_s) 0.5 s comes after the barrier, once: 3 + 0.5 = 3.5, whatever the
    microbatch count (rank 0's 3 s as three microbatches gives the same)."""
    net = Network(world=2, gpus_per_node=2, link_Bps=1e30, nic_Bps=1.0, latency_s=0.0)
    comp = np.zeros((1, 2, 3, 2))
    comp[0, 0] = 0.5
    comp[0, 1, 0] = 0.5
    tl = odc(comp, np.array([[3, 1]]), no_tokens(comp), costs(2, gather=1.0, network=net, sync=0.5))
    assert tl.sync_t0[0, 0] == pytest.approx(3.0) and tl.duration[0] == pytest.approx(3.5)


def hardware(**overrides) -> GpuHardwareConfig:
    """Round numbers: 2 GPUs per node, links of 100 B/s, a node's NIC 10 B/s, no latencies."""
    values = dict(name="round", peak_tflops=1.0, matmul_efficiency=1.0, attention_efficiency=1.0,
                  unit_overhead_s=0.0, hbm_gbps=1.0, memory_efficiency=1.0, optimizer_overhead_s=0.0, gpus_per_node=2,
                  link_gbps=100e-9, link_efficiency=1.0, nic_gbps=10e-9, nic_efficiency=1.0, collective_latency_s=0.0,
                  ring_step_s=0.0, p2p_latency_s=0.0, barrier_s=0.0, memory_gb=80.0)
    return GpuHardwareConfig(**{**values, **overrides})


def test_hybrid_costs_keep_gathers_in_the_node_and_reduce_across_nodes():
    """World 8 = 4 nodes of 2; a unit of p parameters, bf16 compute, fp32 gathers (ODC).

    Collective, full: ring over 8 ranks through the NICs (10 B/s): AG = 7/8 x 2p / 10; hybrid:
    ring over the node's 2 ranks on the links (100 B/s): AG = 1/2 x 2p / 100, RS = 1/2 x 4p /
    100, then an all-reduce of the 4p/2 gradient bytes with the 3 other replicas, each rank at
    10/2 B/s of its node's NIC: AR = 2 x 3/4 x 2p / 5.
    ODC, hybrid: a gather reads the one other shard of the node, 4p/2 bytes, over its link:
    2p / 100; once per minibatch the whole owned gradient (4 x params / 2) is all-reduced
    across the 4 nodes: 2 x 3/4 x 2 x params / 5. The optimizer steps 1/2 (not 1/8) of the
    parameters.
    """
    layout = Layout(run_config("model=tiny").model)
    prof = GpuProfile(hardware())
    p = layout.unit_params[layout.position_unit]
    bwd = layout.position_phase == 1
    full = prof.engine_costs("collective", layout, 8, "bf16", 4)
    hybrid = prof.engine_costs("collective", layout, 8, "bf16", 4, shard="hybrid")
    assert full.ar is None and full.ag == pytest.approx(7 / 8 * 2 * p / 10)
    assert hybrid.ag == pytest.approx(0.5 * 2 * p / 100)
    assert hybrid.rs == pytest.approx(np.where(bwd, 0.5 * 4 * p / 100, 0.0))
    assert hybrid.ar == pytest.approx(np.where(bwd, 2 * 0.75 * 2 * p / 5, 0.0))
    assert hybrid.optimizer_s == pytest.approx(4 * full.optimizer_s)
    odc_hybrid = prof.engine_costs("odc", layout, 8, "bf16", 4, shard="hybrid")
    net = odc_hybrid.network
    assert net is not None and (net.world, net.nodes) == (2, 1)
    one = np.ones(1)
    assert net.transfer_time(4 * p[0], one, one, one)[0] == pytest.approx(2 * p[0] / 100)
    assert odc_hybrid.sync_s == pytest.approx(2 * 0.75 * 2 * layout.unit_params.sum() / 5)
    # within one node hybrid sharding is full sharding
    alone = prof.engine_costs("odc", layout, 2, "bf16", 4, shard="hybrid")
    assert alone.sync_s == 0.0 and alone.optimizer_s == prof.engine_costs("odc", layout, 2, "bf16", 4).optimizer_s


# -- topology ---------------------------------------------------------------------------------

def test_a_rank_alone_on_its_rail_gets_one_nic_not_the_nodes():
    """2 nodes of 4, a unit of 8 bytes: a rank reads the 4 remote shards (1 byte each). With one
    NIC of 4 B/s for the node, a rank alone takes 4 / 4 = 1 s; with 4 rails of 1 B/s each its
    bytes leave through its own: 4 s. With every rank of the node active both take 4 s."""
    one_nic = Network(world=8, gpus_per_node=4, link_Bps=1e30, nic_Bps=4.0, latency_s=0.0)
    rails = Network(world=8, gpus_per_node=4, link_Bps=1e30, nic_Bps=4.0, latency_s=0.0, rails=4)
    alone, four = np.ones(1), np.full(1, 4.0)
    remote_idle = np.zeros(1)
    assert one_nic.transfer_time(8.0, alone, alone, remote_idle)[0] == pytest.approx(1.0)
    assert rails.transfer_time(8.0, alone, alone, remote_idle, k_rail=alone)[0] == pytest.approx(4.0)
    assert one_nic.transfer_time(8.0, four, four, remote_idle)[0] == pytest.approx(4.0)
    assert rails.transfer_time(8.0, four, four, remote_idle, k_rail=alone)[0] == pytest.approx(4.0)


def brute_force_counts(net: Network, finish: np.ndarray, at: np.ndarray):
    """k_loc, k_tot, k_min_remote, k_rail by definition, rank by rank (what Contention tabulates)."""
    M, R = finish.shape
    g, horizon = net.gpus_per_node, finish[np.isfinite(finish)].max(initial=0.0)
    f = np.where(finish == -np.inf, -1.0, np.where(finish == np.inf, horizon + 1.0, finish))
    q = np.minimum(at, horizon + 0.5)
    node, rail = np.arange(R) // g, np.arange(R) % g % net.rails
    out = np.zeros((4, M, R))
    for m in range(M):
        for r in range(R):
            active = f[m] > q[m, r]
            mine = node == node[r]
            others = [active[node == b].sum() for b in range(net.nodes) if b != node[r]]
            own = not active[r]
            out[:, m, r] = (active[mine].sum() + own, active.sum() + own, min(others),
                            active[mine & (rail == rail[r])].sum() + own)
    return out


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(8, 2, 1), (12, 4, 2), (16, 4, 4), (6, 3, 1)]),
       st.booleans())
def test_contention_counts_match_their_definition(seed, shape, first_pass):
    world, g, rails = shape
    rng = np.random.default_rng(seed)
    M = 3
    finish = rng.choice([1.0, 2.0, 3.0, 5.0], size=(M, world)) + rng.integers(0, 2, (M, world)) * rng.random((M, world))
    finish[rng.random((M, world)) < 0.2] = -np.inf
    if first_pass:
        finish = np.where(finish == -np.inf, -np.inf, np.inf)
    at = rng.choice([0.5, 1.0, 2.0, 2.5, 4.0, 9.0], size=(M, world))
    net = Network(world=world, gpus_per_node=g, link_Bps=1.0, nic_Bps=1.0, latency_s=0.0, rails=rails)
    contention = Contention(net, finish)
    late = contention.late(at)
    found = contention.counts(at, late)
    counted = []
    for early, value in zip(contention.early.args(), found.args(), strict=True):
        if early is None:  # one rail: the node's count
            early, value = contention.early.loc, found.loc
        full = np.broadcast_to(early, at.shape).copy()
        full.ravel()[late] = value
        counted.append(full)
    want = brute_force_counts(net, finish, at)
    for i, name in enumerate(("k_loc", "k_tot", "k_min_remote", "k_rail")):
        assert np.array_equal(counted[i], want[i]), name
    # transfers take the times of those counts, whether counted early or late
    rail = counted[3] if rails > 1 else None
    assert np.array_equal(contention.transfer(1.0, at), net.transfer_time(1.0, *counted[:3], rail))


# -- topology-aware fetch -------------------------------------------------------------------

def test_topology_aware_fetch_copies_the_unit_from_a_rank_of_the_node_that_holds_it():
    """2 nodes of 2 ranks, links 100 B/s, a node's NIC 1 B/s; one unit (positions: its forward
    and backward), gathered before every position, 1 byte. Rank 0 runs four microbatches of
    0.5 + 0.5 s, rank 1 one of 4 + 0.5 s, ranks 2 and 3 (node 1) only own shards.

    From the owners a gather reads 2 remote shards of 1/4 byte through the node's NIC and node
    1's: 1 s while both ranks of node 0 gather (2 x 0.5 B at 1 B/s), 0.5 s once one is left.
    Rank 1: gather [0, 1], forward [1, 5], backward [5, 5.5] (its gather, at 1, hidden). Rank
    0 waits for each gather: microbatches end at 2.5, 4.5, 6.5 and, with rank 1 done from 5.5
    (second pass), its last gathers at 6 -> 6.5 and 6.5 -> 7: 7.5.
    Nearest: rank 1 holds the unit from 1 to 5 (its forward) and 2 to 5.5 (its backward's
    gather to its end), so every gather of rank 0 after the first copies it over the link:
    the remote 1/2 byte plus the local 1/4 at 100 B/s, 7.5 ms, and rank 0's compute never
    waits: its microbatches end at 2, 3, 4 and 5; the minibatch ends with rank 1, at 5.5.
    """
    net = Network(world=4, gpus_per_node=2, link_Bps=100.0, nic_Bps=1.0, latency_s=0.0)
    comp = np.zeros((1, 4, 4, 2))
    comp[0, 0] = 0.5
    comp[0, 1, 0] = [4.0, 0.5]
    nmb = np.array([[4, 1, 0, 0]])
    owner = odc(comp, nmb, no_tokens(comp), costs(2, gather=1.0, network=net))
    assert owner.mb_t1[0, 0] == pytest.approx([2.5, 4.5, 6.5, 7.5]) and owner.duration[0] == pytest.approx(7.5)
    near = odc(comp, nmb, no_tokens(comp), costs(2, gather=1.0, network=net, nearest=True))
    assert near.mb_t1[0, 0] == pytest.approx([2.0, 3.0, 4.0, 5.0])
    assert near.start[0, 0, 1, 0] == pytest.approx(2.0) and near.duration[0] == pytest.approx(5.5)
    # with the unit held by no one (rank 1 on another node) nothing changes
    apart = np.zeros((1, 4, 4, 2))
    apart[0, 0], apart[0, 2, 0] = 0.5, [4.0, 0.5]
    nmb_apart = np.array([[4, 0, 1, 0]])
    owner_apart = odc(apart, nmb_apart, no_tokens(apart), costs(2, gather=1.0, network=net))
    near_apart = odc(apart, nmb_apart, no_tokens(apart), costs(2, gather=1.0, network=net, nearest=True))
    assert near_apart.duration[0] == pytest.approx(owner_apart.duration[0])


# -- minibatches on their own ------------------------------------------------------------------

def test_a_minibatchs_contention_counts_are_those_of_the_minibatch_alone():
    """Row 999's ranks 0 and 1 finish 1e-13 s after its transfers start at 1.0 s: still working
    then, with every rank but the one without work (7 active). Counted among 1,000 minibatches
    they must stay working (a search over the rows' finishes shifted into one sorted array, row
    m by m x 6 s, rounded them onto the queries); every row's counts are its own alone."""
    net = Network(world=8, gpus_per_node=2, link_Bps=1.0, nic_Bps=1.0, latency_s=0.0, rails=2)
    rng = np.random.default_rng(5)
    finish = rng.choice([0.5, 1.0, 2.0, 3.0], size=(1000, 8))
    finish[:, -1] = -np.inf  # a rank without work
    finish[-1] = [1.0 + 1e-13, 1.0 + 1e-13, 2.0, 3.0, 2.0, 3.0, 2.0, -np.inf]
    at = rng.choice([0.5, 1.0, 1.5, 2.5], size=(1000, 8))
    at[-1] = 1.0
    whole = Contention(net, finish)
    late = whole.late(at, since=np.zeros((1000, 1)))
    counted = whole.counts(at, late)
    for m in (0, 1, 500, 999):
        alone = Contention(net, finish[m:m + 1])
        mine = np.flatnonzero(late // 8 == m)
        found = alone.counts(at[m:m + 1], late[mine] - m * 8)
        for a, b in zip(counted.args(), found.args(), strict=True):
            assert np.array_equal(a[mine], b), m
    want = brute_force_counts(net, finish[-1:], at[-1:])
    last = np.flatnonzero(late // 8 == 999)
    assert np.array_equal(counted.tot[last], want[1, 0]) and counted.tot[last][0] == 7


def test_who_holds_a_unit_is_counted_within_the_minibatch_alone():
    """Two nodes of two ranks, one unit (positions 0 and 1), 300 minibatches of two microbatches.
    In minibatch 299 rank 1 holds the unit until 1e-13 s after rank 0 asks at 1.0 s: rank 0 can
    copy it from rank 1. Searched among every minibatch's intervals shifted into one array (row
    m by m x 5 s), that end was rounded onto the query; every answer is the definition's:
    another rank of the node holds the unit from a gather's end to its compute's end."""
    net = Network(world=4, gpus_per_node=2, link_Bps=1.0, nic_Bps=1.0, latency_s=0.0)
    rng = np.random.default_rng(11)
    M = 300
    hold_s = rng.choice([0.0, 0.5, 1.0], size=(M, 4, 2, 2))
    hold_e = hold_s + rng.choice([0.5, 1.0, 1.5], size=(M, 4, 2, 2))
    nmb = rng.integers(0, 3, (M, 4))
    nmb[-1] = 2
    hold_s[-1], hold_e[-1] = 0.0, 0.5
    hold_e[-1, 1, 0, 0] = 1.0 + 1e-13
    holders = Holders(net, hold_s, hold_e, nmb)
    at = rng.choice([0.25, 0.5, 1.0, 1.75], size=(M, 4))
    at[-1] = 1.0
    got = holders.held(0, at)
    mate = np.arange(4) ^ 1  # the other rank of the node
    s, e = hold_s[:, mate], hold_e[:, mate]  # (M, rank, J, position): the unit is at both positions
    working = (np.arange(2)[None, None, :] < nmb[:, mate][:, :, None])[..., None]
    want = ((s <= at[:, :, None, None]) & (at[:, :, None, None] < e) & working).any(axis=(2, 3))
    assert np.array_equal(got, want)
    assert got[-1, 0] and not got[-1, 2]


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 6), st.integers(1, 9))
def test_the_per_minibatch_search_counts_as_searchsorted_does(seed, M, R):
    """Rows as finishes come: ties, a rank without work (-1), rows spread over a few ulps (whose
    bucket scale is huge), queries far before and after them."""
    rng = np.random.default_rng(seed)
    base = rng.choice([0.5, 3.0, 50.0], size=(M, 1))
    ulps = np.spacing(base) * rng.integers(0, 4, (M, R))
    rows = np.where(rng.random((M, R)) < 0.5, base + ulps, base + rng.choice([0.0, 0.25, 7.0], size=(M, R)))
    rows[rng.random((M, R)) < 0.15] = -1.0
    rows.sort(axis=1)
    m = rng.integers(0, M, 64)
    query = np.concatenate([rows[m[:32], rng.integers(0, R, 32)] + rng.choice([-1e-15, 0.0, 1e-15], 32),
                            rng.choice([-5.0, 0.0, 1.0, 51.0, 1e6], 32)])
    want = [np.searchsorted(rows[i], q, side="right") for i, q in zip(m, query, strict=True)]
    assert _SortedRows(rows).count(m, query).tolist() == want


@pytest.mark.parametrize("nearest", [False, True])
def test_an_odc_timeline_split_by_minibatches_is_the_whole_ones_to_the_bit(monkeypatch, nearest):
    """Two nodes of four ranks with contention (and topology-aware fetch), 9 minibatches of
    uneven microbatch counts: simulated in three runs of minibatches, here and in two forked
    processes, every time is the whole run's."""
    import odc_bench.sim as sim

    rng = np.random.default_rng(3)
    net = Network(world=8, gpus_per_node=4, link_Bps=50.0, nic_Bps=2.0, latency_s=1e-3)
    comp = rng.uniform(0.1, 1.0, (9, 8, 3, 4))
    nmb = rng.integers(0, 4, (9, 8))
    c = costs(4, gather=1.0, network=net, nearest=nearest, sync=0.1)
    columns = np.arange(4)
    whole = odc(comp, nmb, no_tokens(comp), c, columns=columns, record=False)
    monkeypatch.setattr(sim, "SIDE_BY_SIDE_FROM", 1)
    monkeypatch.setattr(sim, "usable_cpus", lambda: 3)
    split = sim.odc_side_by_side(comp, nmb, no_tokens(comp), c, 3, columns, record=False)
    for field in ("mb_t0", "mb_t1", "sync_t0", "sync_t1", "opt_t1", "duration"):
        assert np.array_equal(getattr(split, field), getattr(whole, field)), field
    assert whole.duration.min() > 0 and len(set(whole.duration.tolist())) > 1


# -- the whole simulator at scale -------------------------------------------------------------

SMALL = ("backend=sim", "model=qwen2_1p5b", "dataset.length_scale=1", "precision=bf16", "backend.recompute=true",
         "world_size=32", "minibatch_size=2", "num_minibatches=3", "warmup_minibatches=1")


@pytest.mark.parametrize("overrides", [("engine=odc", "balancer=lb_mini"), ("engine=collective", "balancer=lb_micro"),
                                       ("engine=odc", "balancer=lb_mini", "engine.shard=hybrid"),
                                       ("engine=odc", "balancer=lb_mini", "backend.odc_fetch=nearest"),
                                       ("engine=collective", "balancer=lb_micro", "engine.shard=hybrid"),
                                       ("engine=odc", "balancer=lb_carry", "engine.staleness=2")])
def test_rows_without_a_trace_summarise_the_timeline_as_the_trace_would(overrides):
    spec = resolve(run_config(*SMALL, *overrides))
    traced, bare = simulate(spec), simulate(spec, trace=False)
    assert bare.timeline.start is None or "collective" in overrides[0]
    want, got = timing(spec, traced.events), sim_timing(spec, bare)
    assert got == pytest.approx(want, rel=1e-9)


def test_the_trace_holds_one_span_per_traced_position_and_rank_and_minibatch():
    """Event generation is linear in ranks x minibatches: per rank and minibatch, one span per
    traced position of each of its microbatches, one microbatch event each, and sync, optimizer
    and minibatch events; doubling ranks and minibatches of equal-length samples quadruples it."""
    def events(world, minibatches):
        spec = resolve(run_config("backend=sim", "engine=odc", "balancer=lb_mini", "dataset=fixed",
                                  f"world_size={world}", f"num_minibatches={minibatches}", "warmup_minibatches=0"))
        sim = simulate(spec)
        traced = Layout(spec.config.model).traced.sum()
        assert len(sim.events) == int(sim.nmb.sum()) * (traced + 1) + 3 * sim.nmb.size
        return len(sim.events)

    assert events(16, 4) == 4 * events(8, 2)


def test_a_job_after_the_command_lines_precheck_plans_once(tmp_path, monkeypatch):
    from odc_bench import cli

    calls = []
    plan = plan_spec._resolve

    def counting(config, device_type, planner, **kwargs):
        calls.append(config.world_size)
        return plan(config, device_type, planner, **kwargs)

    monkeypatch.setattr(plan_spec, "_resolve", counting)
    argv = ["backend=sim", "engine=odc", "balancer=lb_mini", "num_minibatches=3", f"results_dir={tmp_path / 'r'}",
            f"hydra.run.dir={tmp_path / 'h'}", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    monkeypatch.setattr(sys, "argv", ["odc_bench", *argv])
    cli.main(argv)
    assert calls == [2]
    assert (tmp_path / "r" / "runs.csv").exists()


@pytest.mark.parametrize("balancer", ["lb_mini", "lb_micro", "local_sort"])
def test_plans_made_side_by_side_are_those_made_here(monkeypatch, balancer):
    config = run_config("backend=sim", "model=qwen2_32b", "dataset.length_scale=1", "world_size=64",
                        "minibatch_size=4", "num_minibatches=5", f"balancer={balancer}", "engine=odc")
    here = plan_digest(resolve(config))
    shares = []

    def counting(fn, calls, jobs, meanwhile=None):
        shares.append((len(calls), jobs))
        return first_here(fn, calls, jobs, meanwhile)

    monkeypatch.setattr(plan_plans, "first_here", counting)
    monkeypatch.setattr(plan_plans, "usable_cpus", lambda: 3)
    monkeypatch.setattr(plan_plans, "PARALLEL_FROM", 0)
    assert plan_digest(resolve(config)) == here
    assert shares == [(3, 2)], "five minibatches in three shares: one planned here, two in two workers"


def _refuses_seven(lengths, world_size, max_tokens, cost, options):
    if 7 in lengths:
        raise ValueError("seven")
    return local_sort(lengths, world_size, max_tokens, cost, options)


def test_a_minibatch_planned_side_by_side_that_cannot_be_planned_is_its_error_in_its_place(monkeypatch):
    balancer = BalancerSpec("refuses_seven", "R7", LocalSortOptions, equal_counts=True, plan=_refuses_seven)
    minibatches = [[5, 6, 8, 9], [1, 2, 3, 4], [7, 8, 9, 10], [11, 12, 13, 14], [15, 16, 17, 18]]
    args = (balancer, LocalSortOptions(), minibatches, 2, 64, linear())
    here = Plans().plan_all(*args)
    monkeypatch.setattr(plan_plans, "usable_cpus", lambda: 2)
    monkeypatch.setattr(plan_plans, "PARALLEL_FROM", 0)
    side = Plans().plan_all(*args)
    assert [str(p) if isinstance(p, ValueError) else p for p in side] == \
           [str(p) if isinstance(p, ValueError) else p for p in here]
    assert [isinstance(p, ValueError) for p in side] == [False, False, True, False, False]


def test_a_changed_input_file_plans_again(tmp_path):
    data = tmp_path / "lengths.jsonl"
    data.write_text("\n".join(str(n) for n in [100, 200, 300, 400] * 8) + "\n")
    config = run_config("dataset=jsonl", f"dataset.path={data}", "num_minibatches=3", "backend=sim")
    planner = Planner()
    first = planner.resolve(config)
    assert planner.resolve(config) is first
    assert resolve(config) is not first, "a planner of its own plans again"
    data.write_text("\n".join(str(n) for n in [150, 250, 350, 450] * 8) + "\n")
    assert planner.resolve(config) is not first


PLAN_DIGEST = """
from odc_bench.config.compose import compose_run
from odc_bench.plan.spec import plan_digest, resolve
for balancer in ("lb_micro", "lb_mini"):
    spec = resolve(compose_run(["backend=sim", "model=qwen2_32b", "dataset.length_scale=1", "world_size=256",
                                "minibatch_size=4", "num_minibatches=3", f"balancer={balancer}", "engine=odc"]))
    print(plan_digest(spec))
"""


@pytest.mark.slow
def test_plans_are_identical_across_runs_with_one_seed():
    """256 ranks x 4 samples (the partition's vectorised path), in two fresh interpreters."""
    # Side by side: the host has a core for each interpreter.
    procs = [subprocess.Popen([sys.executable, "-c", PLAN_DIGEST], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={"PYTHONHASHSEED": str(seed), "PATH": ""})
             for seed in (1, 2)]
    try:
        (first, error), (second, _) = (p.communicate(timeout=300) for p in procs)
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], error
    assert first == second and len(set(first.split())) == 2
    config = run_config("backend=sim", "world_size=64", "minibatch_size=4", "num_minibatches=3",
                        "dataset.length_scale=1", "balancer=lb_mini", "engine=odc", "seed=3")
    assert plan_digest(resolve(config)) == plan_digest(resolve(config))


def test_hybrid_sharding_on_nodes_that_do_not_divide_the_local_ranks_is_a_one_line_error(results_dir, monkeypatch,
                                                                                          capsys):
    """Local ranks run hybrid sharding on nodes of engine.ranks_per_node, which must divide them."""
    monkeypatch.chdir(results_dir.parent)
    assert odc_bench("engine.shard=hybrid", "engine.ranks_per_node=3", f"results_dir={results_dir}") == 2
    err = capsys.readouterr().err
    assert err.startswith("odc_bench: error: engine.ranks_per_node=3 must divide world_size=2")
    assert len(err.strip().splitlines()) == 1 and not results_dir.exists()
