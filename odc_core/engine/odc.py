"""On-demand communication (ODC): FSDP's sharded layout without per-layer collectives.

Each unit's parameters live as one flat vector split into equal shards, one per rank, in
the symmetric heap. A rank gathers a unit's full parameters from the owners just before the
unit's forward and again before its backward (one-sided gets; owners do nothing), and right
after the unit's backward pushes each gradient slice into its owner's fp32 accumulator
(one-sided adds). Nothing in between waits for another rank's progress, so ranks may run
different numbers of microbatches.

Versions. Version v is the parameters after v optimizer steps; minibatch k computes on
version max(0, k - s) for the engine's staleness s, and step k applies minibatch k's
gradients to version k, giving version k + 1. s = 0 is the synchronous engine: every
minibatch sees every earlier step. Each owner keeps s + 1 slots of its master shard (version
v in slot v mod (s + 1)) and of its accumulator (minibatch k pushes into slot k mod (s + 1)),
so no gather reads a slot a step is writing and no push lands in another minibatch's sum
(docs/staleness.md has the argument).

Synchronisation, through two int64 flags every rank publishes:
- DONE = k + 1 once the rank has pushed all its gradients of minibatch k (finish_minibatch).
- VERSION = v + 1 once the rank's shard of version v is in its slot (and, for v >= 1, the
  accumulator of minibatch v - 1 is zeroed for minibatch v + s). A gatherer waits for an
  owner's VERSION before its first read of a minibatch; nothing else waits.
Step k runs on each owner once every rank's DONE >= k + 1. With s = 0 the rank runs it
itself in finish_minibatch, after waiting for every DONE (the minibatch's one barrier); a
fast rank then starts minibatch k + 1 as soon as the owners it reads from have stepped. With
s >= 1 no worker waits at finish_minibatch: the owner serves its steps in order from inside
its own training, at every unit's forward and after every unit's push, and all the while it
waits for anything, so a step is applied within one unit's compute of its last push landing,
not at the owner's next minibatch boundary. Not on a server thread of its own: where a rank
has one core (CPU ranks), such a thread's polling and its optimizer step take the GIL and the
core from the rank's compute (docs/staleness.md measured it). Pushes of minibatch k cannot
reach an accumulator slot before the step that frees it either: a rank pushes a unit's
gradients only after gathering that unit from the same owners, which waited for the version
that step published.

Hybrid sharding (shard_group G < world size; the paper's section 6.1): a node is G
consecutive ranks, each unit is sharded over its node's ranks, and every node holds a
replica. Gathers, pushes and every flag a rank waits on stay within its node. At the
minibatch barrier each owner's accumulated shard is summed with the same shard on the other
nodes (the replicas: the ranks with the same index in their node), and every replica applies
the same AdamW step to the same sum, so the replicas stay equal without ever being compared.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from datetime import timedelta
from time import perf_counter as _now
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from odc_core.engine.base import (
    EngineContext,
    OptimizerFactory,
    OptimizerStep,
    SchedulerFactory,
    TraceHook,
    configured,
)
from odc_core.engine.registry import OdcOptions, shard_group_size
from odc_core.engine.sharing import sharing_groups, unit_parameters
from odc_core.primitives import ShardLayout, gather, scatter_accumulate
from odc_core.transport.base import PeerTimeout, SymmetricHeap
from odc_core.transport.registry import make_heap

FLAGS = "odc/flags"
VERSION, DONE = 0, 1
CLAIMS = "odc/claims"  # rank 0's work counter for run-time balancing (dynamic)
# A wait looks up between slices whether the engine is closing.
_WAIT_SLICE_S = 0.2
# A worker with steps of its own due polls between 10 us and 1 ms, as the transports' waits do.
_POLL_FIRST_S, _POLL_LAST_S = 1e-5, 1e-3


def _alias(storage_owner: torch.Tensor, numel: int) -> torch.Tensor:
    """A tensor over the same storage with its own autograd version counter.

    Writing the gathered parameters through it does not bump the version counter of the
    parameter views that autograd saved for backward: their values are meant to come back.
    """
    return torch.empty(0, dtype=storage_owner.dtype, device=storage_owner.device).set_(
        storage_owner.untyped_storage(), 0, (numel,), (1,))


@dataclass
class _Unit:
    """One flat group of parameters: a unit's, or several units' that share a parameter."""

    index: int
    name: str
    modules: list[int]                  # positions of its units in the order wrap() was given them
    params: list[nn.Parameter]
    names: list[str]
    layout: ShardLayout
    full: torch.Tensor                  # unsharded flat parameters, compute dtype; storage freed when resharded
    master: list[torch.Tensor]          # heap: this rank's fp32 shard, one slot per live version
    shadow: list[torch.Tensor] | None   # heap: the slots in the compute dtype, when that is not fp32
    acc: list[torch.Tensor]             # heap: this rank's fp32 gradient accumulators, one per minibatch in flight
    shard_param: nn.Parameter           # what the optimizer steps: its data is the newest version's slot
    grad: torch.Tensor | None = None    # flat gradient of the current backward, compute dtype
    gathered: bool = False
    pending: Future | None = None
    grads_ready: int = 0
    # Gradients of its units' inputs still to leave them in this backward: until they have, the
    # units' backward still reads the gathered parameters.
    inputs_pending: int = 0
    # Set by a forward, cleared by the first hook of its backward: one gradient buffer per backward.
    armed: bool = False
    offsets: list[int] = field(default_factory=list)


def _tensors(output: object) -> Iterator[torch.Tensor]:
    """The tensors in a module's output: itself, or inside tuples, lists and dicts (a
    transformers ModelOutput is a dict), however nested."""
    if torch.is_tensor(output):
        yield output
    elif isinstance(output, (tuple, list)):
        for item in output:
            yield from _tensors(item)
    elif isinstance(output, dict):
        for item in output.values():
            yield from _tensors(item)


def _buffer_name(kind: str, unit: str, slot: int) -> str:
    return f"odc/{kind}/{unit}/{slot}"


class _AfterBackward(torch.autograd.Function):
    """Identity on a unit's input whose backward runs once the unit's backward is done."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, engine: OdcEngine, index: int) -> torch.Tensor:
        ctx.engine, ctx.index = engine, index
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.engine._input_grad_done(ctx.index)
        return grad, None, None


class OdcEngine:
    name = "odc"
    loss_scale = 1.0  # gradients are summed into the owners' accumulators, not averaged

    def __init__(self, device: torch.device, heap: SymmetricHeap, precision: str = "fp32",
                 prefetch: bool = True, timeout_s: float = 120.0, staleness: int = 0,
                 shard_group: int | None = None) -> None:
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        self.device = device
        self.heap = heap
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
        # Hybrid sharding: this rank and its replicas on the other nodes (set up in wrap()).
        self._replicas: dist.ProcessGroup | None = None
        self.compute_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.prefetch = prefetch
        self.timeout_s = timeout_s
        self.staleness = staleness
        self.slots = staleness + 1
        self.trace: TraceHook | None = None
        self.units: list[_Unit] = []
        self._model: nn.Module | None = None
        self._modules: list[nn.Module] = []  # the units as wrap() was given them
        self._group_of: list[_Unit | None] = []  # each of them's flat group
        self.minibatch = -1
        self._step_rule: OptimizerStep | None = None
        self._ready: list[int] = [0] * self.world_size  # highest VERSION seen per owner
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="odc-prefetch") if prefetch else None
        # The owner's side of stale-synchronous ODC: minibatches finished here whose steps are
        # not applied yet, oldest first, and the highest DONE seen of each rank.
        self._unstepped: deque[int] = deque()
        self._done_seen: list[int] = [0] * self.world_size
        self._closing = threading.Event()
        self._handles: list = []

    @property
    def heap_bytes(self) -> int:
        return self.heap.heap_bytes

    # ---- set-up -------------------------------------------------------------------------
    def wrap(self, model: nn.Module, units: Sequence[nn.Module]) -> nn.Module:
        """Shard every parameter: one flat group per unit, except that units sharing a parameter
        (tied embeddings) share one group, gathered from its first unit's forward until the last
        gradient of all of them has been pushed (odc_core/engine/sharing.py)."""
        names = {id(p): n for n, p in model.named_parameters()}
        self._model = model
        self._modules = list(units)
        # FSDP2's convention: what no unit holds belongs to the root, the model itself, which is
        # gathered for the whole forward and backward (last in order: nothing prefetches it).
        inside = {id(p) for u in self._modules for p in u.parameters()}
        if all(u is not model for u in self._modules) and any(id(p) not in inside for p in model.parameters()):
            self._modules.append(model)
        self._group_of = [None] * len(self._modules)
        held = unit_parameters(self._modules)
        seen: set[int] = set()
        for group in sharing_groups(held):
            params: list[nn.Parameter] = []
            for p in (p for pos in group for p in held[pos]):
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
            if not params:  # a unit with no parameters of its own has nothing to gather
                continue
            unit = self._shard_unit(len(self.units), group, params, [names[id(p)] for p in params])
            self.units.append(unit)
            for pos in group:
                self._group_of[pos] = unit
        if self.owners is not None:
            self._replicas = self._replica_group(len(self.owners))
        self.heap.alloc(FLAGS, 2, torch.int64)
        self.heap.alloc(CLAIMS, 1, torch.int64)
        self.heap.barrier(self.timeout_s)  # every shard is initialised before anyone gathers
        self.heap.store(FLAGS, VERSION, 1)  # version 0, the initial weights, is in slot 0
        for unit in self.units:
            self._register_hooks(unit)
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

    def _shard_unit(self, index: int, modules: list[int], params: list[nn.Parameter],
                    names: list[str]) -> _Unit:
        numel = sum(p.numel() for p in params)
        layout = ShardLayout(numel, len(self.peers))
        name = f"u{index}"
        slots = range(self.slots)
        master = [self.heap.alloc(_buffer_name("master", name, j), layout.shard_numel, torch.float32) for j in slots]
        shadow = None
        if self.compute_dtype != torch.float32:
            shadow = [self.heap.alloc(_buffer_name("shadow", name, j), layout.shard_numel, self.compute_dtype)
                      for j in slots]
        acc = [self.heap.alloc(_buffer_name("acc", name, j), layout.shard_numel, torch.float32) for j in slots]
        flat = torch.zeros(layout.padded_numel, dtype=torch.float32, device=self.device)
        offsets, offset = [], 0
        for p in params:
            flat[offset:offset + p.numel()].copy_(p.detach().reshape(-1))
            offsets.append(offset)
            offset += p.numel()
        lo = self.shard_index * layout.shard_numel
        master[0].copy_(flat[lo:lo + layout.shard_numel])
        if shadow is not None:
            shadow[0].copy_(master[0])
        full = torch.empty(layout.padded_numel, dtype=self.compute_dtype, device=self.device)
        for p, off in zip(params, offsets, strict=True):
            p.data = full[off:off + p.numel()].view(p.shape)
        full.untyped_storage().resize_(0)
        shard_param = nn.Parameter(master[0], requires_grad=True)
        return _Unit(index, name, modules, params, names, layout, full, master, shadow, acc, shard_param,
                     offsets=offsets)

    def _register_hooks(self, unit: _Unit) -> None:
        for pos in unit.modules:
            module = self._modules[pos]
            self._handles.append(module.register_forward_pre_hook(
                lambda _m, args, kwargs, u=unit, pos=pos: self._pre_forward(u, pos, args, kwargs), with_kwargs=True))
            self._handles.append(module.register_forward_hook(
                lambda _m, _args, out, u=unit, pos=pos: self._post_forward(u, pos, out)))
        for p in unit.params:
            self._handles.append(p.register_post_accumulate_grad_hook(
                lambda _p, u=unit: self._param_grad_done(u)))

    def configure_optimizer(self, factory: OptimizerFactory, *, scheduler: SchedulerFactory | None = None,
                            max_grad_norm: float | None = None) -> None:
        """The optimizer over this rank's own fp32 shards, one flat shard per unit: its state is
        sharded like FSDP's. The owners step it, so ODC, not the training loop, calls step()."""
        if not self._modules:
            raise RuntimeError("wrap() the model before configure_optimizer()")
        if max_grad_norm is not None and self.staleness:
            # The global norm of minibatch k needs every owner's part of it before any owner
            # steps: a barrier per step, which stale-synchronous ODC exists to avoid.
            raise ValueError("max_grad_norm needs staleness 0: clipping by the global norm makes every owner "
                             "wait for every other's gradients before each step")
        self._step_rule = OptimizerStep.build([u.shard_param for u in self.units], factory, scheduler, max_grad_norm)

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return configured(self._step_rule).optimizer

    # ---- the minibatch protocol ------------------------------------------------------
    def read_version(self, minibatch: int) -> int:
        """The version minibatch `minibatch` computes on."""
        return max(0, minibatch - self.staleness)

    def begin_minibatch(self) -> None:
        """Nothing here waits for a peer: the first gather from an owner waits for its version."""
        self._serve()
        self.minibatch += 1

    def finish_minibatch(self) -> None:
        """This rank's gradients of the minibatch have landed; the minibatch's step is applied
        here (s = 0, after the one barrier) or queued for this owner to serve (s >= 1)."""
        k = self.minibatch
        for unit in self.units:
            if unit.grad is not None:
                raise RuntimeError(f"unit {unit.name}: backward finished without pushing its gradients")
        t0 = _now()
        self.heap.quiet()
        self.heap.store(FLAGS, DONE, k + 1)
        if self.staleness:
            self._unstepped.append(k)
            self._emit("sync", t0)
            self._serve()
            return
        for peer in self.peers:
            self._wait(peer, DONE, k + 1, f"its gradients of minibatch {k}")
        if self._replicas is not None:
            self._reduce_replicas(k)
        self._emit("sync", t0)
        self._step(k)

    def _reduce_replicas(self, k: int) -> None:
        """Sum this owner's accumulated shards with its replicas' (hybrid sharding), in place.

        A collective, not one-sided pushes: here, once per minibatch, every replica needs the
        same sum at the same point, which is what an all-reduce is built for (bandwidth-optimal
        across the slow links between nodes, and one result on every replica, so their AdamW
        steps stay equal bit for bit), while pushes would need a second accumulator per shard
        and a second round of flags. One call per unit, straight on the heap's accumulator: no
        copy of the owned shards (models/memory.py counts none), and the calls come once per
        minibatch, not per microbatch."""
        for unit in self.units:
            dist.all_reduce(unit.acc[k % self.slots], group=self._replicas)

    def drain(self) -> None:
        """Wait until every owner has applied the step of every minibatch begun so far (this
        rank's own steps included, which it applies here as their pushes land)."""
        t0 = _now()
        while self._unstepped:
            k = self._unstepped[0]
            for peer in self.peers:
                self._wait(peer, DONE, k + 1, f"its gradients of minibatch {k} (for step {k})", serve=True)
            self._serve()
        for owner in self.peers:
            self._wait(owner, VERSION, self.minibatch + 2, f"step {self.minibatch} of its shards", serve=True)
        if self.staleness:  # synchronous, the barrier was the wait: a trace as before
            self._emit("sync", t0)

    def _serve(self) -> None:
        """Apply, oldest first, each step of this owner whose pushes have all landed (s >= 1).

        Called by the worker only (at unit boundaries and inside its waits), never by the
        prefetch thread: steps are applied one at a time, in order, by one thread."""
        while self._unstepped and self._landed(self._unstepped[0]):
            k = self._unstepped.popleft()
            for peer in self.peers:  # acquire: each rank's pushes before its DONE are visible here
                self.heap.wait_until(FLAGS, peer, DONE, k + 1, self.timeout_s)
            self._step(k)

    def _landed(self, k: int) -> bool:
        """Whether every rank has pushed its gradients of minibatch k. Reads a flag only until
        the first rank that has not (usually one read: the flags only grow)."""
        for peer in self.peers:
            if self._done_seen[peer] < k + 1:
                self._done_seen[peer] = self.heap.load(FLAGS, peer, DONE)
                if self._done_seen[peer] < k + 1:
                    return False
        return True

    def _step(self, k: int) -> None:
        """Version k + 1 = AdamW(version k, minibatch k's gradients), written into its own slot;
        then minibatch k's accumulator slot is zeroed for minibatch k + s + 1 and the version
        published. The slot version k + 1 takes held version k - s, which only minibatch k read."""
        step = configured(self._step_rule)
        t0 = _now()
        now, new = k % self.slots, (k + 1) % self.slots
        for unit in self.units:
            if new != now:
                unit.master[new].copy_(unit.master[now])
                unit.shard_param.data = unit.master[new]  # AdamW keeps its moments per parameter, not per tensor
            unit.shard_param.grad = unit.acc[now]
        step.apply(self._clip)
        for unit in self.units:
            unit.acc[now].zero_()
            if unit.shadow is not None:
                unit.shadow[new].copy_(unit.master[new])
        self.heap.store(FLAGS, VERSION, k + 2)
        self._emit("optimizer", t0, minibatch=k, microbatch=-1)

    def _clip(self, max_norm: float) -> None:
        """Scale the minibatch's gradients to a global norm of at most max_norm. Each owner holds
        the full sum of its shards' gradients, so the squared norm is the sum of the owners'
        parts: one all-reduce of a scalar (every rank steps at the same barrier when s = 0).
        With hybrid sharding every node holds the whole gradient once, so the sum counts it once
        per node."""
        shards = [u.shard_param for u in self.units]
        square = torch.stack([g.grad.double().square().sum() for g in shards]).sum().reshape(1)  # type: ignore[union-attr]
        dist.all_reduce(square)
        total = (square[0] / (self.world_size // len(self.peers))).sqrt().float()
        torch.nn.utils.clip_grads_with_norm_(shards, max_norm, total)

    def claim(self) -> int:
        """Take the next ticket of the run's shared work counter: one atomic add on rank 0's
        heap, which rank 0 takes no part in."""
        if self.staleness:
            raise RuntimeError("run-time claims need every rank in the same minibatch; staleness > 0 cannot "
                               "promise it (use a static plan)")
        return self.heap.fetch_add(CLAIMS, 0, 0, 1)

    # ---- waiting on peers ---------------------------------------------------------------
    def _wait(self, peer: int, index: int, at_least: int, what: str, serve: bool = False) -> None:
        """Until peer's flag reaches `at_least`. PeerTimeout names the peer when its flag has
        not moved for timeout_s (with staleness a peer may be up to s + 1 minibatches behind,
        so progress, not the whole wait, is what is timed); the engine closing ends the wait at
        once. With `serve` (the worker's waits) this rank's due steps are applied meanwhile: a
        peer may be waiting for one of them while this rank waits for it."""
        seen, deadline, delay = -1, 0.0, _POLL_FIRST_S
        while (value := self.heap.load(FLAGS, peer, index)) < at_least:
            if value != seen:
                seen, deadline = value, time.monotonic() + self.timeout_s
            if self._closing.is_set():
                raise RuntimeError(f"the engine closed while waiting for rank {peer}: {what}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PeerTimeout(peer, what, self.timeout_s)
            if serve and self._unstepped:
                self._serve()
                time.sleep(delay)
                delay = min(delay * 2, _POLL_LAST_S)
                continue
            # A slice, not the timeout: then look at the engine and the deadline again.
            with contextlib.suppress(PeerTimeout):
                self.heap.wait_until(FLAGS, peer, index, value + 1, min(remaining, _WAIT_SLICE_S))
        # Acquire (returns at once): what the peer wrote before its flag is visible from here on.
        self.heap.wait_until(FLAGS, peer, index, at_least, self.timeout_s)

    # ---- hooks ------------------------------------------------------------------------
    def _group_at(self, pos: int) -> _Unit | None:
        return self._group_of[pos] if 0 <= pos < len(self._modules) else None

    def _pre_forward(self, unit: _Unit, pos: int, args: tuple, kwargs: dict):
        self._serve()
        self._ensure_gathered(unit)
        following = self._group_at(pos + 1)
        if following is not None and following is not unit:
            self._prefetch(following)
        if not torch.is_grad_enabled():
            return None
        # The first input that carries a gradient, positional or keyword (transformers' layers
        # take hidden_states either way): its gradient leaving the unit ends the unit's backward.
        for i, x in enumerate(args):
            if torch.is_tensor(x) and x.requires_grad:
                unit.inputs_pending += 1
                return (*args[:i], _AfterBackward.apply(x, self, unit.index), *args[i + 1:]), kwargs
        for key, x in kwargs.items():
            if torch.is_tensor(x) and x.requires_grad:
                unit.inputs_pending += 1
                return args, {**kwargs, key: _AfterBackward.apply(x, self, unit.index)}
        return None

    def _post_forward(self, unit: _Unit, pos: int, output) -> None:
        # A group stays gathered until its last unit's forward; the last unit's backward starts
        # at once, so it stays gathered for that too.
        if not torch.is_grad_enabled():  # no backward follows (evaluation)
            if pos == unit.modules[-1]:
                self._reshard(unit)
            return
        if pos == unit.modules[-1] and pos + 1 < len(self._modules):
            self._reshard(unit)
        # Every output that carries a gradient (transformers' layers return tuples): the first
        # of them whose gradient arrives starts the group's backward.
        outputs = [t for t in _tensors(output) if t.requires_grad]
        unit.armed = unit.armed or bool(outputs)
        for t in outputs:
            t.register_hook(lambda _g, u=unit, pos=pos: self._pre_backward(u, pos))

    def _pre_backward(self, unit: _Unit, pos: int) -> None:
        if unit.armed:
            unit.armed = False
            self._ensure_gathered(unit)
            unit.grad = torch.zeros(unit.layout.padded_numel, dtype=self.compute_dtype, device=self.device)
            for p, off in zip(unit.params, unit.offsets, strict=True):
                # Autograd accumulates into an existing .grad in place, so the flat buffer fills
                # up without a copy and is pushed as it is.
                p.grad = unit.grad[off:off + p.numel()].view(p.shape)
            unit.grads_ready = 0
        preceding = self._group_at(pos - 1)
        if preceding is not None and preceding is not unit:
            self._prefetch(preceding)

    def _param_grad_done(self, unit: _Unit) -> None:
        unit.grads_ready += 1
        self._maybe_push(unit)

    def _input_grad_done(self, index: int) -> None:
        unit = self.units[index]
        unit.inputs_pending -= 1
        self._maybe_push(unit)

    def _maybe_push(self, unit: _Unit) -> None:
        """Push once the unit's backward is over: all its parameter gradients have
        accumulated and (when it has one) the gradient of its input has left it."""
        if unit.grads_ready < len(unit.params) or unit.inputs_pending > 0:
            return
        assert unit.grad is not None, "_pre_backward gave the unit its flat gradient"
        t0 = _now()
        scatter_accumulate(self.heap, _buffer_name("acc", unit.name, self.minibatch % self.slots), unit.grad,
                           unit.layout, self.owners)
        self._emit("push", t0, unit=unit.name)
        for p in unit.params:
            p.grad = None
        unit.grad = None
        self._reshard(unit)
        self._serve()

    # ---- gathering --------------------------------------------------------------------
    def _ensure_gathered(self, unit: _Unit) -> None:
        if unit.pending is not None:
            t0 = _now()
            self._prefetched(unit.pending)
            unit.pending = None
            self._emit("prefetch_wait", t0, unit=unit.name)
        if not unit.gathered:
            t0 = _now()
            self._gather(unit, serve=True)
            self._emit("gather", t0, unit=unit.name)

    def _prefetched(self, pending: Future) -> None:
        """Wait for a prefetch, applying this rank's due steps meanwhile (the prefetch may be
        waiting for a peer that waits for one of them)."""
        delay = _POLL_FIRST_S
        while self._unstepped and not pending.done():
            self._serve()
            wait_futures([pending], timeout=delay)
            delay = min(delay * 2, _POLL_LAST_S)
        pending.result()

    def _prefetch(self, unit: _Unit) -> None:
        if self._pool is None or unit.gathered or unit.pending is not None:
            return
        unit.pending = self._pool.submit(self._gather, unit)

    def _gather(self, unit: _Unit, serve: bool = False) -> None:
        storage = unit.full.untyped_storage()
        storage.resize_(unit.layout.padded_numel * unit.full.element_size())
        version = self.read_version(self.minibatch)
        for owner in self.peers:
            if self._ready[owner] < version + 1:
                t0 = _now()
                self._wait(owner, VERSION, version + 1, f"version {version} of its shards", serve)
                self._ready[owner] = version + 1
                self._emit("wait", t0, unit=unit.name, peer=owner)
        kind = "shadow" if unit.shadow is not None else "master"
        gather(self.heap, _buffer_name(kind, unit.name, version % self.slots),
               _alias(unit.full, unit.layout.padded_numel), unit.layout, self.owners)
        unit.gathered = True

    def _reshard(self, unit: _Unit) -> None:
        unit.full.untyped_storage().resize_(0)
        unit.gathered = False

    def _emit(self, kind: str, t0: float, **info: object) -> None:
        if self.trace is not None:
            self.trace(kind, t0, _now(), **info)

    # ---- outside minibatches ----------------------------------------------------------
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """The newest version's parameters, once every step begun is applied everywhere."""
        self.drain()
        self.heap.barrier(self.timeout_s)
        slot = (self.minibatch + 1) % self.slots
        out: dict[str, torch.Tensor] = {}
        for unit in self.units:
            flat = torch.empty(unit.layout.padded_numel, dtype=torch.float32, device=self.device)
            gather(self.heap, _buffer_name("master", unit.name, slot), flat, unit.layout, self.owners)
            for name, p, off in zip(unit.names, unit.params, unit.offsets, strict=True):
                out[name] = flat[off:off + p.numel()].view(p.shape).cpu().clone()
        self.heap.barrier(self.timeout_s)  # nobody closes the heap while a peer still reads it
        return out

    # ---- checkpoints (odc_core/checkpoint.py) ------------------------------------------
    def sharded_state(self, for_load: bool = False) -> dict[str, Any]:
        """The parameters and optimizer state in DCP's FSDP2 layout: each parameter by name as
        a ShardedTensor of the boxes this rank's flat shards hold, viewing the heap."""
        from odc_core.checkpoint import flat_pieces

        if self._model is None:
            raise RuntimeError("wrap() the model before saving or loading a checkpoint")
        if self.owners is not None:
            raise ValueError("checkpoints of hybrid-sharded ODC are not supported yet; save with shard=full")
        if for_load and self.minibatch >= 0:
            raise RuntimeError("load a checkpoint before the first minibatch")
        opt = self.optimizer
        _init_state(opt)
        slot = (self.minibatch + 1) % self.slots
        aliases: dict[int, list[str]] = {}
        for name, p in self._model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), []).append(name)
        model_sd: dict[str, Any] = {}
        optim_sd: dict[str, Any] = {}
        for unit in self.units:
            size = unit.layout.shard_numel
            lo = self.shard_index * size
            state = opt.state[unit.shard_param]
            for p, off, name in zip(unit.params, unit.offsets, unit.names, strict=True):
                n = p.numel()
                ranges = [(r, max(0, r * size - off), min(n, (r + 1) * size - off)) for r in range(self.world_size)]
                ranges = [(r, a, b) for r, a, b in ranges if a < b]
                a, b = max(off, lo), min(off + n, lo + size)

                mine = slice(a - lo, b - lo) if a < b else slice(0, 0)
                start = max(0, a - off)  # the parameter's first flat element this rank holds

                def piece(buf: torch.Tensor, name: str = name, shape: torch.Size = p.shape, mine: slice = mine,
                          start: int = start, ranges: list[tuple[int, int, int]] = ranges) -> torch.Tensor:
                    return flat_pieces(name, shape, buf[mine], start, ranges, self.rank)

                for alias in aliases[id(p)]:
                    model_sd[alias] = piece(unit.master[slot])
                optim_sd[name] = {k: piece(v) if torch.is_tensor(v) and v.numel() == size else v.detach().clone()
                                  for k, v in state.items()}
        for name, buf in self._model.state_dict().items():  # persistent buffers, replicated
            if name not in model_sd:
                model_sd[name] = buf
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": list(optim_sd)} for g in opt.param_groups]
        return {"model": model_sd, "optim": {"state": optim_sd, "param_groups": groups}}

    def load_sharded_state(self, state: dict[str, Any]) -> None:
        """After DCP has loaded into sharded_state(for_load=True)'s views: what is not a view
        (scalars, hyperparameters, buffers) is applied, and the version published to peers."""
        assert self._model is not None
        opt = self.optimizer
        loaded = state["optim"]
        for key, value in loaded["param_groups"][0].items():
            if key != "params":
                opt.param_groups[0][key] = value
        for unit in self.units:
            first = loaded["state"][unit.names[0]]
            for key, value in opt.state[unit.shard_param].items():
                if torch.is_tensor(value) and value.numel() != unit.layout.shard_numel:
                    value.copy_(first[key])
            if unit.shadow is not None:
                unit.shadow[0].copy_(unit.master[0])
        buffers = {n for n, _ in self._model.named_buffers()}
        self._model.load_state_dict({n: v for n, v in state["model"].items() if n in buffers}, strict=False)
        self.heap.barrier(self.timeout_s)  # nobody gathers a shard before its owner has loaded it

    def close(self) -> None:
        self._closing.set()  # a prefetch thread waiting on a dead peer stops now
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._pool is not None:
            # After a failure a queued gather would only wait out its timeout on a dead peer.
            self._pool.shutdown(wait=True, cancel_futures=True)
        self.heap.close()
        if self._replicas is not None:
            group, self._replicas = self._replicas, None
            dist.destroy_process_group(group)


def build(ctx: EngineContext, options: OdcOptions) -> OdcEngine:
    heap = make_heap(options.transport, ctx.device.type, dist.get_rank(), dist.get_world_size(), ctx.job_id,
                     ctx.store, ctx.timeout_s)
    return OdcEngine(ctx.device, heap, ctx.precision, options.prefetch, ctx.timeout_s, options.staleness,
                     shard_group_size(options.shard, options.ranks_per_node, dist.get_world_size()))


def _init_state(opt: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer its state (a step at learning rate 0 on zero gradients), so that
    a checkpoint can be loaded into it."""
    if opt.state:
        return
    lrs = [g["lr"] for g in opt.param_groups]
    for g in opt.param_groups:
        g["lr"] = 0.0
        for p in g["params"]:
            p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    for g, lr in zip(opt.param_groups, lrs, strict=True):
        g["lr"] = lr
