"""The per-rank memory estimate (models/memory.py): hybrid sharding, and the committed CPU runs."""

from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from odc_bench.config.fields import build
from odc_bench.config.model import FAMILIES, ModelConfig
from odc_bench.models.decoder import DecoderModel
from odc_bench.models.memory import OWNED_BYTES, estimate, unit_params
from odc_bench.plan.spec import resolve
from odc_bench.record.row import MB
from odc_core.engine.registry import ENGINES
from tests.helpers import REPO, run_config


def test_hybrid_sharding_owns_a_nodes_share_and_nothing_else_changes():
    """32 ranks in nodes of 8: a rank owns 1/8 of every unit (as on 8 ranks), not 1/32; the
    working units and the activations are per unit and per token, the same either way."""
    cfg = run_config("model=qwen2_7b").model
    full = estimate(cfg, 32, "bf16", 65536, recompute=True)
    hybrid = estimate(cfg, 32, "bf16", 65536, recompute=True, shard_over=8)
    assert hybrid.owned == estimate(cfg, 8, "bf16", 65536, recompute=True).owned
    assert hybrid.owned == sum(-(-p // 8) for p in unit_params(cfg)) * (OWNED_BYTES + 2)
    assert hybrid.owned == pytest.approx(4 * full.owned, rel=1e-6)
    assert (hybrid.working, hybrid.activations) == (full.working, full.activations)


@pytest.mark.parametrize("engine", ["odc", "collective"])
def test_a_local_hybrid_run_is_estimated_per_emulated_node(engine):
    """4 local ranks in nodes of 2 (engine.ranks_per_node): a rank owns half of every unit, as
    on 2 ranks; without ranks_per_node the 4 ranks are one node and hybrid is full sharding."""
    common = (f"engine={engine}", "world_size=4", "num_minibatches=1", "warmup_minibatches=0",
              "dataset.length_scale=0.005")
    full = resolve(run_config(*common)).memory
    hybrid = resolve(run_config(*common, "engine.shard=hybrid", "engine.ranks_per_node=2")).memory
    one_node = resolve(run_config(*common, "engine.shard=hybrid")).memory
    two_ranks = resolve(run_config(*common[:1], "world_size=2", *common[2:])).memory
    assert hybrid.owned == two_ranks.owned > full.owned == one_node.owned
    assert hybrid.working == full.working


def test_a_simulated_hybrid_run_is_estimated_per_node_and_flagged_when_it_does_not_fit():
    """14B at 64K tokens on A100s (80 GB): sharded over 16 ranks a rank owns 1/16 of 14.8B
    parameters x 18 bytes (17 GB; 69 GB in all with 48 GB of activations) and fits; sharded
    within nodes of 8 it owns 1/8 (33 GB; 86 GB in all) and does not."""
    base = ("backend=sim", "model=qwen2_14b", "world_size=16", "dataset.length_scale=1", "precision=bf16",
            "backend.recompute=true", "num_minibatches=3")
    full = resolve(run_config(*base))
    hybrid = resolve(run_config(*base, "engine.shard=hybrid"))
    assert hybrid.memory.owned == pytest.approx(2 * full.memory.owned, rel=1e-6)
    assert full.memory.total < full.memory_limit < hybrid.memory.total


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_only_odc_keeps_a_bf16_copy_of_its_shards(precision):
    """ODC's peers gather from a bf16 copy of each owned shard; FSDP2 casts its fp32 shard at
    each all-gather. With bf16 compute the collective engine owns 2 bytes per owned parameter
    less; in fp32 there is no copy and the two estimates agree."""
    common = ("backend=sim", "model=qwen2_7b", "world_size=8", f"precision={precision}", "num_minibatches=1",
              "warmup_minibatches=0")
    odc = resolve(run_config("engine=odc", *common))
    collective = resolve(run_config("engine=collective", *common))
    owned_params = sum(-(-p // 8) for p in unit_params(odc.config.model))
    copy = owned_params * 2 if precision == "bf16" else 0
    assert odc.memory.owned - collective.memory.owned == copy
    assert (odc.memory.working, odc.memory.activations) == (collective.memory.working, collective.memory.activations)


def _cpu_rows() -> pd.DataFrame:
    tables = [pd.read_csv(p) for p in sorted(Path(REPO, "results").glob("cpu*/**/runs.csv"))]
    rows = pd.concat(tables, ignore_index=True)
    return rows[(rows["status"] == "ok") & (rows["backend"] == "local") & rows["mem_estimate_mb"].notna()]


def test_the_full_sharding_estimate_of_the_committed_cpu_runs_is_unchanged():
    """What the CPU validation compares with measured peaks (docs/simulator.md): every committed
    local run's estimate, recomputed from its config, is the one its row recorded (full
    sharding: no committed CPU run is hybrid), except that a collective bf16 run recorded a
    bf16 copy of its shards that FSDP2 does not keep (counted until 2026-11-27)."""
    rows = _cpu_rows()
    assert len(rows) > 50
    for _, row in rows.iterrows():
        config = yaml.safe_load(row["config"])
        model = build(ModelConfig, config["model"], "model.")
        # Stale-synchronous runs keep staleness + 1 version slots of the owned shards (staleness.md).
        slots = (config.get("engine") or {}).get("staleness", 0) + 1
        copy = ENGINES[row["engine"]].compute_shard_copy
        got = estimate(model, int(row["world_size"]), row["precision"], int(row["max_tokens"]),
                       cpu_longest=int(row["len_max"]), version_slots=slots, compute_shard_copy=copy).total / MB
        counted_then = 0.0
        if not copy and row["precision"] == "bf16":
            counted_then = sum(-(-p // int(row["world_size"])) for p in unit_params(model)) * 2 / MB
        assert got + counted_then == pytest.approx(row["mem_estimate_mb"], rel=1e-9), row["run_id"]


@pytest.mark.parametrize("head_dim", ["null", "48"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("tied", [False, True])
def test_unit_params_count_the_models_parameters_and_tied_embeddings_once(tied, family, head_dim):
    tie = f"model.tie_embeddings={str(tied).lower()}"
    cfg = resolve(run_config("engine=collective", "model.num_layers=1", tie, f"model.family={family}",
                             f"model.head_dim={head_dim}")).config.model
    with torch.device("meta"):  # shapes only: nothing allocated
        model = DecoderModel(cfg)
    assert sum(unit_params(cfg)) == sum(p.numel() for p in model.parameters())  # parameters() dedups tied ones
