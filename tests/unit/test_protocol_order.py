"""The engine protocol called out of order is one line, the same from both engines: before, ODC
waited its whole timeout for a version nobody would publish (begin_minibatch() twice), crashed
with SIGSEGV (wrap() twice: it read parameters whose storage it had freed), or failed deep in a
forward (after close()); FSDP2 stepped on whatever gradients there were (finish_minibatch()
with no minibatch open) or raised a bare AssertionError."""

import re
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import torch
from torch import nn

from odc_core import DataParallelEngine, checkpoint, get_state_dict, set_state_dict
from odc_core.engine.base import EngineContext
from odc_core.engine.build import make_engine


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x.sum()


def _microbatch(model: Net) -> None:
    model(torch.ones(2, 4)).backward()


def _begin_twice(engine: DataParallelEngine, model: Net) -> None:
    engine.begin_minibatch()
    _microbatch(model)
    engine.begin_minibatch()


def _finish_unopened(engine: DataParallelEngine, model: Net) -> None:
    engine.begin_minibatch()
    _microbatch(model)
    engine.finish_minibatch()
    engine.finish_minibatch()


def _wrap_again(engine: DataParallelEngine, model: Net) -> None:
    engine.wrap(model, list(model.layers))


def _after_close(engine: DataParallelEngine, model: Net) -> None:
    engine.close()
    engine.begin_minibatch()


CASES: dict[str, tuple[Callable[[DataParallelEngine, Net], None], str]] = {
    "begin twice": (_begin_twice, "begin_minibatch() while minibatch 0 is open: call finish_minibatch() first"),
    "finish unopened": (_finish_unopened, "finish_minibatch() with no minibatch open: call begin_minibatch() "),
    "wrap again": (_wrap_again, "wrap() was called already: an engine shards one model, once; make another engine"),
    "after close": (_after_close, "begin_minibatch() after close(): the engine freed its shards; make another engine"),
}


# What reads or loads the whole state, called inside a minibatch: on ODC each waited timeout_s
# for the open minibatch's own step (PeerTimeout naming rank 0, the only rank).
INSIDE: dict[str, Callable[[DataParallelEngine, Path], object]] = {
    "drain": lambda engine, _: engine.drain(),
    "full_parameters": lambda engine, _: engine.full_parameters(),
    "get_state_dict": lambda engine, _: get_state_dict(engine),
    "set_state_dict": lambda engine, _: set_state_dict(engine, {}, {}),
    "checkpoint.save": lambda engine, saved: checkpoint.save(engine, saved.parent, 1),
    "checkpoint.load": lambda engine, saved: checkpoint.load(engine, saved),
}


def _engine(name: str, store: object) -> DataParallelEngine:
    return make_engine(name, EngineContext(torch.device("cpu"), store, uuid.uuid4().hex[:8], 10.0, "fp32"))


@pytest.mark.parametrize("engine_name", ["odc", "collective"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_protocol_call_out_of_order_is_one_line(case, engine_name, one_rank_group):
    misuse, message = CASES[case]
    model = Net()
    engine = _engine(engine_name, one_rank_group)
    try:
        engine.wrap(model, list(model.layers))
        engine.configure_optimizer(partial(torch.optim.SGD, lr=0.1))
        with pytest.raises(RuntimeError) as refused:
            misuse(engine, model)
    finally:
        engine.close()
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


@pytest.mark.parametrize("engine_name", ["odc", "collective"])
def test_a_minibatch_before_configure_optimizer_is_refused_as_it_begins(engine_name, one_rank_group):
    """Refused at finish_minibatch() before, where ODC had taken the minibatch as finished: its
    close() then waited timeout_s for a step nobody would take (PeerTimeout naming rank 0)."""
    model = Net()
    engine = _engine(engine_name, one_rank_group)
    try:
        engine.wrap(model, list(model.layers))
        with pytest.raises(RuntimeError, match=r"^begin_minibatch\(\) before configure_optimizer\(\): the engine "
                                                r"steps each minibatch with the optimizer "
                                                r"configure_optimizer\(factory\) builds; call it first$"):
            engine.begin_minibatch()
        with pytest.raises(RuntimeError, match=r"^engine\.optimizer before configure_optimizer\(\)"):
            _ = engine.optimizer
        engine.configure_optimizer(partial(torch.optim.SGD, lr=0.1))
        engine.begin_minibatch()  # configured now: the minibatch runs
        _microbatch(model)
        engine.finish_minibatch()
    finally:
        engine.close()


@pytest.mark.parametrize("second_engine", ["odc", "collective"])
@pytest.mark.parametrize("first_closed", [False, True])
def test_a_model_odc_wrapped_is_refused_by_a_second_engine_without_reading_its_freed_parameters(
        one_rank_group, first_closed, second_engine):
    """Wrapped by ODC, or by an ODC engine closed since (its values freed with its shards): the
    close case was told "is the model wrapped by another engine already?", which it was not."""
    model = Net()
    first, second = _engine("odc", one_rank_group), _engine(second_engine, one_rank_group)
    try:
        first.wrap(model, list(model.layers))
        if first_closed:
            first.close()
        with pytest.raises(ValueError, match=r"^parameter layers\.0\.weight holds no values \(an ODC engine keeps "
                                             r"them in its shards\): the model is wrapped by another engine already, "
                                             r"or was by one that close\(\) ended, which freed them; wrap a model "
                                             r"once, and to train on after close\(\), take the weights before it"):
            second.wrap(model, list(model.layers))
    finally:
        second.close()
        first.close()


def _full_parameters_on_rank_0_only(rank: int, world: int, store: object) -> str:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world)
    engine = make_engine("odc", EngineContext(torch.device("cpu"), store, "one-sided", 2.0, "fp32"))
    try:
        model = Net()
        engine.wrap(model, list(model.layers))
        said = ""
        if rank == 0:
            try:
                engine.full_parameters()
            except TimeoutError as e:
                said = str(e)
            store.set("said", "1")  # type: ignore[attr-defined]
        else:
            store.wait(["said"])  # type: ignore[attr-defined]
        return said
    finally:
        engine.close()
        dist.destroy_process_group()


def test_a_collective_call_one_rank_makes_alone_times_out_naming_the_call():
    """Before, the timeout named only the barrier it waited at ("barrier #2")."""
    from odc_bench.run.ranks import run_ranks

    said = run_ranks(_full_parameters_on_rank_0_only, 2, timeout_s=60)[0]
    assert said.startswith("timed out after 2.0s waiting for rank 1: ") and "\n" not in said
    assert said.endswith(", in full_parameters(), which every rank must call"), said


@pytest.mark.parametrize("kwargs,said", [
    (dict(timeout_s=0), "must be a positive number of seconds, got 0"),
    (dict(timeout_s=-1.0), "must be a positive number of seconds, got -1.0"),
    (dict(timeout_s=float("nan")), "must be a positive number of seconds, got nan"),
    pytest.param(dict(device="cuda"), "engine_context(device='cuda'): this machine has no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
    (dict(device="mps"), "engine_context(device='mps'): odc_core's engines run on CPU and CUDA devices only"),
    (dict(device="meta"), "engine_context(device='meta'): odc_core's engines run on CPU and CUDA devices only"),
    (dict(device="gpu"), "engine_context(device='gpu') is not a device torch knows ("),
])
def test_an_engine_context_it_cannot_use_is_refused_in_one_line(kwargs, said, one_rank_group):
    """A timeout of 0 or NaN was taken (every wait for a peer would fail at once, or never end),
    and device="cuda" failed later in AttributeError: 'str' object has no attribute 'type';
    the collective engine on device="mps" failed in an AttributeError of torch.mps, on "meta" in
    one of None, and "gpu" raised torch's RuntimeError."""
    from odc_core import engine_context

    with pytest.raises(ValueError) as refused:
        engine_context(**kwargs)
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_a_cuda_device_this_process_does_not_see_is_refused_in_one_line(one_rank_group, monkeypatch):
    """cuda:3 on a machine of one GPU failed in CUDA's "invalid device ordinal" at the first tensor."""
    from odc_core import engine_context

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"^engine_context\(device='cuda:3'\): this process sees 1 CUDA device "
                                         r"\(cuda:0\); give one of those \(CUDA_VISIBLE_DEVICES may hide the "
                                         r"others\)$"):
        engine_context("cuda:3")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"sees 2 CUDA devices \(cuda:0 to cuda:1\)"):
        engine_context("cuda:2")


def test_an_engine_context_whose_job_id_no_segment_name_holds_is_refused_in_one_line(one_rank_group):
    """Before, an id of 300 characters failed in the engine's first allocation, "[Errno 36] File
    name too long: '/dev/shm/odc-xxx...", and an int in job_tag's re.sub."""
    from odc_core import EngineContext

    EngineContext(torch.device("cpu"), one_rank_group, "x" * 128, 30.0, "fp32")
    with pytest.raises(ValueError, match=r"^EngineContext's job_id names the engine's shared memory and holds up to "
                                         r"128 bytes, got 300 \('x{40}'\.\.\.\); give a shorter id"):
        EngineContext(torch.device("cpu"), one_rank_group, "x" * 300, 30.0, "fp32")
    with pytest.raises(TypeError, match=r"^EngineContext's job_id must be a str, got int 7$"):
        EngineContext(torch.device("cpu"), one_rank_group, 7, 30.0, "fp32")  # type: ignore[arg-type]


def test_an_engine_context_takes_a_device_by_name(one_rank_group):
    from odc_core import engine_context

    assert engine_context("cpu").device == torch.device("cpu")


@pytest.mark.parametrize("ctx", ["cpu", torch.device("cpu")])
def test_a_device_given_as_make_engines_context_is_one_line(ctx, one_rank_group):
    """It failed in "'str' object has no attribute 'device'"."""
    with pytest.raises(TypeError, match=r"^make_engine's ctx is an EngineContext, got (str|device): for a device, "
                                        r"make_engine\('odc', engine_context\(device='cpu'\)\)$"):
        make_engine("odc", ctx)


@pytest.mark.parametrize("engine,options,said", [
    ("odc", dict(staleness=1.5), "engine.staleness must be an integer, got 1.5"),
    ("odc", dict(staleness=None), "engine.staleness must be an integer, got None"),
    ("odc", dict(prefetch="no"), "engine.prefetch must be true or false, got 'no'"),
    ("odc", dict(shard="nope"), "engine.shard must be one of full, hybrid, got 'nope'"),
    ("collective", dict(reshard_after_forward="x"), "engine.reshard_after_forward must be true or false, got 'x'"),
    ("collective", dict(backend="nope"), "engine.backend must be one of auto, shm, gloo, nccl, got 'nope'"),
])
def test_options_built_by_hand_hold_the_types_they_declare(engine, options, said):
    """A library caller builds the options itself: prefetch='no' ran with prefetch on, staleness=1.5
    and an unknown shard or backend ran as if valid, staleness=None failed in a TypeError."""
    from odc_core.engine.registry import engine_spec

    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        engine_spec(engine).options(**options)


def _wrapped(name: str, store: object) -> tuple[DataParallelEngine, Net]:
    """An engine that has wrapped a Net and configured SGD (closed, like the model, by the caller)."""
    model, engine = Net(), _engine(name, store)
    try:
        engine.wrap(model, list(model.layers))
        engine.configure_optimizer(partial(torch.optim.SGD, lr=0.1))
    except BaseException:
        engine.close()
        raise
    return engine, model


@pytest.mark.parametrize("engine_name", ["odc", "collective"])
@pytest.mark.parametrize("call", sorted(INSIDE))
def test_a_call_on_the_whole_state_inside_a_minibatch_is_one_line_and_the_minibatch_goes_on(call, engine_name,
                                                                                            one_rank_group, tmp_path):
    engine, model = _wrapped(engine_name, one_rank_group)
    try:
        saved = checkpoint.save(engine, tmp_path, 0)
        engine.begin_minibatch()
        _microbatch(model)
        started = time.monotonic()
        with pytest.raises(RuntimeError) as refused:
            INSIDE[call](engine, saved)
        assert time.monotonic() - started < 5, "refused at once, not after the engine's timeout"
        engine.finish_minibatch()
        assert set(engine.full_parameters()) == {n for n, _ in model.named_parameters()}
    finally:
        engine.close()
    assert str(refused.value) == f"{call}() while minibatch 0 is open: call it between minibatches, after " \
                                 f"finish_minibatch()"


@pytest.mark.parametrize("engine_name", ["odc", "collective"])
def test_a_call_on_the_whole_state_before_wrap_is_one_line(engine_name, one_rank_group, tmp_path):
    """ODC failed on a heap buffer wrap() allocates ("no buffer 'odc/flags' on this heap"), FSDP2's
    full_parameters() in a bare AssertionError, and drain() there returned."""
    engine, _ = _wrapped(engine_name, one_rank_group)
    try:
        saved = checkpoint.save(engine, tmp_path, 0)
    finally:
        engine.close()
    for call in sorted(INSIDE):
        engine = _engine(engine_name, one_rank_group)
        try:
            with pytest.raises(RuntimeError) as refused:
                INSIDE[call](engine, saved)
        finally:
            engine.close()
        assert str(refused.value) == f"{call}() before wrap(): the engine holds no model yet; call " \
                                     f"engine.wrap(model, units) first"


def _fully_sharded(model: Net) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in model.layers:
        fully_shard(layer)
    return fully_shard(model)


@pytest.mark.parametrize("engine_name", ["odc", "collective"])
@pytest.mark.parametrize("wrapped,said", [
    (nn.parallel.DistributedDataParallel, "the model is a DistributedDataParallel: the engine shards the model and "
                                          "sums its gradients itself; give it the module inside (.module), unwrapped"),
    (lambda model: nn.Sequential(nn.parallel.DistributedDataParallel(model)),
     "module 0 is a DistributedDataParallel: the engine shards"),
    (nn.DataParallel, "the model is a DataParallel: the engine shards"),
    (_fully_sharded, "parameter layers.0.weight is a DTensor (the model was sharded already, by fully_shard or tensor "
                     "parallelism): give the engine the model before fully_shard; it shards the model itself"),
    (lambda model: None, "wrap() takes the model, an nn.Module, and the list of its modules to shard by; got "
                         "NoneType"),
])
def test_a_model_another_data_parallel_wrapper_holds_is_refused_at_wrap(engine_name, wrapped, said, one_rank_group):
    """A model ported from a DDP or FSDP2 loop with its wrapper kept: FSDP2's sharded parameters
    failed both engines in a DTensor error ("Sharding propagation failed for aten.view"), and
    DDP's hooks all-reduced every backward, a collective ODC's uneven microbatch counts hang in.
    No model at all failed in an AttributeError."""
    model = Net()
    engine = _engine(engine_name, one_rank_group)
    try:
        with pytest.raises((ValueError, TypeError)) as refused:
            engine.wrap(wrapped(model), list(model.layers))
    finally:
        engine.close()
    assert str(refused.value).startswith(said) and "\n" not in str(refused.value)


class LazyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.last = nn.LazyLinear(4), nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(torch.tanh(self.first(x))).square().sum()


@pytest.mark.parametrize("engine_name", ["odc", "collective"])
def test_a_lazy_modules_parameters_are_refused_until_a_forward_shapes_them(engine_name, one_rank_group):
    """Before its first forward a LazyLinear's weight has no shape: both engines failed in torch's
    several-line error from their first numel(). After one, the model trains as in one process."""
    import copy

    from tests.helpers.reference import trains_like_one_process

    torch.manual_seed(0)
    engine = _engine(engine_name, one_rank_group)
    try:
        with pytest.raises(ValueError, match=r"^parameter first\.weight is uninitialized \(2 of the model's are: a "
                                             r"lazy module's, such as nn.LazyLinear's, shaped by its first forward\): "
                                             r"run the model once on a sample batch before wrap\(\)$"):
            engine.wrap(LazyNet(), [])
    finally:
        engine.close()
    model = LazyNet()
    model(torch.zeros(1, 5))
    reference = copy.deepcopy(model)
    engine = _engine(engine_name, one_rank_group)
    try:
        engine.wrap(model, [model.first, model.last])
        engine.configure_optimizer(lambda params: torch.optim.SGD(params, lr=0.1))
        trains_like_one_process(engine, model, reference, [torch.randn(3, 5) for _ in range(2)])
    finally:
        engine.close()


def _sgd(params: object) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1)  # type: ignore[arg-type]


# What a loop ported from FSDP2 passes where the engine takes a function or a state dict.
MISTAKEN: dict[str, tuple[Callable[[DataParallelEngine], object], str]] = {
    "an optimizer built already": (
        lambda engine: engine.configure_optimizer(torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1)),
        "configure_optimizer's factory is a function of the parameters it steps, which the engine calls (lambda "
        "params: torch.optim.AdamW(params, lr=...)); got SGD (built already, over other tensors)"),
    "no factory": (lambda engine: engine.configure_optimizer(None),  # type: ignore[arg-type]
                   "configure_optimizer's factory is a function of the parameters it steps"),
    "a schedule's number": (lambda engine: engine.configure_optimizer(_sgd, scheduler=3),  # type: ignore[arg-type]
                            "configure_optimizer's scheduler is a function of the optimizer it builds"),
    "a dict of group options": (
        lambda engine: engine.configure_optimizer(_sgd, param_groups={"weight_decay": 0.0}),  # type: ignore[arg-type]
        "configure_optimizer's param_groups is a function of a parameter's name and the parameter"),
    "full as text": (lambda engine: (engine.configure_optimizer(_sgd), get_state_dict(engine, full="no")),  # type: ignore[arg-type]
                     "get_state_dict's full is True or False, got 'no'"),
    "state dicts as lists": (lambda engine: (engine.configure_optimizer(_sgd), set_state_dict(engine, [], [])),  # type: ignore[arg-type]
                             "set_state_dict takes the model's and the optimizer's state dicts, as get_state_dict "
                             "returns them ({} for both on the ranks other than 0 with broadcast_from_rank0); got "
                             "list and list"),
}


@pytest.mark.parametrize("engine_name", ["odc", "collective"])
@pytest.mark.parametrize("case", sorted(MISTAKEN))
def test_an_argument_of_another_kind_is_one_line_naming_what_it_takes(case, engine_name, one_rank_group):
    """An optimizer built already was torch's "'SGD' object is not callable", a dict of group
    options "'dict' object is not callable", state dicts as lists "'list' object has no attribute
    'items'"; get_state_dict(full="no") gave whole tensors."""
    model = Net()
    engine = _engine(engine_name, one_rank_group)
    try:
        engine.wrap(model, list(model.layers))
        call, said = MISTAKEN[case]
        with pytest.raises(TypeError) as refused:
            call(engine)
    finally:
        engine.close()
    assert str(refused.value).startswith(said) and "\n" not in str(refused.value)


def test_an_evaluation_between_minibatches_with_reshard_after_forward_off_trains_like_one_process(one_rank_group):
    """FSDP2 keeps the unsharded parameters a forward without a backward gathered: the next
    begin_minibatch() refused them as parameters replaced since wrap(); gathered inside a
    minibatch after its backward, clipping missed the gradients and a forward after the step
    read the parameters before it."""
    import copy

    from odc_core import CollectiveOptions

    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    engine = make_engine("collective", EngineContext(torch.device("cpu"), one_rank_group, uuid.uuid4().hex[:8], 10.0,
                                                     "fp32"), CollectiveOptions(reshard_after_forward=False))
    inputs, probe = [torch.randn(3, 4) for _ in range(3)], torch.ones(1, 4)
    try:
        engine.wrap(model, list(model.layers))
        engine.configure_optimizer(partial(torch.optim.SGD, lr=0.1), max_grad_norm=0.5)
        evaluated, norms = [], []
        for x in inputs:
            engine.begin_minibatch()
            model(x).sum().backward()
            with torch.no_grad():
                model(x)  # old log-probs, say, inside the minibatch
            norms.append(engine.finish_minibatch())
            with torch.no_grad():
                evaluated.append(model(probe))
        got = engine.full_parameters()
    finally:
        engine.close()
    optimizer, expected, expected_norms = torch.optim.SGD(reference.parameters(), lr=0.1), [], []
    for x in inputs:
        optimizer.zero_grad()
        reference(x).sum().backward()
        expected_norms.append(float(torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)))
        optimizer.step()
        with torch.no_grad():
            expected.append(reference(probe))
    assert norms == pytest.approx(expected_norms)
    torch.testing.assert_close(evaluated, expected)
    for name, p in reference.named_parameters():
        torch.testing.assert_close(got[name], p.detach(), msg=name)


class _FailingStep(torch.optim.SGD):
    """An optimizer whose step raises, as SparseAdam's does on dense gradients."""

    def step(self, closure=None):  # type: ignore[override]
        raise RuntimeError("the step failed")


@pytest.mark.parametrize("engine_name", ["odc", "collective"])
def test_a_failed_step_the_loop_caught_leaves_close_to_end_at_once(engine_name, one_rank_group):
    """A loop that catches a failed minibatch and closes the engine in its `finally`: ODC's close()
    drained, waiting out timeout_s for this rank's own step, then raised PeerTimeout naming it."""
    model = Net()
    engine = _engine(engine_name, one_rank_group)
    try:
        engine.wrap(model, list(model.layers))
        engine.configure_optimizer(partial(_FailingStep, lr=0.1))
        engine.begin_minibatch()
        _microbatch(model)
        with pytest.raises(RuntimeError, match="the step failed"):
            engine.finish_minibatch()
        if engine_name == "odc":  # its peers wait for the step it could not apply
            with pytest.raises(RuntimeError, match=r"^begin_minibatch\(\) after minibatch 0 failed \(RuntimeError: "
                                                   r"the step failed\): the engine cannot go on from it; close\(\) "
                                                   r"it and resume from a checkpoint$"):
                engine.begin_minibatch()
    finally:
        engine.close()


def _close_after_a_failed_drain(rank: int, world: int, store: object) -> str:
    import torch.distributed as dist

    from odc_core.engine.registry import OdcOptions

    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world)
    engine = make_engine("odc", EngineContext(torch.device("cpu"), store, "drained", 2.0, "fp32"),
                         OdcOptions(staleness=1))
    said = ""
    try:
        model = Net()
        engine.wrap(model, list(model.layers))
        engine.configure_optimizer(partial(torch.optim.SGD, lr=0.1))
        if rank == 0:  # rank 1 never finishes its minibatch: the drain times out, and the loop catches it
            engine.begin_minibatch()
            _microbatch(model)
            engine.finish_minibatch()
            with pytest.raises(TimeoutError):
                engine.drain()
            try:
                engine.close()
            except Exception as e:  # before: the close drained again, and timed out again
                said = f"close() raised {type(e).__name__}: {e}"
            store.set("closed", "1")  # type: ignore[attr-defined]
        else:
            store.wait(["closed"])  # type: ignore[attr-defined]
        return said
    finally:
        engine.close()
        dist.destroy_process_group()


def test_a_drain_that_timed_out_and_was_caught_leaves_close_to_end_at_once():
    from odc_bench.run.ranks import run_ranks

    assert run_ranks(_close_after_a_failed_drain, 2, timeout_s=60)[0] == ""


@pytest.mark.parametrize("first", ["the model under inference_mode", "a unit"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("engine_name", ["odc", "collective"])
def test_a_first_forward_under_inference_mode_or_of_a_unit_runs_and_training_goes_on(engine_name, precision, first,
                                                                                      one_rank_group):
    """An evaluation or an RL rollout under torch.inference_mode() before any training: FSDP2
    made the buffers it gathers into there, as inference tensors, and failed then and in every
    later gather ("Inference tensors do not track version counter"). A unit called before the
    model (an embedding looked up first): FSDP2 took it for the root, and the model's first
    forward failed in "FSDP state has already been lazily initialized for layers.0"."""
    import copy

    from tests.helpers.reference import trains_like_one_process

    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    engine = make_engine(engine_name, EngineContext(torch.device("cpu"), one_rank_group, uuid.uuid4().hex[:8], 30.0,
                                                    precision))
    try:
        engine.wrap(model, list(model.layers))
        engine.configure_optimizer(partial(torch.optim.SGD, lr=0.1))
        with torch.inference_mode(first != "a unit"):
            got = model(torch.ones(2, 4)) if first != "a unit" else model.layers[0](torch.ones(2, 4))
        want = reference(torch.ones(2, 4)) if first != "a unit" else reference.layers[0](torch.ones(2, 4))
        torch.testing.assert_close(got.float(), want, rtol=0.02 if precision == "bf16" else 1e-6, atol=0.02)
        if precision == "fp32":
            trains_like_one_process(engine, model, reference, [torch.randn(2, 4) for _ in range(2)])
        else:
            _microbatch(model)  # a bf16 minibatch runs
    finally:
        engine.close()
