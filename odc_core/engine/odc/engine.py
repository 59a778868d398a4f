"""On-demand communication (ODC): FSDP's sharded layout without per-layer collectives.

Each unit's parameters live as one flat vector split into equal shards, one per rank, in the
symmetric heap (unit.py). A rank gathers a unit's full parameters from the owners just before
the unit's forward and again before its backward (one-sided gets; owners do nothing), and
right after the unit's backward pushes each gradient slice into its owner's fp32 accumulator
(one-sided adds) (fetch.py, driven by hooks.py). Nothing in between waits for another rank's
progress, so ranks may run different numbers of microbatches; the one synchronisation per
minibatch, or none with staleness, is versions.py's. The engine composes them, as FSDP2's
fully_shard composes its state, parameter groups and collectives.

Hybrid sharding (shard_group G < world size; the paper's section 6.1): a node is G
consecutive ranks, each unit is sharded over its node's ranks, and every node holds a
replica. Gathers, pushes and every flag a rank waits on stay within its node. At the
minibatch barrier each owner's accumulated shard is summed with the same shard on the other
nodes (the replicas: the ranks with the same index in their node), and every replica applies
the same AdamW step to the same sum, so the replicas stay equal without ever being compared.
"""

from __future__ import annotations

import functools
import math
import sys
import warnings
from collections.abc import Callable, Sequence
from datetime import timedelta
from time import perf_counter
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from odc_core.engine.agreement import (
    OPTIMIZER_FIX,
    STATE_FIX,
    check_ranks_agree,
    description,
    optimizer_description,
    precision_name,
    state_description,
    warn_if_values_differ,
)
from odc_core.engine.base import (
    Clock,
    EngineContext,
    MixedPrecision,
    OptimizerFactory,
    OptimizerStep,
    ParamGroups,
    SchedulerFactory,
    TraceHook,
    check_factories,
    check_optimizer_state,
    check_order,
    check_parameters,
    check_wrap,
    configured,
    group_options,
    parameter_ids,
)
from odc_core.engine.closing import peer_closed, tell_peers
from odc_core.engine.odc import state_dict
from odc_core.engine.odc.fetch import make_fetcher
from odc_core.engine.odc.hooks import UnitHooks
from odc_core.engine.odc.unit import Backward, FlatUnit, Storage, flat_groups, shard_unit
from odc_core.engine.odc.versions import Versions
from odc_core.engine.outputs import unit_labels
from odc_core.engine.rank0 import skeleton_from_rank0
from odc_core.engine.registry import OdcOptions, shard_group_size
from odc_core.engine.sharing import check_units
from odc_core.liveness import one_line
from odc_core.transport.base import PeerTimeout, SymmetricHeap
from odc_core.transport.registry import TRANSPORTS, make_heap

_Call = TypeVar("_Call", bound=Callable[..., Any])


def _collective(method: _Call) -> _Call:
    """A call every rank must make: where a peer never makes it, the timeout names the call, not
    only the barrier it waited at."""
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except PeerTimeout as e:
            raise PeerTimeout(e.peer, f"{e.what}, in {method.__name__}(), which every rank must call",
                              e.timeout_s) from None
    return call  # type: ignore[return-value]


# torch's optimizers whose update of an element depends on more than that element's own state:
# on ODC's flat shards Adafactor's factored moments would silently be a 1-D vector's, and L-BFGS
# would fail in its first step for want of a closure. (Muon refuses 1-D parameters itself.)
_WHOLE_PARAMETER_WHY = {"Adafactor": "its second moments factored over the rows and columns of each matrix",
                        "LBFGS": "a closure that re-evaluates the whole model"}
_WHOLE_PARAMETER = tuple(cls for cls in (getattr(torch.optim, name, None) for name in _WHOLE_PARAMETER_WHY)
                         if isinstance(cls, type))


# The calls between minibatches that read the parameters, and those that load them (a write
# before a load is overwritten by it, as in one process).
_READS = frozenset({"full_parameters", "sharded_state", "state_dict", "get_state_dict", "checkpoint.save"})
_LOADS = frozenset({"load_sharded_state", "load_state_dict", "set_state_dict", "checkpoint.load"})


class NoBackwardWarning(UserWarning):
    """A rank of a multi-rank ODC run ran a forward in a minibatch and no backward (engine.py)."""


class OdcEngine:
    name = "odc"
    loss_scale = 1.0  # gradients are summed into the owners' accumulators, not averaged

    def __init__(self, device: torch.device, heap: SymmetricHeap, precision: str | MixedPrecision = "fp32",
                 prefetch: bool = True, timeout_s: float = 120.0, staleness: int = 0,
                 shard_group: int | None = None, *, store: dist.Store, job_id: str) -> None:
        self.device = device
        self.heap = heap
        # Through which wrap() and configure_optimizer() check that the ranks agree, and a wait
        # for a peer's flags looks up whether it closed its engine.
        self.store, self.job_id = store, job_id
        self._store_answers = True
        self.rank, self.world_size = heap.rank, heap.world_size
        # The ranks a unit is sharded over: all of them, or (hybrid sharding) this rank's node.
        group = self.world_size if shard_group is None else shard_group
        if group < 1 or self.world_size % group:
            raise ValueError(f"a shard group of {group} ranks does not divide {self.world_size} ranks into nodes")
        if group < self.world_size and staleness:
            raise ValueError("hybrid sharding is synchronous only: its replicas reduce at the minibatch barrier")
        first = self.rank - self.rank % group
        self.owners: tuple[int, ...] | None = None if group == self.world_size else tuple(range(first, first + group))
        self.peers: tuple[int, ...] = self.owners or tuple(range(self.world_size))
        self.shard_index = self.rank - first
        # Gathered and computed in param_dtype, summed into reduce_dtype accumulators (base.py).
        self.policy = MixedPrecision.of(precision)
        self.compute_dtype = self.policy.param_dtype
        self.timeout_s = timeout_s
        self.trace: TraceHook | None = None
        self.clock: Clock = perf_counter
        self.versions = Versions(heap, self.peers, staleness, timeout_s, self._emit, self._now, self._peer_closed)
        self.fetcher = make_fetcher(device, heap, self.versions, self.owners, prefetch, self._emit, self._now)
        self.units: list[FlatUnit] = []
        self.model: nn.Module | None = None
        self.wrapped: dict[str, tuple[int, torch.dtype]] = {}  # parameter_ids at wrap()
        self.group_names: list[list[str]] = []  # the parameters of each optimizer group, by name
        self._hooks: UnitHooks | None = None
        self.module_state = state_dict.ModuleStateGuard()

    @property
    def heap_bytes(self) -> int:
        return self.heap.heap_bytes

    @property
    def staleness(self) -> int:
        return self.versions.staleness

    @property
    def minibatch(self) -> int:
        return self.versions.minibatch

    # ---- set-up -------------------------------------------------------------------------
    def wrap(self, model: nn.Module, units: Sequence[nn.Module]) -> nn.Module:
        """Shard every parameter: one flat group per unit, except that units sharing a parameter
        (tied embeddings) share one group, gathered from its first unit's forward until the last
        gradient of all of them has been pushed (odc_core/engine/sharing.py)."""
        check_wrap(model, self.model)
        units = check_units(model, units)
        settings = {"engine": "odc", "precision": precision_name(self.policy), "staleness": self.versions.staleness,
                    "shard group": len(self.peers), "transport": type(self.heap).__name__}
        check_ranks_agree(self.store, self.job_id, self.rank, self.world_size, self.timeout_s,
                          description(model, units, settings))
        warn_if_values_differ(self.store, self.job_id, self.rank, self.world_size, self.timeout_s, model)
        names = {id(p): n for n, p in model.named_parameters()}
        meta = [n for n, p in model.named_parameters() if p.is_meta]
        if meta:
            # FSDP2 shards first and materialises after (to_empty, then init on the shards); ODC
            # copies each parameter's values into its shards here, so they must exist by now.
            raise ValueError(f"parameter {meta[0]} is on the meta device ({len(meta)} of the model's are): engine odc "
                             f"shards the values a parameter holds at wrap(); build or load the model with its "
                             f"values (on the CPU or this rank's device) before wrap()")
        odd = [(n, p.dtype) for n, p in model.named_parameters() if p.dtype not in (torch.float32, self.compute_dtype)]
        if odd:
            # The shards are fp32 masters and forward reads them in the compute dtype: a parameter
            # of a third dtype would meet inputs of its own dtype with weights of another. FSDP2
            # keeps each parameter's own dtype as its master instead (a bf16 model, bf16 moments).
            name, dtype = odd[0]
            if not dtype.is_floating_point:
                # A frozen integer weight (a quantized base under LoRA) would be gathered as floats, its
                # dtype changed under the model's forward; loading it "in float32" is no answer.
                raise ValueError(f"parameter {name} is {dtype} ({len(odd)} of the model's are not float32): engine "
                                 f"odc's units hold real floating-point parameters only (a quantized integer weight is "
                                 f"not sharded yet); register it as a buffer (each rank keeps it whole), or use engine "
                                 f"collective, whose FSDP2 shards it in its own dtype")
            raise ValueError(f"parameter {name} is {dtype} ({len(odd)} of the model's are not float32), and engine odc "
                             f"computes in {self.compute_dtype} on float32 master weights: load the model in float32, "
                             f"with precision='bf16' for bf16 compute (a bf16 model works there too)")
        self.model = model
        modules, groups, params_of = flat_groups(model, list(units))
        group_of: list[FlatUnit | None] = [None] * len(modules)
        for group, params in zip(groups, params_of, strict=True):
            unit = shard_unit(self.heap, len(self.units), group, params, [names[id(p)] for p in params],
                              owners=len(self.peers), shard_index=self.shard_index, slots=self.versions.slots,
                              compute_dtype=self.compute_dtype, reduce_dtype=self.policy.reduce_dtype,
                              device=self.device)
            self.units.append(unit)
            for pos in group:
                group_of[pos] = unit
        self.wrapped = parameter_ids(model)  # in the compute dtype, as sharding left them
        self.versions.units = self.units
        if self.owners is not None:
            self.versions.replicas = self._replica_group(len(self.owners))
            self.versions.replica_count = self.world_size // len(self.owners)
        self.versions.allocate()
        self.heap.barrier(self.timeout_s)  # every shard is initialised before anyone gathers
        self.versions.publish_initial()
        labels = unit_labels(model)
        self._hooks = UnitHooks(modules, [labels[id(m)] for m in modules], group_of, self.fetcher, self.versions,
                                self.compute_dtype, self.device)
        for unit in self.units:
            self._hooks.register(unit)
        self._hooks.watch_model(model)
        self.module_state.watch(model)
        return model

    def _replica_group(self, group: int) -> dist.ProcessGroup:
        """The group of this rank's replicas (one per node). new_group is collective over every
        rank, so every rank creates every node index's group, in the same order."""
        mine = None
        for index in range(group):
            ranks = list(range(index, self.world_size, group))
            made = dist.new_group(ranks, timeout=timedelta(seconds=self.timeout_s))
            if index == self.shard_index:
                mine = made
        assert mine is not None
        return mine

    def configure_optimizer(self, factory: OptimizerFactory, *, scheduler: SchedulerFactory | None = None,
                            max_grad_norm: float | None = None, param_groups: ParamGroups | None = None) -> None:
        """The optimizer over this rank's own fp32 shards: its state is sharded like FSDP's. Each
        unit's shard is one optimizer parameter, or with param_groups one per run of parameters
        in the same group (unit.py's pieces). The owners step it, so ODC, not the training
        loop, calls step()."""
        if self._hooks is None or self.model is None:
            raise RuntimeError("wrap() the model before configure_optimizer()")
        check_factories(factory, scheduler, param_groups)
        if max_grad_norm is not None and self.staleness:
            # The global norm of minibatch k needs every owner's part of it before any owner
            # steps: a barrier per step, which stale-synchronous ODC exists to avoid.
            raise ValueError("max_grad_norm needs staleness 0: clipping by the global norm makes every owner "
                             "wait for every other's gradients before each step")
        named = list(self.model.named_parameters())
        groups = group_options(named, param_groups) if param_groups is not None else [({}, [n for n, _ in named])]
        group_of = {name: g for g, (_, names) in enumerate(groups) for name in names}
        for unit in self.units:
            unit.split([group_of[name] for name in unit.names], self.versions.newest_slot)
        pieces = [piece for unit in self.units for piece in unit.pieces]
        params: list[Any] = [piece.param for piece in pieces]
        if param_groups is not None:
            params = [{"params": [p.param for p in pieces if p.group == g], **options}
                      for g, (options, _) in enumerate(groups)]
        self.group_names = [names for _, names in groups]
        step_rule = OptimizerStep.build(params, factory, scheduler, max_grad_norm)
        check_ranks_agree(self.store, self.job_id, self.rank, self.world_size, self.timeout_s,
                          optimizer_description(step_rule), OPTIMIZER_FIX)
        refused = [cls for cls in _WHOLE_PARAMETER if isinstance(step_rule.optimizer, cls)]
        if refused:  # a subclass of one too: the update is the one it inherits
            kind = type(step_rule.optimizer).__name__
            raise ValueError(f"engine odc steps each unit's shard as one flat tensor, and {kind} updates a parameter "
                             f"by its shape or with all of them at once ({_WHOLE_PARAMETER_WHY[refused[0].__name__]}): "
                             f"it would step the shards wrong; use an optimizer that updates each element on its own "
                             f"(AdamW, Adam, SGD, RMSprop, ...)")
        self.versions.step_rule = step_rule

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return configured(self.versions.step_rule, "engine.optimizer").optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler | None:
        return configured(self.versions.step_rule, "engine.scheduler").scheduler

    # ---- the minibatch protocol (versions.py) ------------------------------------------
    def read_version(self, minibatch: int) -> int:
        """The version minibatch `minibatch` computes on."""
        return self.versions.read_version(minibatch)

    def begin_minibatch(self) -> None:
        """Nothing here waits for a peer: the first gather from an owner waits for its version."""
        check_parameters(self.model, self.wrapped)
        for unit in self.units:
            for name, p, trainable in zip(unit.names, unit.params, unit.trainable, strict=True):
                if p.requires_grad != trainable:
                    # wrap() chose what each parameter's backward does: a parameter unfrozen since
                    # would lose its gradients, one frozen since would still be stepped.
                    raise RuntimeError(f"parameter {name} was {'' if trainable else 'un'}frozen after wrap(): set "
                                       f"requires_grad before wrap(), which decides what is pushed and stepped")
        check_order("begin_minibatch", self.minibatch if self.versions.inside else None,
                    self.versions.closing.is_set())
        # Before the minibatch opens: one that cannot be stepped left close() waiting for its step.
        configured(self.versions.step_rule, "begin_minibatch()")
        if self.versions.failed is not None:  # its peers wait for the step it could not finish
            raise RuntimeError(f"begin_minibatch() after minibatch {self.minibatch} failed "
                               f"({one_line(self.versions.failed)}): the engine cannot go on from it; close() it "
                               f"and resume from a checkpoint")
        self._refuse_written("begin_minibatch()")
        self.versions.begin()

    def finish_minibatch(self) -> float | None:
        """This rank's gradients of the minibatch have landed; the minibatch's step is applied
        here (s = 0, after the one barrier) or queued for this owner to serve (s >= 1). The
        gradient norm before clipping when the engine clips (base.py)."""
        check_order("finish_minibatch", self.minibatch if self.versions.inside else None,
                    self.versions.closing.is_set())
        try:
            return self._finish_minibatch()
        except BaseException as e:
            self.versions.failed = self.versions.failed or e
            raise

    def _finish_minibatch(self) -> float | None:
        if self._hooks is not None:
            self._hooks.finish_cut_short()
        for unit in self.units:
            # The engine's own .grad views are gone once a unit has pushed: one left is the user's.
            hand_set = next((n for n, p in zip(unit.names, unit.params, strict=True) if p.grad is not None), None)
            if unit.grad is None and hand_set is not None:
                raise RuntimeError(f"parameter {hand_set} holds a .grad that no backward() gave it (set by hand, as "
                                   f"from torch.autograd.grad(loss, model.parameters())), which the step would not "
                                   f"see: ODC sends each unit's gradients to their owners from inside backward(); "
                                   f"compute them with loss.backward()")
        if self._hooks is not None:
            self._refuse_no_backward(self._hooks)
        for unit in self.units:
            if unit.grad is not None:
                raise RuntimeError(f"unit {unit.name}: backward finished without pushing its gradients")
            # A unit whose forward ran but no gradient reached (an output the loss did not use)
            # may still hold its gathered parameters or a prefetch of them: the next minibatch
            # reads a newer version.
            unit.backward = Backward.IDLE
            unit.forwards_open, unit.last_ran = 0, False  # a forward an exception cut short
            unit.pushed_in, unit.inputs_hooked = None, 0  # a backward through this minibatch's forwards is refused
            if unit.storage is not Storage.SHARDED:
                self.fetcher.ensure(unit)
                unit.release()
        return self.versions.finish()

    def _refuse_no_backward(self, hooks: UnitHooks) -> None:
        """Where this rank ran a training forward in the minibatch and no backward gave the
        parameters a gradient (a loop that forgot loss.backward(), or took only an input's
        gradient): ODC stepped on zeros, so that weight decay and momentum alone moved the
        parameters, without a word (the collective engine refuses it). On one rank that is the
        whole step, refused in one line; on several, the other ranks' gradients may make it (a
        rank that skips every microbatch of its own, a loss that is not finite, adds nothing, as
        a rank given none does), and no rank knows theirs, so a warning says it once. Only
        forwards of the whole model that ended count: one cut short (an out-of-memory a loop
        skips) did not."""
        armed, hooks.armed_in_minibatch = hooks.armed_in_minibatch, False
        pushed, hooks.pushed = hooks.pushed, False
        if not (armed and not pushed and any(unit.trainable_count for unit in self.units)):
            return
        said = (f"minibatch {self.minibatch} ran a forward with gradients on this rank, but no backward() reached the "
                f"model's parameters")
        if self.world_size == 1:
            raise RuntimeError(f"{said}, so its step would apply only the optimizer's own terms (weight decay, "
                               f"momentum): call loss.backward() for each microbatch, and run a forward for its "
                               f"outputs alone under torch.no_grad()")
        warnings.warn(f"{said} (rank {self.rank}): this rank adds nothing to the step, and where no rank does, the "
                      f"step applies only the optimizer's own terms (weight decay, momentum); call loss.backward() "
                      f"for each microbatch, and run a forward for its outputs alone under torch.no_grad()",
                      NoBackwardWarning, stacklevel=4)

    def drain(self) -> None:
        """Wait until every owner has applied the step of every minibatch begun so far."""
        self.between_minibatches("drain")
        self.versions.drain()

    def between_minibatches(self, call: str) -> None:
        check_order(call, self.minibatch if self.versions.inside else None, self.versions.closing.is_set(),
                    self.model is not None)
        if call in _LOADS:  # what a write left is overwritten, as in one process
            self._refuse_written(None)
        elif call in _READS:
            self._refuse_written(f"{call}()")

    def _refuse_written(self, call: str | None) -> None:
        """A RuntimeError, one line, where a parameter was written while the engine held it in its
        shards (nn.init.zeros_ after wrap(), p.fill_ between minibatches): the write landed in the
        parameter's placeholder, not in the shards, and the model trained or was saved without it,
        without a word. The placeholders are NaN again after; with `call` None, without a word.
        One reduction over the placeholders (a device sync on CUDA, where the minibatch's finish
        has just synchronised)."""
        marks = [u.absent for u in self.units if u.absent is not None]
        if not marks or bool(torch.cat(marks).isnan().all()):
            return
        written = next(name for u in self.units if u.absent is not None
                       for name, value in zip(u.names, u.absent.tolist(), strict=False) if not math.isnan(value))
        for m in marks:
            m.fill_(float("nan"))
        if call is not None:
            raise RuntimeError(f"parameter {written} was written while ODC held it in its shards (found at {call}: "
                               f"nn.init.zeros_, ones_, constant_ or fill_ after wrap()), which does not reach them, "
                               f"and the engine would go on without it; initialize the model before wrap(), or load "
                               f"new values with odc_core.set_state_dict(engine, weights, {{}})")

    def claim(self) -> int:
        return self.versions.claim()

    def _now(self) -> Any:
        return self.clock()

    def _emit(self, kind: str, t0: Any, **info: object) -> None:
        if self.trace is not None:
            self.trace(kind, t0, self.clock(), **info)

    # ---- outside minibatches (state_dict.py) -------------------------------------------
    @_collective
    def full_parameters(self) -> dict[str, torch.Tensor]:
        self.between_minibatches("full_parameters")
        return state_dict.full_parameters(self)

    @_collective
    def sharded_state(self, for_load: bool = False, optimizer: bool = True) -> dict[str, Any]:
        self.between_minibatches("sharded_state")
        return state_dict.sharded_state(self, for_load, optimizer=optimizer and self.versions.step_rule is not None)

    @_collective
    def load_sharded_state(self, state: dict[str, Any]) -> None:
        self.between_minibatches("load_sharded_state")
        state_dict.load_sharded_state(self, state)

    @_collective
    def state_dict(self, full: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
        self.between_minibatches("state_dict")
        # An engine without an optimizer (a reference model's) has the model's state alone.
        optimizer = self.versions.step_rule is not None
        if full:
            return state_dict.full_state(self, optimizer)
        state = state_dict.sharded_state(self, optimizer=optimizer)
        return state["model"], state.get("optim", {})

    @_collective
    def load_state_dict(self, model_state_dict: dict[str, Any], optim_state_dict: dict[str, Any], *,
                        broadcast_from_rank0: bool = False) -> None:
        self.between_minibatches("load_state_dict")
        if broadcast_from_rank0:
            model_state_dict, optim_state_dict = skeleton_from_rank0(model_state_dict, optim_state_dict)
        else:
            check_optimizer_state(optim_state_dict)
            check_ranks_agree(self.store, self.job_id, self.rank, self.world_size, self.timeout_s,
                              state_description(model_state_dict, optim_state_dict), STATE_FIX)
        state_dict.set_state(self, model_state_dict, optim_state_dict, broadcast_from_rank0)

    def _peer_closed(self, peer: int, what: str) -> str | None:
        """The error of a wait for `what` where `peer` closed its engine; None while it has not,
        or where the store does not answer (its host died: the wait's own timeout names the peer)."""
        if not self._store_answers:
            return None
        try:
            return peer_closed(self.store, self.job_id, peer, what)
        except Exception:  # the store's errors are of many kinds (DistNetworkError, RuntimeError)
            self._store_answers = False
            return None

    def close(self) -> None:
        # A failure the loop caught (a step that raised, a drain that timed out) left steps that
        # will not come: a drain here waited out timeout_s for them, then named a rank.
        v = self.versions
        raised = sys.exc_info()[1] or v.failed
        ended: BaseException | None = None
        if raised is None and v.minibatch >= 0 and not v.inside and not v.closing.is_set():
            # A close between minibatches, no error unwinding, ends the run: it drains, so that a
            # peer that ran fewer minibatches, which stale-synchronous ODC let this rank run past,
            # fails the close by name instead of losing this rank's last gradients without a word.
            # Untraced: a loop that drained already has ended its trace.
            try:
                v.drain(traced=False)
            except BaseException as e:  # raised once the engine is closed: nothing leaks
                ended = e
        self.versions.closing.set()  # a prefetch waiting on a dead peer stops now
        # Peers waiting for this rank's flags fail now, saying when and, where close() runs as an
        # error unwinds (a `finally`), why, not after their timeout with neither.
        tell_peers(self.store, self.job_id, self.rank, v.minibatch, v.inside, raised or ended)
        if self._hooks is not None:
            self._hooks.remove()
        self.module_state.close()
        self.fetcher.close()
        if self.device.type == "cuda":  # no copy of a prefetch still writes a buffer freed here
            torch.cuda.synchronize(self.device)
        for unit in self.units:  # the model outlives the engine: its parameters read NaN, not freed memory
            unit.free()
            unit.backward = Backward.IDLE
        self.heap.close()
        if self.versions.replicas is not None:
            group, self.versions.replicas = self.versions.replicas, None
            dist.destroy_process_group(group)
        if ended is not None:
            raise ended


def build(ctx: EngineContext, options: OdcOptions) -> OdcEngine:
    reduce = str(ctx.policy.reduce_dtype).removeprefix("torch.")
    spec = TRANSPORTS[options.transport]
    if reduce not in spec.reduce_dtypes:
        raise ValueError(f"engine=odc on transport {spec.name} sums gradients in {' or '.join(spec.reduce_dtypes)} "
                         f"only, not {reduce}: use MixedPrecision(reduce_dtype=torch.float32)"
                         + (" or transport shm" if "cpu" in spec.devices else ""))
    job_id, store = ctx.own_job()
    heap = make_heap(options.transport, ctx.device.type, dist.get_rank(), dist.get_world_size(), job_id, store,
                     ctx.timeout_s)
    return OdcEngine(ctx.device, heap, ctx.precision, options.prefetch, ctx.timeout_s, options.staleness,
                     shard_group_size(options.shard, options.ranks_per_node, dist.get_world_size()),
                     store=store, job_id=job_id)
