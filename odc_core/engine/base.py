"""The interface both data-parallel engines implement, and what every engine is built from.

The worker loop is written once against this protocol. Between begin_minibatch() and
finish_minibatch() it only runs forward and backward through the wrapped model: whatever
communication an engine needs happens inside its hooks, so the collective engine may
synchronise per layer while the on-demand engine synchronises once, in finish_minibatch().

The engine owns the optimizer step: finish_minibatch() applies it, or hands it to the
parameters' owners, who apply it when every rank's gradients have arrived (stale-synchronous
ODC, where no rank waits for the step at its own minibatch boundary). drain() is the run's
last synchronisation: after it every step is applied everywhere.
"""

from __future__ import annotations

import collections
import itertools
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

# (kind, t0, t1, info) -> None: engines report their communication and waits through it; t0
# and t1 are marks of the engine's clock.
TraceHook = Callable[..., None]
# What marks a span's ends: time.perf_counter (seconds on the host), or a clock whose marks the
# trace resolves later (the harness's device clock on CUDA: an event on the compute stream).
Clock = Callable[[], Any]
# The user's optimizer, built over what a rank steps (FSDP2's DTensor shards, or ODC's runs of
# its flat fp32 shards): a list of parameters, or with param_groups torch-style group dicts,
# [{"params": [...], **options}, ...]; any torch.optim optimizer takes either.
OptimizerFactory = Callable[[list[Any]], torch.optim.Optimizer]
# (name, parameter) -> the options of the parameter's optimizer group, {} for the optimizer's
# defaults: any option the optimizer takes ("weight_decay", "lr", ...), and "lr_scale", which
# multiplies the group's learning rate once the optimizer is built (so its schedule scales too).
ParamGroups = Callable[[str, nn.Parameter], dict[str, Any]]
# A learning-rate schedule over that optimizer, stepped once per optimizer step.
SchedulerFactory = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class MixedPrecision:
    """The dtypes an engine computes and reduces in, FSDP2's MixedPrecisionPolicy's two, for
    both engines; parameters and optimizer state stay fp32 on their owners either way.

    param_dtype: what forward and backward compute in, and so the gradients each rank produces
    (ODC: the dtype it gathers, from shards of that dtype kept beside the fp32 masters).
    reduce_dtype: what the ranks' gradients are summed in (ODC: its accumulators' dtype, which
    not every transport can add in; FSDP2: its reduce-scatter's) before the fp32 step.
    """

    param_dtype: torch.dtype = torch.float32
    reduce_dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        for field in ("param_dtype", "reduce_dtype"):
            if getattr(self, field) not in _FLOATS:
                raise ValueError(f"MixedPrecision.{field} must be one of torch.float32, torch.bfloat16, "
                                 f"torch.float16; got {getattr(self, field)!r}")

    @classmethod
    def of(cls, precision: str | MixedPrecision) -> MixedPrecision:
        """A policy itself, or by name: fp32, or bf16 (bf16 compute, fp32 reduction)."""
        if isinstance(precision, MixedPrecision):
            return precision
        if precision == "fp32":
            return cls()
        if precision == "bf16":
            return cls(torch.bfloat16, torch.float32)
        raise ValueError(f"precision must be fp32, bf16 or an odc_core.MixedPrecision, got {precision!r}")


JOB_ID_LIMIT = 128
# Engines made in this process, by their context's job id (EngineContext.own_job).
_ENGINES: dict[str, itertools.count] = collections.defaultdict(itertools.count)


@dataclass(frozen=True)
class EngineContext:
    """Where an engine runs and how it reaches its peers; torch.distributed is initialised."""

    device: torch.device
    store: dist.Store
    # Unique per execution of a run: names the run's shared-memory segments.
    job_id: str
    timeout_s: float
    # fp32, bf16 (bf16 compute, fp32 master weights and gradient reduction), or a MixedPrecision.
    precision: str | MixedPrecision

    def __post_init__(self) -> None:
        # The id goes into every shared-memory segment's file name, which the OS caps at 255 bytes
        # with the rank, pid and buffer beside it: a longer one failed in the first allocation,
        # "File name too long".
        if not isinstance(self.job_id, str):
            raise TypeError(f"EngineContext's job_id must be a str, got {type(self.job_id).__name__} {self.job_id!r}")
        if len(self.job_id.encode()) > JOB_ID_LIMIT:
            raise ValueError(f"EngineContext's job_id names the engine's shared memory and holds up to {JOB_ID_LIMIT} "
                             f"bytes, got {len(self.job_id.encode())} ({self.job_id[:40]!r}...); give a shorter id, or "
                             f"let engine_context() make one")

    @property
    def policy(self) -> MixedPrecision:
        return MixedPrecision.of(self.precision)

    def own_job(self) -> tuple[str, dist.Store]:
        """The job id and store of the next engine made from this context: its own. The first
        engine of a context takes its job id; each after it (an RL policy's reference model)
        `<job>.e<n>` and a store prefixed apart, named as process groups' derived ids are
        (`<job>.pg<n>`: a sweep of the job's segments covers it), where the second engine made
        segments and shared-memory groups of the first one's names and failed in FileExistsError.
        Every rank makes its engines in one order, so the ids agree."""
        serial = next(_ENGINES[self.job_id])
        if serial == 0:
            return self.job_id, self.store
        return f"{self.job_id}.e{serial}", dist.PrefixStore(f"e{serial}", self.store)


class DataParallelEngine(Protocol):
    name: str
    # Factor the worker applies to its globally normalised loss so that the engine's
    # reduction yields the plain sum of per-rank gradients (FSDP2 averages over ranks).
    loss_scale: float
    trace: TraceHook | None
    # Marks the ends of the spans it reports through `trace` (time.perf_counter by default).
    clock: Clock

    @property
    def heap_bytes(self) -> int:
        """Shared or symmetric memory this rank owns for communication (counted once, at its owner)."""
        ...

    def wrap(self, model: nn.Module, units: Sequence[nn.Module]) -> nn.Module: ...

    def configure_optimizer(self, factory: OptimizerFactory, *, scheduler: SchedulerFactory | None = None,
                            max_grad_norm: float | None = None, param_groups: ParamGroups | None = None) -> None:
        """Build the optimizer over the parameters this rank steps (`factory(params)`, any
        torch.optim optimizer) and its schedule; the engine applies both, after scaling the
        minibatch's gradients down to a global norm of `max_grad_norm` when it is given. With
        `param_groups`, factory gets one group dict per distinct options, in the order of their
        first parameter in model.named_parameters() (the same groups on every rank)."""
        ...

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer configure_optimizer() built (its state is sharded like the parameters)."""
        ...

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler | None:
        """The LR schedule configure_optimizer() built, stepped after every optimizer step (None
        without one); odc_core.checkpoint saves and loads its state with the optimizer's."""
        ...

    def begin_minibatch(self) -> None: ...

    def finish_minibatch(self) -> float | None:
        """This rank's part of the minibatch is done: its gradients reach their owners and the
        minibatch's optimizer step is applied (or, stale-synchronous, handed to the owners).
        Returns the minibatch's global gradient norm before clipping when the engine clips
        (configure_optimizer's max_grad_norm; pass float("inf") for the norm alone, as with
        torch's clip_grad_norm_), else None. Reports "sync" and "optimizer" spans through `trace`."""
        ...

    def drain(self) -> None:
        """Return once every owner has applied the step of every minibatch begun so far."""
        ...

    def claim(self) -> int:
        """Atomically take the next ticket of a counter shared by all ranks (run-time
        balancing); only engines whose ranks may run different microbatch counts have one."""
        ...

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Unsharded copies of every parameter, fp32 (float64 and complex ones in their dtype); may
        communicate, so call between minibatches."""
        ...

    def sharded_state(self, for_load: bool = False, optimizer: bool = True) -> dict[str, Any]:
        """{"model": ..., "optim": ...} as DCP's get_state_dict lays them out for FSDP2, this
        rank's shards; with for_load, views that a DCP load fills (odc_core/checkpoint.py). No
        "optim" without `optimizer` (a load of the model alone) or without an optimizer configured
        (a reference model's engine); a fresh optimizer is then left without state."""
        ...

    def load_sharded_state(self, state: dict[str, Any]) -> None:
        """Apply what a DCP load left in sharded_state(for_load=True)'s dict."""
        ...

    def state_dict(self, full: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
        """(model, optimizer) state dicts as torch's get_state_dict gives FSDP2's: this rank's
        shards, or with `full` every tensor whole on every rank; collective (odc_core/state.py)."""
        ...

    def load_state_dict(self, model_state_dict: dict[str, Any], optim_state_dict: dict[str, Any], *,
                        broadcast_from_rank0: bool = False) -> None:
        """Load state dicts as torch's set_state_dict does, full or sharded (or full on rank 0 only,
        broadcast_from_rank0); collective, between minibatches."""
        ...

    def between_minibatches(self, call: str) -> None:
        """A one-line RuntimeError naming `call` when a minibatch is open or the engine is closed:
        what reads or loads the whole state (drain, full_parameters, the state dicts, checkpoint
        save and load) waits on ODC for every step begun, the open minibatch's too, which never
        comes, and on FSDP2 would read a state between two steps' gradients."""
        ...

    def close(self) -> None: ...


def check_factories(factory: object, scheduler: object, param_groups: object) -> None:
    """configure_optimizer's arguments are functions: TypeError, in one line, for what a loop
    ported from FSDP2 passes in their place (an optimizer or LR schedule built already, a dict of
    options), where it was torch's "'SGD' object is not callable"."""
    wanted = (("factory", factory, "the parameters it steps", "lambda params: torch.optim.AdamW(params, lr=...)"),
              ("scheduler", scheduler, "the optimizer it builds",
               "lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, ...)"),
              ("param_groups", param_groups, "a parameter's name and the parameter",
               "lambda name, p: {'weight_decay': 0.0} if p.dim() < 2 else {}"))
    for what, given, argument, example in wanted:
        if not callable(given) and (given is not None or what == "factory"):
            built = " (built already, over other tensors)" if isinstance(
                given, torch.optim.Optimizer | torch.optim.lr_scheduler.LRScheduler) else ""
            raise TypeError(f"configure_optimizer's {what} is a function of {argument}, which the engine calls "
                            f"({example}); got {type(given).__name__}{built}")


def optimizer_state_problem(optim_sd: Mapping[str, Any]) -> str | None:
    """What set_state_dict cannot load in an optimizer state dict, in one line; None where it can.
    {} is the model alone. torch's optimizer.state_dict() keys parameters by their index: the
    collective engine failed on it in a KeyError, and ODC found no state under the names and
    started every moment at zero, without a word."""
    if not optim_sd:
        return None
    missing = [key for key in ("state", "param_groups") if key not in optim_sd]
    if missing:
        held = ", ".join(map(repr, optim_sd))
        return (f"the optimizer state dict has no {missing[0]!r} (it holds {held}): pass get_state_dict's second "
                f"dict, or {{}} to load the model alone")
    state, groups = optim_sd["state"], optim_sd["param_groups"]
    if not isinstance(state, Mapping) or not isinstance(groups, list | tuple) or not all(
            isinstance(g, Mapping) and isinstance(g.get("params"), list | tuple) for g in groups):
        return ("the optimizer state dict's 'state' is not a dict of each parameter's state, or its 'param_groups' not "
                "a list of groups with their 'params': pass get_state_dict's second dict")
    keys = [*state, *(p for g in groups for p in g["params"])]
    if not all(isinstance(k, str) for k in keys):
        index = next(k for k in keys if not isinstance(k, str))
        return (f"the optimizer state dict names a parameter by {type(index).__name__} {index!r}, as torch's "
                f"optimizer.state_dict() keys them by index, and the engines by name: pass get_state_dict(engine)'s, "
                f"or torch.distributed.checkpoint.state_dict.get_state_dict(model, optimizer)'s for a model in one "
                f"process")
    return None


def check_state_keys(groups: Sequence[Sequence[str]], given: Collection[str]) -> None:
    """A ValueError, one line, where a model state dict's keys (`given`) are not the model's:
    `groups` holds each tensor's names (tied weights have several, of which one will do). Before
    anything loads: FSDP2's full load took a dict lacking a key without a word, leaving that
    tensor as it was, and refused an unexpected one in torch's lines."""
    names = {name for group in groups for name in group}
    unexpected = [key for key in given if key not in names]
    missing = [group[0] for group in groups if not any(name in given for name in group)]
    for keys, said in ((unexpected, "has {}{}, which the model has not; " + _prefix_hint(given, names)),
                       (missing, "has no {}{}; load a whole state dict of this model (to keep some weights as "
                                 "they are, load the others into the model before wrap(), with "
                                 "load_state_dict(strict=False))")):
        if keys:
            more = f" (and {len(keys) - 1} more)" if len(keys) > 1 else ""
            raise ValueError("the model state dict " + said.format(repr(keys[0]), more))


def _prefix_hint(given: Collection[str], names: Collection[str]) -> str:
    """What to do with a state dict whose keys are not the model's: where they are all the
    model's behind one prefix (torch.compile's wrapper saves `_orig_mod.`, DDP `module.`), or all
    the model's without one (a state dict of an inner module), say which."""
    first = next(iter(given), "")
    head = first.split(".", 1)[0] + "."
    if "." in first and all(key.startswith(head) and key[len(head):] in names for key in given):
        return f"its keys are the model's behind the prefix {head!r} (torch.compile's wrapper adds '_orig_mod.', " \
               f"DDP 'module.'): strip it from every key"
    heads = {name.split(".", 1)[0] + "." for name in names if "." in name}
    added = next((h for h in sorted(heads) if all(h + key in names for key in given)), None)
    if given and added is not None:
        return f"its keys are the model's without the prefix {added!r} (a state dict of module " \
               f"{added[:-1]}): add it to every key"
    return "load a state dict of this model"


def check_state_shape(what: str, given: object, shape: tuple[int, ...]) -> None:
    """A ValueError, one line, where a state dict's `given` (a tensor of any kind) is not of the
    model's `shape`: ODC's shards would take a slice of a larger tensor, and FSDP2 refused it in
    torch's lines."""
    held = tuple(given.size()) if isinstance(given, torch.Tensor) else None
    if held != shape:
        said = f"a tensor of shape {held}" if held is not None else f"a {type(given).__name__}"
        raise ValueError(f"{what}: the state dict holds {said} where the model's has shape {shape}; load a state dict "
                         f"of this model")


def check_optimizer_state(optim_sd: Mapping[str, Any]) -> None:
    """A ValueError, one line, where set_state_dict cannot load `optim_sd` (optimizer_state_problem;
    with broadcast_from_rank0, rank 0's is checked on every rank instead: rank0.py)."""
    if (problem := optimizer_state_problem(optim_sd)) is not None:
        raise ValueError(problem)


@dataclass
class OptimizerStep:
    """The user's optimizer as an engine applies it, the same in every engine: clip by the global
    norm (each engine says how it computes that norm), step, drop the gradients, advance the
    schedule."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    max_grad_norm: float | None

    @classmethod
    def build(cls, params: list[Any], factory: OptimizerFactory, scheduler: SchedulerFactory | None,
              max_grad_norm: float | None) -> OptimizerStep:
        """`params`: a list of parameters, or group dicts (group_options' groups with their params)."""
        if max_grad_norm is not None and (isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, Real)
                                          or not max_grad_norm > 0):
            raise ValueError(f"max_grad_norm must be a number > 0 or None, got {max_grad_norm!r}")
        optimizer = factory(params)
        if not isinstance(optimizer, torch.optim.Optimizer):  # a factory without its return: None
            raise TypeError(f"the optimizer factory returned {type(optimizer).__name__}, not a torch.optim optimizer: "
                            f"return the one it builds over its argument, lambda params: torch.optim.AdamW(params)")
        mine = {id(p) for g in params for p in (g["params"] if isinstance(g, dict) else [g])}
        foreign = sum(id(p) not in mine for g in optimizer.param_groups for p in g["params"])
        if foreign:
            # Such an optimizer steps tensors no engine reads: on ODC the model's own parameters are
            # views of freed buffers, and training changed nothing, without a word.
            raise ValueError(f"the optimizer factory built {type(optimizer).__name__} over {foreign} tensors it was "
                             f"not given; build it over its argument, configure_optimizer(lambda params: "
                             f"torch.optim.AdamW(params)), not model.parameters(): the engine steps the parameters "
                             f"it gives the factory")
        given = [g for g in params if isinstance(g, dict)]
        for group, options in zip(optimizer.param_groups, given, strict=False):
            unknown = sorted(set(options) - set(optimizer.defaults) - {"params", "lr_scale"})
            if unknown:
                raise ValueError(f"param_groups gave option {unknown[0]!r}, which {type(optimizer).__name__} does not "
                                 f"take; its options are {', '.join(sorted(optimizer.defaults))} (and lr_scale)")
            if "lr_scale" in options:
                group["lr"] = group["lr"] * options["lr_scale"]
        schedule = scheduler(optimizer) if scheduler is not None else None
        if scheduler is not None and not callable(getattr(schedule, "step", None)):
            # None (a factory without its return) trained on at the first rate without a word
            raise TypeError(f"the scheduler factory returned {type(schedule).__name__}, not an LR scheduler: return "
                            f"the one it builds over its argument, lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, "
                            f"...), or leave scheduler unset")
        if isinstance(schedule, torch.optim.lr_scheduler.ReduceLROnPlateau):
            # The engine steps the schedule after every optimizer step, with no argument: this one
            # wants the metric it watches, and failed there after the step it followed was taken.
            raise ValueError("ReduceLROnPlateau steps on a metric the engine does not have: leave scheduler unset "
                             "and call its step(metric) yourself after finish_minibatch(), built on engine.optimizer")
        return cls(optimizer, schedule, max_grad_norm)

    def apply(self, clip: Callable[[float], float]) -> float | None:
        """One step; the global gradient norm before clipping when it clips, else None."""
        norm = clip(self.max_grad_norm) if self.max_grad_norm is not None else None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        return norm


def group_options(named: Sequence[tuple[str, nn.Parameter]],
                  rule: ParamGroups) -> list[tuple[dict[str, Any], list[str]]]:
    """The parameters grouped by the options `rule` gives them: (options, names) per group, in
    the order of each group's first parameter."""
    groups: list[tuple[dict[str, Any], list[str]]] = []
    for name, p in named:
        options = rule(name, p)
        if not isinstance(options, dict) or "params" in options:
            raise ValueError(f"param_groups({name!r}, ...) must return a dict of optimizer options without "
                             f"'params', got {options!r}")
        scale = options.get("lr_scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise ValueError(f"param_groups({name!r}, ...) gave lr_scale {scale!r}; it must be a number > 0")
        for known, names in groups:
            if known == options:
                names.append(name)
                break
        else:
            groups.append((dict(options), [name]))
    return groups


def check_order(call: str, open_minibatch: int | None, closed: bool, wrapped: bool = True) -> None:
    """A one-line error for a protocol call out of order: the engine closed, `begin_minibatch`
    while a minibatch is open, `finish_minibatch` while none is (an ODC rank would wait for a
    version no owner will publish; FSDP2 would step on whatever gradients there are), any other
    call while one is open (between_minibatches), or before wrap() (ODC failed on a heap buffer
    wrap() allocates, "no buffer 'odc/flags'", FSDP2 in a bare assertion)."""
    if closed:
        raise RuntimeError(f"{call}() after close(): the engine freed its shards; make another engine")
    if not wrapped:
        raise RuntimeError(f"{call}() before wrap(): the engine holds no model yet; call engine.wrap(model, units) "
                           f"first")
    if call == "begin_minibatch" and open_minibatch is not None:
        raise RuntimeError(f"begin_minibatch() while minibatch {open_minibatch} is open: call finish_minibatch() "
                           f"first")
    if call == "finish_minibatch" and open_minibatch is None:
        raise RuntimeError("finish_minibatch() with no minibatch open: call begin_minibatch() before its "
                           "microbatches")
    if call not in ("begin_minibatch", "finish_minibatch") and open_minibatch is not None:
        raise RuntimeError(f"{call}() while minibatch {open_minibatch} is open: call it between minibatches, after "
                           f"finish_minibatch()")


# What an ODC engine leaves in its parameters between uses: NaN, seen through a view of each
# parameter's shape (stride 0, no memory) of the parameter's own element of a small buffer per
# unit. Reading such a parameter gives NaN where a view of the freed flat buffer would read freed
# memory and could crash. A write to it (torch refuses most through a stride-0 view; fill_ and
# nn.init's zeros_, ones_ and constant_ are not refused) lands in that element, where the ODC
# engine finds it. The buffers by their storage's address, for as long as a placeholder views
# one (a view keeps its base alive); then the address may go to any other tensor.
_PLACEHOLDERS: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()


def placeholders(count: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`count` NaNs: element j, expanded to a parameter's shape, is parameter j's placeholder."""
    buffer = torch.full((max(1, count),), float("nan"), dtype=dtype, device=device)
    _PLACEHOLDERS[buffer.untyped_storage().data_ptr()] = buffer
    return buffer


def is_absent(t: torch.Tensor) -> bool:
    """Whether t is a placeholder (a parameter an ODC engine holds in its shards)."""
    return t.untyped_storage().data_ptr() in _PLACEHOLDERS


def check_wrap(model: nn.Module, wrapped: nn.Module | None) -> None:
    """One model per engine, wrapped once; not inside another data-parallel wrapper (DP, DDP, FSDP)
    nor sharded already (DTensor parameters); its parameters initialized (not a lazy module's
    before its first forward); and not a model an ODC engine holds already (its parameters placeholders
    or views of a freed buffer: their values are in its shards)."""
    if wrapped is not None:
        raise RuntimeError("wrap() was called already: an engine shards one model, once; make another engine for "
                           "another model")
    if not isinstance(model, nn.Module):  # None failed in "'NoneType' object has no attribute 'named_modules'"
        raise TypeError(f"wrap() takes the model, an nn.Module, and the list of its modules to shard by; got "
                        f"{type(model).__name__}")
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    wrapper = next(((n, m) for n, m in model.named_modules()
                    if isinstance(m, nn.DataParallel | nn.parallel.DistributedDataParallel | FullyShardedDataParallel)),
                   None)
    if wrapper is not None:  # its own gradient hooks would reduce every backward, a collective of all ranks
        where = f"the model is a {type(wrapper[1]).__name__}" if not wrapper[0] else \
            f"module {wrapper[0]} is a {type(wrapper[1]).__name__}"
        raise ValueError(f"{where}: the engine shards the model and sums its gradients itself; give it the module "
                         f"inside (.module), unwrapped")
    renorm = next(((n, m) for n, m in model.named_modules()
                   if isinstance(m, nn.Embedding | nn.EmbeddingBag) and m.max_norm is not None), None)
    if renorm is not None:  # both engines computed with the renormalized rows, then dropped them without a word
        raise ValueError(f"module {renorm[0] or '(the model)'} ({type(renorm[1]).__name__}) has max_norm="
                         f"{renorm[1].max_norm}: it renormalizes the rows it looks up in place in each forward, a "
                         f"write to the gathered copy of its weight that the engine's shards never see, so the "
                         f"write would be lost; build it with max_norm=None")
    sharded = [n for n, p in model.named_parameters() if isinstance(p, DTensor)]
    if sharded or any(isinstance(m, FSDPModule) for m in model.modules()):
        what = f"parameter {sharded[0]} is a DTensor" if sharded else "the model holds a module fully_shard wrapped"
        raise ValueError(f"{what} (the model was sharded already, by fully_shard or tensor parallelism): give the "
                         f"engine the model before fully_shard; it shards the model itself")
    lazy = [n for n, p in model.named_parameters() if nn.parameter.is_lazy(p)]
    if lazy:  # torch's own error came from the first numel() either engine took, over several lines
        raise ValueError(f"parameter {lazy[0]} is uninitialized ({len(lazy)} of the model's are: a lazy module's, such "
                         f"as nn.LazyLinear's, shaped by its first forward): run the model once on a sample batch "
                         f"before wrap()")
    held = [n for n, p in model.named_parameters()
            if type(p.data) is torch.Tensor and p.numel() and (is_absent(p) or not p.untyped_storage().nbytes())]
    if held:
        raise ValueError(f"parameter {held[0]} holds no values (an ODC engine keeps them in its shards): the model is "
                         f"wrapped by another engine already, or was by one that close() ended, which freed them; "
                         f"wrap a model once, and to train on after close(), take the weights before it "
                         f"(odc_core.get_state_dict(engine, full=True)) and load them into a new model")


def parameter_ids(model: nn.Module) -> dict[str, tuple[int, torch.dtype]]:
    """The parameters an engine took at wrap(), by name, with the dtypes it left them in (ODC's:
    the compute dtype), as check_parameters compares them."""
    return {name: (id(p), p.dtype) for name, p in model.named_parameters()}


def check_parameters(model: nn.Module | None, wrapped: dict[str, tuple[int, torch.dtype]]) -> None:
    """The model's parameters are still those wrap() sharded, in the dtypes it left them. Added or
    replaced since, a parameter is one no engine holds: nothing sums its gradient over ranks or
    steps it (ODC), or it meets FSDP2's DTensors in a storage or type error mid-step; removed, the
    state dicts miss it. Cast since (model.to(torch.bfloat16)), ODC's gathers still gave the
    dtype it sharded, meeting inputs cast to the new one, and FSDP2 stepped bf16 masters or, cast
    to float64, trained on in float32 without a word."""
    if model is None:
        return
    now = dict(model.named_parameters())
    for name, p in now.items():
        if name not in wrapped:
            raise RuntimeError(f"parameter {name} was added to the model after wrap(): the engine shards, sums and "
                               f"steps the parameters wrap() found; add it before wrap()")
        if id(p) != wrapped[name][0]:
            raise RuntimeError(f"parameter {name} was replaced after wrap() (a new nn.Parameter assigned to its "
                               f"module, as resize_token_embeddings does): the engine holds the one wrap() found; "
                               f"change the model before wrap(), and load values with set_state_dict(engine, ...)")
        if p.dtype != wrapped[name][1]:
            raise RuntimeError(f"parameter {name} is {p.dtype} now, {wrapped[name][1]} as wrap() left it (the model "
                               f"was cast since, model.to(dtype)): the engine keeps the dtypes of wrap(); cast the "
                               f"model before wrap(), or compute in another dtype with engine_context(precision=...)")
    gone = [name for name in wrapped if name not in now]
    if gone:
        raise RuntimeError(f"parameter {gone[0]} was removed from the model after wrap(); change the model before "
                           f"wrap()")


def configured(step: OptimizerStep | None, call: str) -> OptimizerStep:
    """The optimizer step configure_optimizer() built; RuntimeError naming `call` before it."""
    if step is None:
        raise RuntimeError(f"{call} before configure_optimizer(): the engine steps each minibatch with the optimizer "
                           f"configure_optimizer(factory) builds; call it first")
    return step


def reduction_device(device: torch.device) -> torch.device:
    """Where a small reduction over the default group runs: on the host where the group can (gloo
    or MPI beside NCCL: GPU ranks may share one device, where NCCL cannot run), else on `device`."""
    return torch.device("cpu") if any(name in str(dist.get_backend()) for name in ("gloo", "mpi")) else device


def refuse_written_in_place(name: str, engine: str) -> None:
    """A RuntimeError, one line, for a parameter written in place between its unit's gather and
    the freeing of its gathered copy: the write is lost with the copy, where in one process it
    would stay in the weight."""
    raise RuntimeError(f"parameter {name} was written in place while gathered for a forward or backward "
                       f"(nn.Embedding's max_norm renormalizes its rows so; so does arithmetic on a weight under "
                       f"torch.no_grad()): {engine} computes with a copy of the shards, gathered for each unit's "
                       f"forward and backward and freed after, so the write would be lost; build the module without "
                       f"it, or compute the change out of place")


def refuse_create_graph(where: str, engine: str) -> None:
    """A RuntimeError, one line, for a backward with create_graph=True through a wrapped unit
    (seen in a hook as grad mode on inside backward): a second backward through the gradients'
    graph reads parameters the engine has freed, and ODC's flat gradient misses what autograd
    then accumulates out of place. FSDP2 without a second backward is refused too: the graph is
    then of no use, and the line is the same on both engines."""
    raise RuntimeError(f"a backward with create_graph=True (a gradient penalty, a Hessian-vector product) reached "
                       f"{where}: {engine} frees a unit's gathered parameters once its backward is over, so no "
                       f"second backward can go through the graph of its gradients; compute such terms through "
                       f"parameters no engine wraps or in one process, or leave create_graph off")
