"""odc_core in a user's own loop does what an FSDP2 loop does, on 2 CPU ranks against one
process: optimizer parameter groups (no weight decay on norms and biases, a scaled learning
rate), mixed-precision policies, and model and optimizer state dicts, full and sharded, that
move between the engines."""

from __future__ import annotations

import copy
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from odc_bench.run.ranks import run_ranks
from odc_core import (
    DataParallelEngine,
    EngineContext,
    MixedPrecision,
    OdcOptions,
    OptimizerFactory,
    engine_context,
    get_state_dict,
    make_engine,
    set_state_dict,
)
from odc_core.engine.odc.engine import build

pytestmark = pytest.mark.slow

STEPS, LR, EPS, DECAY = 3, 0.05, 1e-4, 0.1


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(self.norm(x)))


class Net(nn.Module):
    """Two blocks and a head: 2 ranks' flat shards cut a unit between a weight and the norm and
    bias after it, so one rank's shard holds parameters of two groups."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).square().sum()


def groups(name: str, p: nn.Parameter) -> dict[str, Any]:
    """The usual recipe: no weight decay on norms and biases; here also half the head's rate."""
    if p.dim() < 2:
        return {"weight_decay": 0.0}
    return {"lr_scale": 0.5} if name.startswith("head") else {}


def _inputs(step: int, rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return [torch.randn(3, 8, generator=g) for _ in range(2)]


ADAMW = partial(torch.optim.AdamW, lr=LR, eps=EPS, weight_decay=DECAY)
# Where low precision is compared with fp32: AdamW's step of +-lr on a near-zero gradient would
# turn bf16's rounding into differences of lr.
SGD = partial(torch.optim.SGD, lr=LR)


def _train(rank: int, engine_name: str, grouped: bool, precision: str | MixedPrecision,
           factory: OptimizerFactory = ADAMW, loop_casts: bool = True, load: str = "fp32") -> dict:
    """`loop_casts`: the loop casts its inputs to the compute dtype (else the engine must, as
    FSDP2 does); `load`: the model in fp32, in bf16 ("bf16"), or in fp32 holding bf16's values."""
    torch.manual_seed(0)
    model = Net()
    if load != "fp32":
        model.to(torch.bfloat16)
        if load == "bf16-values":
            model.float()
    engine = make_engine(engine_name, engine_context(precision=precision, timeout_s=20.0))
    dtype = MixedPrecision.of(precision).param_dtype if loop_casts else torch.float32
    try:
        engine.wrap(model, [*model.blocks, model.head])
        engine.configure_optimizer(factory, param_groups=groups if grouped else None)
        for step in range(STEPS):
            engine.begin_minibatch()
            for x in _inputs(step, rank):
                (model(x.to(dtype)) * engine.loss_scale).backward()
            engine.finish_minibatch()
        return {"params": engine.full_parameters(), "heap_bytes": engine.heap_bytes,
                "groups": [{k: v for k, v in g.items() if k != "params"} for g in engine.optimizer.param_groups]}
    finally:
        engine.close()


def _loop(rank: int, world: int, store: dist.Store, runs: list[tuple]) -> list[dict]:
    """Each run in turn, one engine after another in the same ranks (_train's arguments)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    try:
        return [_train(rank, *run) for run in runs]
    finally:
        dist.destroy_process_group()


def _reference(grouped: bool, factory: OptimizerFactory = ADAMW) -> dict[str, torch.Tensor]:
    """One process over every rank's microbatches, torch-style groups built by hand."""
    torch.manual_seed(0)
    model = copy.deepcopy(Net())
    named = list(model.named_parameters())
    if grouped:
        params: list[Any] = [
            {"params": [p for n, p in named if p.dim() >= 2 and not n.startswith("head")]},
            {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0},
            {"params": [p for n, p in named if p.dim() >= 2 and n.startswith("head")], "lr": LR * 0.5},
        ]
    else:
        params = [p for _, p in named]
    opt = factory(params)
    for step in range(STEPS):
        for rank in range(2):
            for x in _inputs(step, rank):
                model(x).backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in named}


def test_parameter_groups_train_alike_on_odc_fsdp2_and_one_process():
    reference, ungrouped = _reference(grouped=True), _reference(grouped=False)
    # The groups change the result, so agreeing with the grouped reference shows they were applied.
    assert max((reference[n] - ungrouped[n]).abs().max().item() for n in reference) > 1e-3
    ranks = run_ranks(_loop, 2, [("odc", True, "fp32"), ("collective", True, "fp32")], timeout_s=90)
    for name, run in zip(("odc", "collective"), ranks[0], strict=True):
        for n, p in reference.items():
            torch.testing.assert_close(run["params"][n], p, rtol=1e-5, atol=1e-6, msg=f"{name}: {n}")
        # Groups in the order of their first parameter (a norm's first); lr_scale applied to the learning rate.
        lrs = [g["lr"] for g in run["groups"]]
        decays = [g["weight_decay"] for g in run["groups"]]
        assert lrs == pytest.approx([LR, LR, LR * 0.5]) and decays == [0.0, DECAY, DECAY], name


def test_bf16_is_the_policy_bf16_params_fp32_reduction_and_bf16_reduction_differs_as_expected():
    bf16 = torch.bfloat16
    policies: list[str | MixedPrecision] = ["bf16", MixedPrecision(bf16, torch.float32), MixedPrecision(bf16, bf16)]
    runs = [(name, False, policy, SGD) for name in ("odc", "collective") for policy in policies]
    results = run_ranks(_loop, 2, runs, timeout_s=120)[0]
    reference = _reference(False, SGD)
    for i, name in enumerate(("odc", "collective")):
        named, explicit, bf16_sums = results[3 * i:3 * i + 3]
        for n in reference:
            # The name and the policy are one thing: bit for bit.
            assert torch.equal(named["params"][n], explicit["params"][n]), f"{name}: {n}"
            # Summed in bf16: near the fp32 reference (bf16's 3 significant digits), not the fp32 sum's result.
            torch.testing.assert_close(bf16_sums["params"][n], reference[n], rtol=0.05, atol=0.02)
        assert any(not torch.equal(bf16_sums["params"][n], named["params"][n]) for n in reference), name
    # ODC keeps its gradient accumulators in the reduce dtype: half the bytes of fp32 ones.
    shards = sum(p.numel() for p in reference.values()) / 2
    assert results[0]["heap_bytes"] - results[2]["heap_bytes"] == pytest.approx(2 * shards, abs=16)


def test_bf16_casts_fp32_inputs_as_fsdp2_does_and_odc_takes_a_bf16_model_onto_fp32_masters():
    """FSDP2's MixedPrecisionPolicy casts each sharded module's floating inputs to its param_dtype,
    so an FSDP2 loop feeds fp32 tensors; ODC casts them the same way (before, a bf16 weight met an
    fp32 input: 'mat1 and mat2 must have the same dtype'). A model loaded in bf16 keeps fp32
    masters on ODC: it trains as an fp32 model holding the same values."""
    runs = [(name, False, "bf16", SGD, loop_casts) for name in ("odc", "collective") for loop_casts in (True, False)]
    runs += [("odc", False, "bf16", SGD, True, load) for load in ("bf16", "bf16-values")]
    results = run_ranks(_loop, 2, runs, timeout_s=120)[0]
    for i, name in enumerate(("odc", "collective")):
        cast_by_loop, cast_by_engine = results[2 * i:2 * i + 2]
        for n, p in cast_by_loop["params"].items():
            assert torch.equal(cast_by_engine["params"][n], p), f"{name}: {n}"
    bf16_model, bf16_values = results[4:]
    for n, p in bf16_values["params"].items():
        assert torch.equal(bf16_model["params"][n], p), n
    assert any(not torch.equal(bf16_values["params"][n], p) for n, p in results[0]["params"].items())


@pytest.mark.parametrize(("dtype", "precision"), [(torch.bfloat16, "fp32"), (torch.float64, "fp32"),
                                                  (torch.float16, "bf16")])
def test_odc_refuses_parameters_of_a_dtype_it_neither_keeps_nor_computes_in(dtype, precision, one_rank_group):
    model = Net()
    model.head.to(dtype)
    engine = make_engine("odc", EngineContext(torch.device("cpu"), one_rank_group, "dtypes", 20.0, precision))
    try:
        with pytest.raises(ValueError) as refused:
            engine.wrap(model, [*model.blocks, model.head])
    finally:
        engine.close()
    compute = MixedPrecision.of(precision).param_dtype
    assert str(refused.value) == (f"parameter head.weight is {dtype} (2 of the model's are not float32), and engine "
                                  f"odc computes in {compute} on float32 master weights: load the model in float32, "
                                  f"with precision='bf16' for bf16 compute (a bf16 model works there too)")


@pytest.mark.parametrize("transport, device", [("mpi", "cpu"), ("cuda_ipc", "cuda"), ("nvshmem", "cuda")])
def test_odc_refuses_a_reduce_dtype_its_transport_cannot_add_in(transport, device):
    ctx = EngineContext(torch.device(device), dist.HashStore(), "job", 1.0, MixedPrecision(torch.bfloat16,
                                                                                            torch.bfloat16))
    with pytest.raises(ValueError, match=f"engine=odc on transport {transport} sums gradients in float32 only, "
                                         f"not bfloat16: use MixedPrecision"):
        build(ctx, OdcOptions(transport=transport))


def _wrapped(engine_name: str, seed: int) -> tuple[Net, DataParallelEngine]:
    torch.manual_seed(seed)
    model = Net()
    engine = make_engine(engine_name, engine_context(timeout_s=20.0))
    engine.wrap(model, [*model.blocks, model.head])
    engine.configure_optimizer(ADAMW, param_groups=groups)
    return model, engine


def _step(model: Net, engine: DataParallelEngine, step: int, rank: int) -> None:
    engine.begin_minibatch()
    for x in _inputs(step, rank):
        (model(x) * engine.loss_scale).backward()
    engine.finish_minibatch()


def _round_trip(rank: int, world: int, store: dist.Store, trips: list[tuple[str, str, bool]]) -> list[dict]:
    """For each (first, second, full): train `first` two steps, load its state dicts into a fresh
    `second` (other initial weights), then take the third step on both."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    out = []
    try:
        for first, second, full in trips:
            model, engine = _wrapped(first, seed=0)
            other, fresh = _wrapped(second, seed=1)
            try:
                for step in range(2):
                    _step(model, engine, step, rank)
                saved = engine.full_parameters()
                set_state_dict(fresh, *get_state_dict(engine, full=full))
                loaded = fresh.full_parameters()
                _step(model, engine, 2, rank)
                _step(other, fresh, 2, rank)
                out.append({"saved": saved, "loaded": loaded, "first": engine.full_parameters(),
                            "second": fresh.full_parameters()})
            finally:
                engine.close()
                fresh.close()
        return out
    finally:
        dist.destroy_process_group()


def test_state_dicts_move_between_odc_and_fsdp2_and_give_the_same_next_step():
    trips = [("odc", "collective", True), ("collective", "odc", True),  # full, both ways
             ("collective", "odc", False), ("odc", "odc", False),  # sharded: FSDP2's DTensors, ODC's own layout
             # FSDP2's DTensors into another collective engine of the same ranks (a policy's weights into its
             # reference model): each engine's mesh is its own, and DTensor refused to copy across them; and
             # the optimizer took the first engine's state tensors as its own, moved by that engine's steps.
             ("collective", "collective", False)]
    for (first, second, full), r in zip(trips, run_ranks(_round_trip, 2, trips, timeout_s=120)[0], strict=True):
        what = f"{first} -> {second} ({'full' if full else 'sharded'})"
        for n, p in r["saved"].items():
            assert torch.equal(r["loaded"][n], p), f"{what}: {n} loaded"
            # The optimizer's state came along: without its moments and step count the next step differs.
            torch.testing.assert_close(r["second"][n], r["first"][n], rtol=1e-5, atol=1e-6, msg=f"{what}: {n}")


def _refuse(rank: int, world: int, store: dist.Store) -> str:
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    try:
        _, odc = _wrapped("odc", seed=0)
        _, collective = _wrapped("collective", seed=0)
        try:
            with pytest.raises(ValueError) as refused:
                set_state_dict(collective, *get_state_dict(odc))
            return str(refused.value)
        finally:
            odc.close()
            collective.close()
    finally:
        dist.destroy_process_group()


def test_a_sharded_odc_state_dict_is_refused_by_fsdp2_in_one_line():
    message = run_ranks(_refuse, 2, timeout_s=60)[0]
    assert message.startswith("a sharded ODC state dict cannot load into collective FSDP; pass a full one")
