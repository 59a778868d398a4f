"""The GPU profiles against published measurements (odc_bench.studies.published) and the band the
what-if reads from that validation (odc_bench.whatif.accuracy)."""

import csv
import os
import shutil

import pandas as pd
import pytest

from odc_bench.models.memory import unit_params
from odc_bench.plan.spec import resolve
from odc_bench.studies import published
from odc_bench.whatif.accuracy import VALIDATION, validated
from odc_bench.whatif.answer import compose_config

POINTS = pd.read_csv(published.POINTS)


def _point(point_id: int) -> pd.Series:
    return POINTS[POINTS["point_id"] == point_id].iloc[0]


# MPT-70B on 512 H100s (no network stated); MPT-7B at 64K (1600 Gbps per node); Llama 3.1 8B, op-level
# SAC (400 Gb/s per GPU); fms-fsdp's HSDP run ("400Gbps": the node's); KempnerForge's 32 H200s in nodes of 4
NETWORK = {1: (400.0, 8), 48: (200.0, 1), 78: (400.0, 8), 86: (50.0, 1), 98: (50.0, 1)}


@pytest.mark.parametrize("point_id", sorted(NETWORK))
def test_a_point_runs_as_published(point_id):
    point = _point(point_id)
    assert published.left_out(point) is None
    spec = resolve(compose_config(published.overrides(point)))
    model = spec.config.model
    assert model.family == ("mpt" if point["mlp"] == "gelu" else "llama")
    # llm-foundry prints a parameter count that grows with the sequence length (by about seq_len x
    # d_model); at 2K tokens that part is within the tolerance
    if pd.notna(point["params_reported"]) and point["seq_len"] <= 2048:
        assert sum(unit_params(model)) == pytest.approx(point["params_reported"], rel=0.005)
    assert spec.world_size == point["gpus"]
    assert spec.config.backend.hardware.gpus_per_node == point["gpus_per_node"]
    minibatch = spec.minibatches[0]
    assert set(minibatch.lengths) == {point["seq_len"]}
    # every microbatch holds the published samples per GPU per microbatch
    assert {len(micro) for rank in minibatch.plan for micro in rank} == {point["microbatch_per_gpu"]}
    mode = point["activation_checkpointing"]
    assert spec.config.backend.recompute == (mode != "none")
    assert spec.config.backend.recompute_mode == ("op" if mode == "selective (op)" else "full")
    hardware = spec.config.backend.hardware
    assert (hardware.nic_gbps, hardware.nic_rails) == NETWORK[point_id]
    assert hardware.memory_gb == point["gpu_memory_gb"]
    # torchtitan's HBM2e H100s at the bandwidth their source states; the others at their profile's
    assert hardware.hbm_gbps == {78: 2400, 98: 4800}.get(point_id, 3350 if "H100" in point["gpu"] else 2039)
    assert spec.config.engine.options.shard == ("hybrid" if point["sharding"] == "HSDP" else "full")


@pytest.mark.parametrize("point_id, reason", [(80, "float8"), (84, "float8"), (88, "share of blocks")])
def test_points_the_simulator_cannot_run_as_published_are_left_out_with_why(point_id, reason):
    assert reason in published.left_out(_point(point_id))


def test_a_ratio_error_is_the_simulated_ratio_over_the_measured_one():
    table = pd.DataFrame({"profile": "a100", "source_id": "s", "params": 7e9, "point_id": [1, 2],
                          "measured": [100.0, 50.0], "stock": [110.0, 50.0], "fitted": [100.0, 50.0],
                          "held_out": [120.0, 40.0]})
    pairs = published.ratio_pairs(table)
    assert len(pairs) == 1
    assert pairs["held_out_error"][0] == pytest.approx(3.0 / 2.0 - 1)
    assert pairs["stock_error"][0] == pytest.approx(2.2 / 2.0 - 1)


def test_the_committed_page_is_what_the_committed_files_give():
    read = {name: pd.read_csv(VALIDATION / f"gpu-{name}.csv") for name in
            ("points", "ratios", "left-out", "profiles", "paper-cells")}
    page = published.doc(POINTS, read["points"], read["ratios"], read["left-out"], read["profiles"],
                         read["paper-cells"], published.moves())
    assert page == published.DOC.read_text(), "run python -m odc_bench.studies.published"


def test_the_whatif_gpu_band_is_read_from_the_validation_files(tmp_path):
    for path in VALIDATION.glob("gpu-*.csv"):
        shutil.copy(path, tmp_path / path.name)
    points = pd.read_csv(tmp_path / "gpu-points.csv")
    a100 = points[points["profile"] == "a100"]
    # the stock profile never saw the points: its own errors; the fitted one: the held-out errors
    for hardware, column in (("a100", "stock_error"), ("a100_fit", "held_out_error")):
        band = validated(tmp_path, hardware)
        assert band.gpu is not None and band.ratio is not None
        assert band.throughput == pytest.approx(tuple(a100[column].quantile([0.1, 0.9])))
        assert "published GPU measurements" in band.describe(hardware)

    before = validated(tmp_path, "a100_fit").ratio
    pairs = pd.read_csv(tmp_path / "gpu-ratios.csv")
    pairs.loc[pairs["profile"] == "a100", "held_out_error"] *= 3
    pairs.to_csv(tmp_path / "gpu-ratios.csv", index=False)
    assert validated(tmp_path, "a100_fit").ratio == pytest.approx(tuple(3 * v for v in before)), \
        "the band follows the files"
    assert validated(tmp_path, "cpu").gpu is None, "the CPU profile keeps the CPU host's validation"


def test_a_validation_table_rewritten_within_the_clocks_tick_is_read_again(tmp_path):
    """A file rewritten with the same size and time (a rewrite within the file clock's tick) is
    read anew: the fitted profile's column swapped with the stock one's, text for text, so every
    line keeps its length."""
    for path in VALIDATION.glob("gpu-*.csv"):
        shutil.copy(path, tmp_path / path.name)
    ratios = tmp_path / "gpu-ratios.csv"
    stock = validated(tmp_path, "a100").ratio
    assert validated(tmp_path, "a100_fit").ratio != stock
    stamp = ratios.stat()
    with ratios.open(newline="") as f:
        rows = list(csv.reader(f))
    a, b = rows[0].index("held_out_error"), rows[0].index("stock_error")
    for row in rows[1:]:
        row[a], row[b] = row[b], row[a]
    with ratios.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    os.utime(ratios, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert (ratios.stat().st_size, ratios.stat().st_mtime_ns) == (stamp.st_size, stamp.st_mtime_ns)
    assert validated(tmp_path, "a100_fit").ratio == stock


def test_a_configuration_outside_the_validated_range_is_named():
    gpu = validated(VALIDATION, "a100").gpu
    assert gpu is not None and gpu.network_gbps is not None
    per_node, network = gpu.gpus_per_node[0], gpu.network_gbps[0]
    inside = gpu.outside(gpu.params[0], gpu.gpus[0], gpu.seq_len[0], per_node, network)
    assert inside == []
    beyond = gpu.outside(gpu.params[1] * 2, gpu.gpus[1] * 2, gpu.seq_len[1] * 2, per_node + 1, network / 2)
    assert len(beyond) == 5 and "parameter model" in beyond[0] and "GPUs" in beyond[1] and "tokens" in beyond[2]
    assert f"{per_node + 1} GPUs per node" in beyond[3] and f"{network / 2:g} Gbps per node" in beyond[4]
    assert gpu.outside(gpu.params[0], per_node, gpu.seq_len[0], per_node, network / 2) == [], \
        "one node: its network carries nothing"


def test_the_validated_networks_are_those_the_sources_state(tmp_path):
    for path in VALIDATION.glob("gpu-*.csv"):
        shutil.copy(path, tmp_path / path.name)
    points = pd.read_csv(tmp_path / "gpu-points.csv")
    stated = {int(p["point_id"]) for _, p in POINTS.iterrows() if published.network(p)}
    assert points["network_gbps"].notna().tolist() == points["point_id"].isin(stated).tolist()
    h100 = points[points["profile"] == "h100"]
    gpu = validated(tmp_path, "h100").gpu
    assert gpu is not None
    assert gpu.network_gbps == (h100["network_gbps"].min(), h100["network_gbps"].max())
    points.loc[points["profile"] == "h100", "network_gbps"] = float("nan")
    points.to_csv(tmp_path / "gpu-points.csv", index=False)
    unstated = validated(tmp_path, "h100").gpu
    assert unstated is not None and unstated.network_gbps is None
    assert "no validated source states its network" in unstated.outside(
        unstated.params[0], 16, unstated.seq_len[0], 8, 3200.0)[0]
