"""odc_core as a library in a user's own loop, on 2 CPU ranks: the collective engine refuses
unequal microbatch counts by name instead of training wrong, and both engines return the global
gradient norm their clipping used, FSDP2's clip_grad_norm_'s."""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from functools import partial

import pytest
import torch
import torch.distributed as dist
from torch import nn

from odc_bench.run.ranks import RanksFailed, run_ranks
from odc_core import DataParallelEngine, OdcOptions, RanksDifferWarning, engine_context, make_engine

pytestmark = pytest.mark.slow


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x.square().sum()


def _inputs(count: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 8, generator=g) for _ in range(count)]


def _loop(rank: int, world: int, store: dist.Store, engine_name: str, counts: list[tuple[int, ...]],
          max_grad_norm: float | None) -> dict:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    torch.manual_seed(0)
    model = Net()
    engine = make_engine(engine_name, engine_context(timeout_s=20.0))
    try:
        engine.wrap(model, list(model.layers))
        engine.configure_optimizer(partial(torch.optim.SGD, lr=0.1), max_grad_norm=max_grad_norm)
        norms = []
        for k, per_rank in enumerate(counts):
            engine.begin_minibatch()
            for x in _inputs(per_rank[rank], 100 * k + rank):
                (model(x) * engine.loss_scale).backward()
            norms.append(engine.finish_minibatch())
        return {"norms": norms, "params": engine.full_parameters()}
    finally:
        engine.close()
        dist.destroy_process_group()


@pytest.mark.parametrize("counts", [(3, 1), (0, 2)])
def test_the_collective_engine_refuses_unequal_counts_naming_each_ranks(counts):
    with pytest.raises(RanksFailed) as refused:
        run_ranks(_loop, 2, "collective", [(2, 2), counts], None, timeout_s=90)
    text = str(refused.value)
    assert "collective FSDP needs every rank to run the same number of microbatches, but in minibatch 1" in text
    fewer = min(counts)
    assert f"ran {fewer}" in text and f"ran at least {fewer + 1}" in text, text


def test_both_engines_return_the_gradient_norm_their_clipping_used_and_agree():
    counts = [(2, 2), (1, 1)]
    runs = {name: run_ranks(_loop, 2, name, counts, 0.5, timeout_s=90) for name in ("collective", "odc")}
    # One process, the same microbatches: the norm of the summed gradient, then the clipped step.
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    norms = []
    for k, per_rank in enumerate(counts):
        for rank in range(2):
            for x in _inputs(per_rank[rank], 100 * k + rank):
                reference(x).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)))
        opt.step()
        opt.zero_grad()
    for name, ranks in runs.items():
        for r in ranks:
            assert r["norms"] == pytest.approx(norms, rel=1e-5), name
        for n, p in reference.named_parameters():
            torch.testing.assert_close(ranks[0]["params"][n], p.detach(), rtol=1e-5, atol=1e-6, msg=name)


def _wrap_on_meta(rank: int, world: int, store: dist.Store) -> str:
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world)
    with torch.device("meta"):
        model = Net()
    engine = make_engine("odc", engine_context(timeout_s=20.0))
    try:
        with pytest.raises(ValueError) as refused:
            engine.wrap(model, list(model.layers))
        return str(refused.value)
    finally:
        engine.close()
        dist.destroy_process_group()


def test_odc_refuses_a_model_on_the_meta_device_in_one_line_naming_a_parameter():
    """FSDP2's deferred initialisation (fully_shard on meta, then to_empty) has no ODC
    counterpart: ODC shards the values a parameter holds at wrap()."""
    message = run_ranks(_wrap_on_meta, 1)[0]
    assert message.startswith("parameter layers.0.weight is on the meta device (4 of the model's are)")
    assert "before wrap()" in message and "\n" not in message


def _late_sgd(params: list, late: bool) -> torch.optim.SGD:
    """SGD; `late`: an owner that applies its steps late, so that a peer's forward must wait for them."""
    optimizer = torch.optim.SGD(params, lr=0.1)
    if late:
        optimizer.register_step_pre_hook(lambda *_: time.sleep(0.5))
    return optimizer


def _odc_on_ranks(rank: int, world: int, store: dist.Store,
                  factory: Callable[[list], torch.optim.Optimizer]) -> tuple[Net, DataParallelEngine]:
    """This rank's process group and an ODC engine over Net (seed 0), wrapped by layer and given
    `factory`'s optimizer; the caller closes both."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world)
    torch.manual_seed(0)
    model = Net()
    engine = make_engine("odc", engine_context(timeout_s=20.0))
    engine.wrap(model, list(model.layers))
    engine.configure_optimizer(factory)
    return model, engine


def _evaluate_between_minibatches(rank: int, world: int, store: dist.Store) -> list[float]:
    model, engine = _odc_on_ranks(rank, world, store, partial(_late_sgd, late=rank == 1))
    try:
        evaluations = []
        for k in range(2):
            engine.begin_minibatch()
            for x in _inputs(1, 100 * k + rank):
                (model(x) * engine.loss_scale).backward()
            engine.finish_minibatch()
            with torch.no_grad():
                evaluations.append(float(model(_inputs(1, 999)[0])))
        return evaluations
    finally:
        engine.close()
        dist.destroy_process_group()


def test_a_forward_between_minibatches_sees_every_owners_step():
    """Evaluation after finish_minibatch() reads the parameters after the step, on every owner:
    before, rank 0 read rank 1's shard while rank 1 was still stepping it in place."""
    torch.manual_seed(0)
    reference = Net()
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    expected = []
    for k in range(2):
        for rank in range(2):
            for x in _inputs(1, 100 * k + rank):
                reference(x).backward()
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            expected.append(float(reference(_inputs(1, 999)[0])))
    assert run_ranks(_evaluate_between_minibatches, 2)[0] == pytest.approx(expected, rel=1e-5)


def _wrap_unlike(rank: int, world: int, store: dist.Store, cases: list[tuple[str, str]]) -> list[str]:
    """Each case's engine wrapped on both ranks, rank 1 unlike rank 0 in one way; the errors."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    errors = []
    try:
        for engine_name, case in cases:
            torch.manual_seed(1 if case == "values" and rank == 1 else 0)
            model = Net()
            if case == "shape" and rank == 1:
                model.layers[1] = nn.Linear(8, 9)
            if case == "frozen" and rank == 1:
                model.layers[0].bias.requires_grad_(False)
            units = list(model.layers)[: 1 if case == "units" and rank == 1 else 2]
            precision = "bf16" if case == "precision" and rank == 1 else "fp32"
            engine = make_engine(engine_name, engine_context(precision=precision, timeout_s=20.0))
            lr = 0.2 if case == "lr" and rank == 1 else 0.1
            clip = 1.0 if case == "clipping" and rank == 1 else None
            try:
                with warnings.catch_warnings(record=True) as warned:
                    warnings.simplefilter("always", RanksDifferWarning)
                    engine.wrap(model, units)
                engine.configure_optimizer(partial(torch.optim.AdamW, lr=lr), max_grad_norm=clip)
                errors.append(" ".join(f"warning: {w.message}" for w in warned if w.category is RanksDifferWarning))
            except ValueError as e:
                errors.append(str(e))
            finally:
                engine.close()
        return errors
    finally:
        dist.destroy_process_group()


def test_ranks_that_wrap_or_configure_unlike_models_units_precisions_or_optimizers_are_refused_in_one_line():
    """Before, FSDP2 trained on without a word, each rank on its own shapes and dtypes (parameters
    apart across ranks, or at 1e35), and ODC refused with its heap's "asymmetric allocation"; both
    stepped each rank's shards at its own learning rate."""
    wrap = "; every rank must wrap the same model"
    said = {"shape": f"parameter layers.1.weight: float32 (8, 8) on rank 0, float32 (9, 8) on rank 1{wrap}",
            "frozen": f"parameter layers.0.bias: float32 (8,) on rank 0, float32 (8,) frozen on rank 1{wrap}",
            "units": f"the units: 2 (layers.0, layers.1) on rank 0, 1 (layers.0) on rank 1{wrap}",
            "precision": "the engine's precision: float32 compute with float32 reduction on rank 0, bfloat16 "
                         f"compute with float32 reduction on rank 1{wrap}",
            "lr": "the optimizer's group 0 lr: 0.1 on rank 0, 0.2 on rank 1; every rank must configure the same "
                  "optimizer",
            "clipping": "max_grad_norm: None on rank 0, 1.0 on rank 1; every rank must configure",
            "values": None, "same": None}
    cases = [(engine, case) for engine in ("odc", "collective") for case in said]
    ranks = run_ranks(_wrap_unlike, 2, cases, timeout_s=120)
    for (engine, case), *errors in zip(cases, *ranks, strict=True):
        for error in errors:
            if case == "same":
                assert error == "", (engine, error)
            elif case == "values":  # a warning: ranks seeded apart train a random model either way
                assert error.startswith("warning: the ranks wrap different values: parameter layers.0.weight differs "
                                        "between rank 0 and rank 1 (a model loaded on some ranks only"), (engine, error)
            else:
                assert error.startswith(f"the ranks disagree on {said[case]}"), (engine, case, error)
                assert "\n" not in error


def _load_unlike(rank: int, world: int, store: dist.Store, cases: list[tuple[str, str]]) -> list[str]:
    """Each case's engine, one step in, loading full state dicts in which rank 1's is unlike rank
    0's in one way; the error, or the parameters it then holds (sums, rounded)."""
    from odc_core import get_state_dict, set_state_dict

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    out = []
    try:
        for engine_name, case in cases:
            torch.manual_seed(0)
            model = Net()
            engine = make_engine(engine_name, engine_context(timeout_s=20.0))
            try:
                engine.wrap(model, list(model.layers))
                engine.configure_optimizer(partial(torch.optim.AdamW, lr=0.1))
                engine.begin_minibatch()
                model(_inputs(1, rank)[0]).backward()
                engine.finish_minibatch()
                model_sd, optim_sd = get_state_dict(engine, full=True)
                if rank == 1:
                    if case == "values":  # read from other files: rank 0's load, on both engines
                        model_sd = {k: v + 1 for k, v in model_sd.items()}
                    if case == "missing":  # as torch's broadcast_from_rank0 takes it
                        model_sd, optim_sd = {}, {}
                    if case == "lr":
                        optim_sd = {**optim_sd, "param_groups": [{**g, "lr": 0.5} for g in optim_sd["param_groups"]]}
                expected = {k: round(float(v.sum()), 4) for k, v in engine.full_parameters().items()}
                set_state_dict(engine, model_sd, optim_sd)
                held = {k: round(float(v.sum()), 4) for k, v in engine.full_parameters().items()}
                out.append("kept rank 0's" if held == expected else f"holds {held}, not {expected}")
            except ValueError as e:
                out.append(str(e))
            finally:
                engine.close()
        return out
    finally:
        dist.destroy_process_group()


def test_ranks_that_load_unlike_state_dicts_are_refused_in_one_line_and_whole_tensors_are_rank_0s():
    """Before, a rank missing a key failed alone (ODC) or aborted gloo (FSDP2), a rank's own learning
    rate in its state dict stepped its shards at that rate on both engines, and ODC loaded each
    rank's shards from its own full tensors, a mixture, where FSDP2 loads rank 0's."""
    fix = "; every rank must load the same state dicts"
    said = {"missing": f"the model state dict's layers.0.bias: a tensor float32 (8,) on rank 0, absent on rank 1{fix}",
            "lr": f"the state dict's optimizer group 0 lr: 0.1 on rank 0, 0.5 on rank 1{fix}"}
    cases = [(engine, case) for engine in ("odc", "collective") for case in ("values", "missing", "lr", "same")]
    ranks = run_ranks(_load_unlike, 2, cases, timeout_s=120)
    for (engine, case), *outs in zip(cases, *ranks, strict=True):
        for out in outs:
            if case in said:
                assert out.startswith(f"the ranks disagree on {said[case]}"), (engine, case, out)
                assert "\n" not in out
            else:
                assert out == "kept rank 0's", (engine, case, out)


def _one_rank_stops(rank: int, world: int, store: dist.Store, case: str) -> str:
    """ODC (or, for `collective-...`, FSDP2) on 2 ranks, rank 1 running one minibatch fewer
    (synchronous or stale-synchronous ODC, closing without drain()) or raising in its second;
    the error each rank ends with, or "ok"."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))

    def loop() -> None:
        model = Net()
        engine = make_engine("collective", engine_context(timeout_s=20.0)) if case.startswith("collective") else \
            make_engine("odc", engine_context(timeout_s=20.0), OdcOptions(staleness=int(case == "fewer-stale")))
        try:
            engine.wrap(model, list(model.layers))
            engine.configure_optimizer(partial(torch.optim.SGD, lr=0.1))
            for k in range(2 if case.removeprefix("collective-").startswith("fewer") and rank == 1 else 3):
                engine.begin_minibatch()
                if case.endswith("raises") and rank == 1 and k == 1:
                    raise ValueError("rank 1's data ran out")
                model(_inputs(1, k)[0]).backward()
                engine.finish_minibatch()
        finally:
            engine.close()

    try:
        loop()
        return "ok"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("case", ["fewer", "fewer-stale", "raises", "collective-fewer", "collective-raises"])
def test_a_rank_that_closes_its_engine_early_fails_its_peers_at_once_saying_when_and_why(case: str):
    """Before, the peer waited out the engine's timeout (120 s by default) and named only what it
    waited for: `timed out after 120.0s waiting for rank 1: its gradients of minibatch 2`; with
    staleness 1, where the peer runs its extra minibatch without waiting, both ranks closed
    without an error and the peer's last gradients were lost: its close drains now. FSDP2's
    peer failed at once too, but in gloo's words: `Connection closed by peer [127.0.0.1]:11149`."""
    first, second = run_ranks(_one_rank_stops, 2, case, timeout_s=120)
    if case == "collective-fewer":
        assert (second, first) == ("ok", "RuntimeError: rank 1 closed its engine after minibatch 1 while this rank "
                                         "waits for its peers in minibatch 2: every rank must run the same minibatches")
        return
    if case == "collective-raises":
        assert (second, first) == ("ValueError: rank 1's data ran out",
                                   "RuntimeError: rank 1 failed in minibatch 1 (ValueError: rank 1's data ran out) "
                                   "while this rank waits for its peers in minibatch 1")
        return
    if case == "fewer":
        assert second == "ok"
        assert first == ("RuntimeError: rank 1 closed its engine after minibatch 1 while this rank waits for its "
                         "gradients of minibatch 2: every rank must run the same minibatches")
    elif case == "fewer-stale":
        assert second == "ok"
        assert first == ("RuntimeError: rank 1 closed its engine after minibatch 1 while this rank waits for its "
                         "gradients of minibatch 2 (for step 2): every rank must run the same minibatches")
    else:
        assert second == "ValueError: rank 1's data ran out"
        assert first == ("RuntimeError: rank 1 failed in minibatch 1 (ValueError: rank 1's data ran out) while this "
                         "rank waits for its gradients of minibatch 1")


def _from_rank0(rank: int, world: int, store: dist.Store, engines: list[str]) -> list[object]:
    """Per engine: a trained engine's full state dicts, loaded into a fresh engine from rank 0
    only (rank 1 passes {}), then on every rank without broadcast_from_rank0; whether the state
    then equals rank 0's, whether the caller's dicts still hold plain tensors, and the errors of
    broadcasting a sharded dict and one without a parameter."""
    from odc_core import get_state_dict, set_state_dict

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))

    def engine_of(name: str, seed: int) -> tuple:
        torch.manual_seed(seed)
        model = Net()
        engine = make_engine(name, engine_context(timeout_s=20.0))
        engine.wrap(model, list(model.layers))
        engine.configure_optimizer(partial(torch.optim.AdamW, lr=0.1))
        return engine, model

    def same(a: dict, b: dict) -> bool:
        return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)

    out: list[object] = []
    try:
        for name in engines:
            source, model = engine_of(name, 0)
            for k in range(2):
                source.begin_minibatch()
                model(_inputs(1, 10 * k + rank)[0]).backward()
                source.finish_minibatch()
            model_sd, optim_sd = get_state_dict(source, full=True)
            sharded, _ = get_state_dict(source)
            source.close()
            for broadcast in (True, False):
                target, _ = engine_of(name, 1)
                given = (model_sd, optim_sd) if rank == 0 or not broadcast else ({}, {})
                set_state_dict(target, *given, broadcast_from_rank0=broadcast)
                loaded_model, loaded_optim = get_state_dict(target, full=True)
                out.append(same(loaded_model, model_sd) and all(
                    same(loaded_optim["state"][n], optim_sd["state"][n]) for n in optim_sd["state"]))
                out.append(all(type(v) is torch.Tensor for v in given[0].values()))
                if broadcast:
                    for wrong in (sharded, {k: v for k, v in model_sd.items() if k != "layers.0.weight"}):
                        try:
                            set_state_dict(target, wrong, optim_sd, broadcast_from_rank0=True)
                        except ValueError as e:
                            out.append(str(e))
                target.close()
        return out
    finally:
        dist.destroy_process_group()


def test_state_dicts_on_rank_0_only_load_into_both_engines_with_broadcast_from_rank0():
    """Before, set_state_dict had no broadcast_from_rank0 (torch's StateDictOptions has one), and
    FSDP2's set_state_dict put DTensors into the caller's full model state dict."""
    ranks = run_ranks(_from_rank0, 2, ["odc", "collective"], timeout_s=120)
    assert ranks[0] == ranks[1]
    refusal = {"odc": "ShardedTensor", "collective": "DTensor"}
    for name, out in zip(("odc", "collective"), (ranks[0][:6], ranks[0][6:]), strict=True):
        assert out[:2] == [True, True] and out[4:] == [True, True], (name, out)
        assert out[2] == (f"broadcast_from_rank0 loads full state dicts, and rank 0's holds a {refusal[name]}: pass "
                          f"get_state_dict(engine, full=True)'s, or load sharded ones on every rank without it")
        assert out[3].startswith("the model state dict has no 'layers.0.weight'"), (
            "refused on every rank, where FSDP2's other ranks waited for rank 0")


def _reference_closed_first(rank: int, world: int, store: dist.Store, engine_name: str) -> str:
    """Two engines of one context (a policy and its reference model): a forward of the reference
    and a policy minibatch, then the reference closed and a policy minibatch that rank 1 starts
    1.5 s late; the policy's end, or its error."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    ctx = engine_context(timeout_s=20.0)
    policy, reference = Net(), Net()
    engines = [make_engine(engine_name, ctx), make_engine(engine_name, ctx)]
    try:
        for engine, model in zip(engines, (policy, reference), strict=True):
            engine.wrap(model, list(model.layers))
        engines[0].configure_optimizer(partial(torch.optim.SGD, lr=0.1))
        for k in range(2):
            if k == 0:
                with torch.no_grad():
                    reference(_inputs(1, rank)[0])
            else:
                engines[1].close()
                time.sleep(1.5 if rank == 1 else 0.0)
            engines[0].begin_minibatch()
            policy(_inputs(1, rank)[0]).backward()
            engines[0].finish_minibatch()
        return "ok"
    except RuntimeError as e:
        return str(e)
    finally:
        engines[0].close()
        dist.destroy_process_group()


@pytest.mark.parametrize("engine", ["odc", "collective"])
def test_two_engines_of_one_context_train_apart_and_closing_one_does_not_fail_the_others_waits(engine: str):
    """Before, the second engine of one context made shared-memory segments (ODC) or groups
    (FSDP2 over shm) of the first one's names and failed in FileExistsError; each engine's close
    is its own, too: the policy's peers do not take the reference engine's close for the policy's."""
    assert run_ranks(_reference_closed_first, 2, engine, timeout_s=120) == ["ok", "ok"]


def _rank_0_skips_its_backward(rank: int, world: int, store: dist.Store) -> tuple[list[str], dict]:
    model, engine = _odc_on_ranks(rank, world, store, partial(torch.optim.SGD, lr=0.1))
    try:
        engine.begin_minibatch()
        loss = model(_inputs(1, rank)[0])
        if rank == 1:  # rank 0 skips its only microbatch's backward (a loss that was not finite)
            loss.backward()
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            engine.finish_minibatch()
        engine.drain()
        return [f"{w.category.__name__}: {w.message}" for w in warned], engine.full_parameters()
    finally:
        engine.close()
        dist.destroy_process_group()


def test_an_odc_rank_that_ran_no_backward_warns_and_the_others_gradients_make_the_step():
    """On several ranks, a rank whose forwards no backward followed adds nothing to the step,
    which its peers' gradients make, as a rank given no microbatch does: it is told in a
    warning, where on one rank the minibatch is refused (tests/unit/test_autograd_grad.py)."""
    (warned0, got), (warned1, _) = run_ranks(_rank_0_skips_its_backward, 2)
    assert warned1 == []
    assert len(warned0) == 1 and warned0[0].startswith(
        "NoBackwardWarning: minibatch 0 ran a forward with gradients on this rank, but no backward() reached the "
        "model's parameters (rank 0): this rank adds nothing to the step, and where no rank does, the step applies "
        "only the optimizer's own terms (weight decay, momentum); call loss.backward()")
    torch.manual_seed(0)
    reference = Net()
    reference(_inputs(1, 1)[0]).backward()
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-6, atol=1e-6, msg=name)
