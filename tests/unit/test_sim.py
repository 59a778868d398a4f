"""The simulator's timelines on small cases whose answer can be worked out by hand."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odc_bench.app import Job
from odc_bench.config.backend import Recompute
from odc_bench.errors import ConfigError
from odc_bench.models.flops import train_flops
from odc_bench.plan.spec import Planner, resolve
from odc_bench.record.schema import COLUMNS
from odc_bench.sim import claimed, simulate
from odc_bench.sim.hardware import EngineCosts, Network
from odc_bench.sim.layout import Layout
from odc_bench.sim.timeline import collective, odc
from odc_bench.studies.validation import ratios
from tests.helpers import REPO, compose_config, odc_bench, run_config


def costs(P: int, pre=0.0, tail=0.0, prep=0.0, ag=0.0, rs=0.0, gather=None, push=None, sync=0.0, opt=0.0,
          barrier=0.0, network=None) -> EngineCosts:
    def arr(x):
        return np.broadcast_to(np.asarray(x, dtype=float), (P,)).copy()

    return EngineCosts(pre=arr(pre), pre_tok=arr(0.0), tail=tail, tail_tok=0.0, prep=prep, ag=arr(ag), rs=arr(rs),
                       gather_load=arr(0.0 if gather is None else gather),
                       push_load=arr(0.0 if push is None else push), sync_s=sync, optimizer_s=opt,
                       barrier_s=barrier, network=network)


def no_tokens(comp: np.ndarray) -> np.ndarray:
    """Token counts for timelines whose costs do not depend on them."""
    return np.zeros(comp.shape[:3])


def test_collective_minibatch_is_the_sum_of_per_step_maxima():
    comp = np.array([[[[1.0, 2.0, 3.0], [4.0, 1.0, 1.0]],
                      [[2.0, 1.0, 5.0], [1.0, 1.0, 2.0]]]])  # (M=1, R=2, J=2, P=3)
    tl = collective(comp, np.array([[2, 2]]), no_tokens(comp), costs(3, opt=0.5))
    # per-step maxima 2, 2, 5, 4, 1, 2 -> 16, then the optimizer step
    assert tl.duration[0] == pytest.approx(16.5)
    assert tl.start[0, 0, 1, 0] == tl.start[0, 1, 1, 0] == pytest.approx(9.0)


def test_odc_minibatch_is_the_slowest_ranks_own_sum_plus_the_barriers():
    comp = np.zeros((1, 2, 3, 2))
    comp[0, 0, :3] = [[1.0, 2.0], [3.0, 1.0], [2.0, 2.0]]  # rank 0: three microbatches, 11 s
    comp[0, 1, 0] = [5.0, 4.0]  # rank 1: one microbatch, 9 s
    tl = odc(comp, np.array([[3, 1]]), no_tokens(comp), costs(2, barrier=0.5, opt=0.25))
    # parameters visible (barrier), rank 0's 11 s, accumulation barrier, optimizer
    assert tl.duration[0] == pytest.approx(0.5 + 11 + 0.5 + 0.25)
    assert tl.sync_t0[0, 1] == pytest.approx(0.5 + 9)  # rank 1 waits from its own end
    assert tl.mb_t1[0, 1, 0] == pytest.approx(9.5)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_without_communication_odc_is_never_slower_than_collective(ranks, micro, seed):
    comp = np.random.default_rng(seed).exponential(size=(2, ranks, micro, 4))
    nmb = np.full((2, ranks), micro)
    c, tok = costs(4), no_tokens(comp)
    assert (odc(comp, nmb, tok, c).duration <= collective(comp, nmb, tok, c).duration + 1e-9).all()


def test_collective_prefetch_hides_all_gathers_behind_longer_compute():
    comp = np.full((1, 2, 2, 3), 1.0)
    nmb = np.array([[2, 2]])
    # only the first all-gather is exposed when each is shorter than a position's compute
    assert collective(comp, nmb, no_tokens(comp), costs(3, ag=0.4)).duration[0] == pytest.approx(0.4 + 6)
    # longer all-gathers run back to back and compute waits for each
    assert collective(comp, nmb, no_tokens(comp), costs(3, ag=1.5)).duration[0] == pytest.approx(6 * 1.5 + 1.0)


def test_serial_gaps_add_per_position_and_microbatch():
    comp = np.full((1, 2, 2, 3), 1.0)
    tl = collective(comp, np.array([[2, 2]]), no_tokens(comp), costs(3, pre=[0.1, 0.2, 0.0], tail=0.5, prep=0.05))
    assert tl.duration[0] == pytest.approx(2 * (0.05 + 0.1 + 0.2 + 0.5 + 3))


def test_reduce_scatters_queue_behind_prefetched_all_gathers_and_end_the_microbatch():
    comp = np.full((1, 1, 1, 2), 1.0)
    # AG(0) [0, .2]; pos 0 [.2, 1.2] while AG(1) [.2, .4]; RS(0) [1.2, 1.5];
    # pos 1 [1.2, 2.2]; RS(1) [2.2, 2.5]: the microbatch ends with its last reduce-scatter
    tl = collective(comp, np.array([[1]]), no_tokens(comp), costs(2, ag=0.2, rs=0.3))
    assert tl.mb_t1[0, 0, 0] == pytest.approx(2.5)


def _gather_only(world: int, per_node: int, nic: float) -> tuple[EngineCosts, float]:
    net = Network(world=world, gpus_per_node=per_node, link_Bps=1e30, nic_Bps=nic, latency_s=0.0)
    nbytes = 4.0
    return costs(3, gather=nbytes, network=net), (world - per_node) * nbytes / world / nic


def test_two_ranks_reading_the_same_owners_at_once_take_twice_as_long():
    # two nodes of two; the owners of the gathered shards sit in node 1, both readers in node 0
    c, alone = _gather_only(world=4, per_node=2, nic=1.0)
    comp = np.zeros((1, 4, 1, 3))
    one = odc(comp, np.array([[1, 0, 0, 0]]), no_tokens(comp), c).duration[0]
    both = odc(comp, np.array([[1, 1, 0, 0]]), no_tokens(comp), c).duration[0]
    assert one == pytest.approx(3 * alone)
    assert both == pytest.approx(2 * one)


def test_a_rank_that_finishes_early_frees_the_bandwidth_it_shared():
    c, alone = _gather_only(world=4, per_node=2, nic=1.0)
    comp = np.zeros((1, 4, 2, 3))
    tl = odc(comp, np.array([[2, 1, 0, 0]]), no_tokens(comp), c, passes=3)
    # both gather one microbatch's three units at half speed, then rank 0 gathers alone
    assert tl.mb_t1[0, 1, 0] == pytest.approx(3 * 2 * alone)
    assert tl.mb_t1[0, 0, 1] == pytest.approx(3 * 2 * alone + 3 * alone)


def test_within_one_node_owners_never_limit_a_symmetric_gather():
    net = Network(world=4, gpus_per_node=4, link_Bps=1.0, nic_Bps=1.0, latency_s=0.0)
    k = np.array([1, 2, 3, 4])
    # each rank reads 3 shards through its own link; no owner serves more than 3 readers
    assert net.transfer_time(4.0, k, k, k) == pytest.approx(np.full(4, 3.0))


def test_the_dynamic_balancer_claims_in_queue_order_when_free():
    layout = Layout(compose_model())
    table = np.zeros((6, 3))
    table[:, 1] = 1.0 / layout.positions  # one second per token per microbatch
    c = costs(layout.positions)
    lengths = [5, 3, 1, 1, 1]
    ranks = claimed(lengths, [[0], [1], [2], [3], [4]], 2, table, c, layout)
    # rank 0 takes 5 (busy until ~5); rank 1 takes 3, then 1 (free at 4), then 1 more (free at 5)
    assert [[sum(lengths[i] for i in micro) for micro in r] for r in ranks] == [[5, 1], [3, 1, 1]]


def compose_model():
    return run_config().model


def test_sim_job_writes_the_same_row_and_trace_schema(results_dir, monkeypatch, capsys):
    monkeypatch.chdir(results_dir.parent)
    done = odc_bench("backend=sim", "engine=odc", f"results_dir={results_dir}", "num_minibatches=3",
                     "warmup_minibatches=1")
    assert done == 0, capsys.readouterr().err
    table = pd.read_csv(results_dir / "runs.csv")
    assert list(table.columns) == COLUMNS
    row = table.iloc[0]
    assert row["backend"] == "sim" and row["engine"] == "odc" and row["samples_per_s"] > 0
    assert 0 <= row["bubble_rate"] < 1
    trace = pd.read_csv(results_dir / row["trace"])
    assert set(trace["kind"]) == {"fwd", "bwd", "microbatch", "sync", "optimizer", "minibatch"}
    # MFU: the measured samples' model FLOPs over the window's seconds, ranks and the A100's peak
    spec = resolve(run_config("backend=sim", "engine=odc", "num_minibatches=3", "warmup_minibatches=1"))
    flops = train_flops(spec.config.model, [n for mb in spec.minibatches[1:] for n in mb.lengths])
    assert row["mfu"] == pytest.approx(flops / (row["wall_s"] * row["world_size"] * 312e12), rel=1e-6)


@pytest.mark.parametrize(("overrides", "message"), [
    (("backend/hardware=cpu", "backend.hardware.calibration=/nonexistent/tiny.json"), "no calibration"),
    (("backend.hardware.kind=tpu",), "backend.hardware.kind must be gpu or calibrated, got 'tpu'"),
    (("world_size=12",), "whole nodes"),
])
def test_unusable_hardware_is_a_one_line_error(results_dir, capsys, overrides, message):
    with pytest.raises(SystemExit) as exit_info:
        Job(Planner())(compose_config("backend=sim", f"results_dir={results_dir}", *overrides))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("odc_bench: error:") and message in err and len(err.strip().splitlines()) == 1
    assert not (results_dir / "runs.csv").exists()


def test_a_cpu_profile_refuses_runs_whose_ranks_compute_otherwise_than_its_calibrations(tmp_path):
    """A rank of more threads computes faster, and a compiled one than an eager one, so the
    calibration's timings are its runs' alone: a threads_per_rank set otherwise is refused, and
    so is null where the file was calibrated on this machine and null gives another share of its
    CPUs; so are compile=true on eager timings and device=cuda on a CPU's."""
    from odc_bench.forked import cpu_share
    from odc_bench.provenance import host_fingerprint

    data = json.loads((REPO / "results" / "calibration" / "sim-tiny-cpu.json").read_text())
    null_share = cpu_share(2)
    file = tmp_path / "sim-tiny-cpu.json"

    def simulated(threads: int, fingerprint: dict, *overrides: str) -> None:
        file.write_text(json.dumps(data | {"threads_per_rank": None, "threads": threads, "fingerprint": fingerprint}))
        simulate(resolve(run_config("backend=sim", "backend/hardware=cpu", f"backend.hardware.calibration={file}",
                                    "num_minibatches=2", "warmup_minibatches=0", *overrides)), trace=False)

    here, elsewhere = host_fingerprint(), {"cpu_model": "another", "logical_cores": 1024}
    simulated(null_share, here)
    simulated(null_share + 1, here, f"threads_per_rank={null_share + 1}")
    simulated(null_share + 1, elsewhere)  # another machine's file: the what-if says so, every timing being its
    with pytest.raises(ConfigError, match="calibrated on eager runs, whose timings are not compile=true's on this CPU; "
                                          "set compile=false"):
        simulated(null_share, here, "compile=true")
    with pytest.raises(ConfigError, match="times this machine's CPU ranks, not device=cuda's; set device=cpu or auto"):
        simulated(null_share, here, "device=cuda")
    with pytest.raises(ConfigError, match=rf"calibrated on runs of {null_share + 1} threads per rank, whose timings "
                                          rf"are not threads_per_rank=null \({null_share} threads per rank on this"):
        simulated(null_share + 1, here)
    for fingerprint in (here, elsewhere):
        with pytest.raises(ConfigError, match=rf"are not threads_per_rank={null_share + 1}'s; set "
                                              rf"threads_per_rank={null_share}"):
            simulated(null_share, fingerprint, f"threads_per_rank={null_share + 1}")


def test_a_relative_calibration_path_is_the_working_folders_where_a_file_is_there(tmp_path, monkeypatch):
    """`calibrate.cpu_profile --out FILE` writes FILE in the working folder, and
    backend.hardware.calibration=FILE read it from the repository root ("no calibration"); a
    brace in the path was read as a format field. The stock profile's path still names the
    repository's file from any folder."""
    shutil.copy(REPO / "results" / "calibration" / "sim-tiny-cpu.json", tmp_path / "cal{1}.json")
    monkeypatch.chdir(tmp_path)
    small = ("backend=sim", "backend/hardware=cpu", "num_minibatches=2", "warmup_minibatches=0")
    mine = simulate(resolve(run_config(*small, "backend.hardware.calibration='cal{1}.json'")), trace=False)
    stock = simulate(resolve(run_config(*small)), trace=False)
    assert mine.timeline.duration.sum() > 0
    assert np.array_equal(mine.timeline.duration, stock.timeline.duration)


def test_a_paper_scale_run_simulates_every_rank():
    """A quarter of the benchmark (`python -m odc_bench.tools.sim_bench` times the full one)."""
    spec = resolve(run_config("backend=sim", "engine=odc", "model=qwen2_7b", "world_size=16",
                                  "minibatch_size=4", "num_minibatches=25", "warmup_minibatches=0",
                                  "dataset.length_scale=1", "precision=bf16"))
    sim = simulate(spec)
    assert sim.events["rank"].nunique() == 16


def test_serial_gaps_grow_with_tokens_of_the_largest_microbatch_collective_or_own_odc():
    comp = np.zeros((1, 2, 1, 2))
    tokens = np.array([[[100.0], [300.0]]])
    c = costs(2)
    c = EngineCosts(**{**c.__dict__, "pre_tok": np.array([0.01, 0.0]), "tail_tok": 0.001})
    # collective: every rank waits for the gap of the largest microbatch (300 tokens)
    assert collective(comp, np.array([[1, 1]]), tokens, c).duration[0] == pytest.approx(3.0 + 0.3)
    # ODC: each rank pays its own; the minibatch ends with the slower one
    tl = odc(comp, np.array([[1, 1]]), tokens, c)
    assert tl.mb_t1[0, :, 0] == pytest.approx([1.0 + 0.1, 3.0 + 0.3])


def test_a_whole_microbatch_fit_splits_into_units_that_add_back_up():
    from odc_bench.sim.hardware import split_microbatch_fit

    layout = Layout(compose_model())
    fit = {"a": 0.3, "b": 0.05, "c": 0.01, "unit": 1000}
    table = split_microbatch_fit(fit, layout, recompute=NONE)
    docs = [300, 700]
    per_kind = table @ np.array([1.0, sum(docs), sum(d * d for d in docs)])
    total = per_kind[layout.position_cost_index].sum()
    x = np.array(docs) / 1000
    assert total == pytest.approx(0.3 * (x**2).sum() + 0.05 * x.sum() + 0.01)
    # recompute adds one forward to every layer's backward
    again = split_microbatch_fit(fit, layout, recompute=FULL) @ np.array([1.0, sum(docs), sum(d * d for d in docs)])
    assert again[3] - per_kind[3] == pytest.approx(per_kind[2] - fit["c"] / (layout.positions - 1))


NONE, FULL = Recompute(0.0, 0.0, 0.0), Recompute(1.0, 1.0, 1.0)


@pytest.mark.parametrize("mode, matmul, attention, layers", [
    ("full", 1.0, 1.0, 1.0), ("op", 0.5, 0.0, 0.0), ("blocks", 0.25, 0.25, 0.25)])
def test_each_checkpointing_mode_recomputes_its_share_of_a_layers_forward(mode, matmul, attention, layers):
    from odc_bench.sim.hardware import load_profile

    config = run_config("backend=sim", "model=llama3_8b", "backend.recompute=true", f"backend.recompute_mode={mode}",
                            "backend.recompute_blocks=0.25")
    assert config.backend.recomputed == Recompute(matmul, attention, layers)
    profile = load_profile(config.backend.hardware, config.model.name)
    layout = Layout(config.model)
    fwd, bwd = profile.compute_table(layout, config.backend.recomputed)[2:4]  # the layer's rows
    plain = profile.compute_table(layout, NONE)[3]
    # The tokens term is the matrix multiplies' plus attention's per-token part (its efficiency
    # rising with length: half x the squared term), the squared-lengths term attention's.
    attention_tok = fwd[2] * config.backend.hardware.attention_half_length
    assert bwd[1:] - plain[1:] == pytest.approx([matmul * (fwd[1] - attention_tok) + attention * attention_tok,
                                                 attention * fwd[2]])
    # memory: the checkpointed share of layers keeps only its input
    none = resolve(run_config("backend=sim", "model=llama3_8b")).memory.activations
    full = resolve(run_config("backend=sim", "model=llama3_8b", "backend.recompute=true")).memory.activations
    here = resolve(config).memory.activations
    assert here == {1.0: full, 0.0: none}[layers] if layers in (0.0, 1.0) else full < here < none


@pytest.mark.parametrize("mode, share", [("full", 1.0), ("blocks", 0.25)])
def test_the_calibrated_cpu_profile_adds_a_layers_fitted_forward_to_its_backward(mode, share):
    """A real CPU rank runs a checkpointed layer's whole forward again in its backward: the
    calibrated profile charges the checkpointed share of the fitted forward, every term of it."""
    from odc_bench.sim.hardware import load_profile

    config = run_config("backend=sim", "backend/hardware=cpu", "backend.recompute=true",
                        f"backend.recompute_mode={mode}", "backend.recompute_blocks=0.25")
    profile = load_profile(config.backend.hardware, config.model.name)
    layout = Layout(config.model)
    plain = profile.compute_table(layout, NONE)
    table = profile.compute_table(layout, config.backend.recomputed)
    assert table[3] == pytest.approx(plain[3] + share * plain[2])  # the layer's backward (row 3) and forward
    assert np.delete(table, 3, axis=0) == pytest.approx(np.delete(plain, 3, axis=0))
    with pytest.raises(ConfigError, match=r"^the calibrated CPU profile models backend.recompute_mode=full and "
                                          r"blocks, not op: on CPU op-level checkpointing recomputes attention too"):
        profile.compute_table(layout, Recompute(0.5, 0.0, 0.0))


def test_the_reference_transports_slowdown_divides_only_odcs_bandwidth_across_nodes():
    from odc_bench.sim.hardware import load_profile

    config = run_config("backend=sim", "model=qwen2_1p5b", "world_size=16")
    profile = load_profile(config.backend.hardware, config.model.name)
    layout = Layout(config.model)

    def costs(engine, slowdown):
        return profile.engine_costs(engine, layout, 16, "bf16", 4, internode_slowdown=slowdown)

    fast, slow = costs("odc", 1.0), costs("odc", 3.5)
    assert slow.network.nic_Bps == pytest.approx(fast.network.nic_Bps / 3.5)
    assert slow.network.link_Bps == fast.network.link_Bps, "within a node the transport is as fast"
    assert np.array_equal(costs("collective", 1.0).ag, costs("collective", 3.5).ag), "NCCL's collectives are not"
    with pytest.raises(ConfigError, match="odc_internode_slowdown must be at least 1"):
        run_config("backend=sim", "backend.odc_internode_slowdown=0.5")


def test_compute_features_add_a_squared_excess_per_knot_and_document():
    from odc_bench.sim.layout import doc_features

    f = doc_features([100, 700, 1000], knots=(500.0, 900.0))
    assert list(f) == [1.0, 1800.0, 100**2 + 700**2 + 1000**2, 200**2 + 500**2, 100**2]
    assert list(doc_features([100, 700])) == [1.0, 800.0, 100**2 + 700**2]


def test_the_cpu_fit_follows_a_cost_per_squared_token_that_rises_past_a_length():
    """The shape this CPU shows (attention's matrix outgrowing the caches): a plain quadratic
    fitted to it misses the short documents; the fit with knots recovers the cost."""
    from odc_bench.calibrate.cpu_profile import fit_compute
    from odc_bench.sim.layout import doc_features

    rng = np.random.default_rng(0)
    lens = rng.integers(50, 2000, size=400)

    def cost(n):
        return 1e-3 + 2e-8 * n * n + 6e-8 * max(n - 600, 0) ** 2

    def frame(knots):
        f = np.array([doc_features([n], knots) for n in lens])
        units = pd.DataFrame({f"f{i}": f[:, i] for i in range(f.shape[1])})
        return units.assign(cost=2, run="r", rank=0, minibatch=np.arange(len(lens)), microbatch=0,
                            dur=[cost(n) for n in lens])

    def error_on_short(knots):
        coef = np.array(fit_compute(frame(knots))["layer"]["fwd"])
        short = [n for n in lens if n < 400]
        predicted = np.array([coef @ doc_features([n], knots) for n in short])
        return np.abs(predicted / [cost(n) for n in short] - 1).max()

    assert error_on_short(()) > 0.2
    assert error_on_short((300.0, 600.0, 1200.0)) < 0.01


def test_validation_ratio_is_the_median_over_side_by_side_pairs():
    # Pairs (odc/collective): 3/1, 4/4, 5/2 -> 3.0, 1.0, 2.5: median 2.5, while the ratio of
    # the engines' medians (4/2) pairs runs made at different times.
    table = pd.DataFrame([
        dict(config="c", engine="collective", measured_samples_per_s=2.0, predicted_samples_per_s=2.0,
             runs_samples_per_s="1 4 2"),
        dict(config="c", engine="odc", measured_samples_per_s=4.0, predicted_samples_per_s=5.0,
             runs_samples_per_s="3 4 5"),
    ])
    r = ratios(table).iloc[0]
    assert r["measured_ratio"] == 2.5 and (r["pair_min"], r["pair_max"]) == (1.0, 3.0)
    assert r["ratio_of_medians"] == 2.0 and r["predicted_ratio"] == 2.5 and r["error"] == 0.0



def test_the_cpu_profile_times_cpu_ranks_where_device_auto_would_choose_a_gpu(monkeypatch, tmp_path):
    """On a machine with a GPU, device=auto made the CPU profile's runs CUDA runs, whose host
    timings it fitted as this machine's CPU ranks."""
    from odc_bench.calibrate import cpu_profile

    class Stop(Exception):
        pass

    devices = []

    def execute(spec, results_dir):
        devices.append(spec.device_type)
        raise Stop

    monkeypatch.setattr("odc_bench.plan.device.cuda_available", lambda: True)
    monkeypatch.setattr(cpu_profile, "execute", execute)
    with pytest.raises(Stop):
        cpu_profile.main(["--results-dir", f"{tmp_path}/r", "--out", f"{tmp_path}/c.json", "device=auto"])
    assert devices == ["cpu"]


def test_an_engine_named_twice_is_calibrated_and_validated_once(monkeypatch, tmp_path):
    """`--engines odc odc` ran every calibration run twice, and the validation wrote each of its
    rows twice."""
    from odc_bench.calibrate import cpu_profile
    from odc_bench.studies import validation

    ran = []
    for module in (cpu_profile, validation):
        monkeypatch.setattr(module, "run_real", lambda overrides, _: ran.append(overrides[-1]) or (None, None))
        monkeypatch.setattr(module, "fit", lambda runs: {"model": "tiny"})
    monkeypatch.setattr(validation, "timing", lambda spec, events: {"samples_per_s": 1.0})

    cpu_profile.main(["--results-dir", f"{tmp_path}/r", "--out", f"{tmp_path}/c.json", "--engines", "odc", "odc"])
    assert ran == ["engine=odc"] * len(cpu_profile.DEFAULT_RUNS)

    compared = []

    def compare(label, overrides, engines, *_):
        compared.append(engines)
        raise InterruptedError  # the real runs are not this test's

    monkeypatch.setattr(validation, "compare", compare)
    ran.clear()
    with pytest.raises(InterruptedError):
        validation.main(["--only", "longalign mb1", "--engines", "odc", "collective", "odc", "--out", f"{tmp_path}/o",
                         "--results-dir", f"{tmp_path}/v", "--docs", f"{tmp_path}/v.md"])
    assert compared == [["odc", "collective"]] and ran == ["engine=odc", "engine=collective"] * 2

def test_a_simulated_run_and_the_what_if_import_neither_torch_nor_scipy(tmp_path):
    """Importing torch (and scipy) cost a simulated run over a second and a half of its start-up
    (docs/simulator.md, Speed): a simulated run of the command line never loads them."""
    code = (
        "import sys\n"
        "from odc_bench.cli import main\n"
        "import odc_bench.whatif.cli, odc_bench.whatif.figure  # the command and its figure helper\n"
        f"main(['backend=sim', 'world_size=2', 'num_minibatches=1', 'warmup_minibatches=0', "
        f"'results_dir={tmp_path / 'r'}', 'hydra.run.dir={tmp_path / 'h'}'])\n"
        "loaded = sorted({'torch', 'scipy'} & {name.split('.')[0] for name in sys.modules})\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "r" / "runs.csv").exists()


def test_a_profile_whose_minibatches_take_no_time_is_one_line_and_writes_no_row(tmp_path, monkeypatch, capsys):
    """Rates too high to count and every latency 0 s made the window 0 s: a ZeroDivisionError's
    traceback from the row's throughput."""
    monkeypatch.chdir(tmp_path)
    zero = [f"backend.hardware.{key}=0" for key in ("unit_overhead_s", "optimizer_overhead_s", "collective_latency_s",
                                                     "ring_step_s", "p2p_latency_s", "barrier_s")]
    rates = [f"backend.hardware.{key}=1e300" for key in ("peak_tflops", "hbm_gbps", "link_gbps", "nic_gbps")]
    assert odc_bench("backend=sim", *rates, *zero,
                     "num_minibatches=2", "warmup_minibatches=0", f"results_dir={tmp_path / 'r'}") == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "odc_bench: error: the simulated minibatches take no time (backend.hardware's rates too high to count and "
        "every latency 0 s); give it a real device's figures")
    assert not (tmp_path / "r" / "runs.csv").exists()
