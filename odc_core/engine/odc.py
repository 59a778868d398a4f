"""On-demand communication (ODC): FSDP's sharded layout without per-layer collectives.

Each unit's parameters live as one flat vector split into equal shards, one per rank, in
the symmetric heap. A rank gathers a unit's full parameters from the owners just before the
unit's forward and again before its backward (one-sided gets; owners do nothing), and right
after the unit's backward pushes each gradient slice into its owner's fp32 accumulator
(one-sided adds). Nothing in between waits for another rank's progress, so ranks may run
different numbers of microbatches.

Synchronisation, once per minibatch k, through two int64 flags every rank publishes:
- DONE = k + 1 when the rank has pushed all its gradients of minibatch k. finish_minibatch()
  publishes it and waits for every peer's: the only barrier.
- VERSION = k + 1 when the rank's shards hold the parameters for minibatch k and its
  accumulators are zeroed. begin_minibatch() publishes it after the optimizer step; a
  gatherer waits for an owner's VERSION before its first read of minibatch k. A fast rank can
  therefore start minibatch k + 1 as soon as the owners it reads from have stepped, with no
  second barrier. Pushes of minibatch k + 1 cannot reach an accumulator early either: a
  rank only pushes a unit's gradients after gathering that unit from the same owners.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from time import perf_counter as _now

import torch
import torch.distributed as dist
from torch import nn

from odc_core.engine.base import EngineContext, TraceHook
from odc_core.engine.registry import OdcOptions
from odc_core.primitives import ShardLayout, gather, scatter_accumulate
from odc_core.transport.base import SymmetricHeap
from odc_core.transport.registry import make_heap

FLAGS = "odc/flags"
VERSION, DONE = 0, 1
CLAIMS = "odc/claims"  # rank 0's work counter for run-time balancing (dynamic)


def _alias(storage_owner: torch.Tensor, numel: int) -> torch.Tensor:
    """A tensor over the same storage with its own autograd version counter.

    Writing the gathered parameters through it does not bump the version counter of the
    parameter views that autograd saved for backward: their values are meant to come back.
    """
    return torch.empty(0, dtype=storage_owner.dtype, device=storage_owner.device).set_(
        storage_owner.untyped_storage(), 0, (numel,), (1,))


@dataclass
class _Unit:
    index: int
    name: str
    module: nn.Module
    params: list[nn.Parameter]
    names: list[str]
    layout: ShardLayout
    full: torch.Tensor                  # unsharded flat parameters, compute dtype; storage freed when resharded
    master: torch.Tensor                # heap: this rank's fp32 shard
    shadow: torch.Tensor | None         # heap: the shard in the compute dtype, when that is not fp32
    acc: torch.Tensor                   # heap: this rank's fp32 gradient accumulator
    shard_param: nn.Parameter           # what the optimizer steps: shares storage with `master`
    grad: torch.Tensor | None = None    # flat gradient of the current backward, compute dtype
    gathered: bool = False
    pending: Future | None = None
    grads_ready: int = 0
    input_done: bool = False
    takes_grad_input: bool = False
    offsets: list[int] = field(default_factory=list)

    @property
    def gather_name(self) -> str:
        return f"odc/{'shadow' if self.shadow is not None else 'master'}/{self.name}"

    @property
    def acc_name(self) -> str:
        return f"odc/acc/{self.name}"


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
                 prefetch: bool = True, timeout_s: float = 120.0) -> None:
        self.device = device
        self.heap = heap
        self.rank, self.world_size = heap.rank, heap.world_size
        self.compute_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.prefetch = prefetch
        self.timeout_s = timeout_s
        self.trace: TraceHook | None = None
        self.units: list[_Unit] = []
        self.minibatch = -1
        self._ready: list[int] = [0] * self.world_size  # highest VERSION seen per owner
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="odc-prefetch") if prefetch else None
        self._handles: list = []

    @property
    def heap_bytes(self) -> int:
        return self.heap.heap_bytes

    # ---- set-up -------------------------------------------------------------------------
    def wrap(self, model: nn.Module, units: Sequence[nn.Module]) -> nn.Module:
        names = {id(p): n for n, p in model.named_parameters()}
        seen: set[int] = set()
        for index, module in enumerate(units):
            params = [p for p in module.parameters() if id(p) not in seen]
            seen.update(id(p) for p in params)
            self.units.append(self._shard_unit(index, module, params, [names[id(p)] for p in params]))
        missing = [n for n, p in model.named_parameters() if id(p) not in seen]
        if missing:
            raise ValueError(f"parameters outside every unit cannot be sharded: {missing[:3]}")
        self.heap.alloc(FLAGS, 2, torch.int64)
        self.heap.alloc(CLAIMS, 1, torch.int64)
        self.heap.barrier(self.timeout_s)  # every shard is initialised before anyone gathers
        for unit in self.units:
            self._register_hooks(unit)
        return model

    def _shard_unit(self, index: int, module: nn.Module, params: list[nn.Parameter],
                    names: list[str]) -> _Unit:
        numel = sum(p.numel() for p in params)
        layout = ShardLayout(numel, self.world_size)
        name = f"u{index}"
        master = self.heap.alloc(f"odc/master/{name}", layout.shard_numel, torch.float32)
        shadow = None
        if self.compute_dtype != torch.float32:
            shadow = self.heap.alloc(f"odc/shadow/{name}", layout.shard_numel, self.compute_dtype)
        acc = self.heap.alloc(f"odc/acc/{name}", layout.shard_numel, torch.float32)
        flat = torch.zeros(layout.padded_numel, dtype=torch.float32, device=self.device)
        offsets, offset = [], 0
        for p in params:
            flat[offset:offset + p.numel()].copy_(p.detach().reshape(-1))
            offsets.append(offset)
            offset += p.numel()
        lo = self.rank * layout.shard_numel
        master.copy_(flat[lo:lo + layout.shard_numel])
        if shadow is not None:
            shadow.copy_(master)
        full = torch.empty(layout.padded_numel, dtype=self.compute_dtype, device=self.device)
        for p, off in zip(params, offsets, strict=True):
            p.data = full[off:off + p.numel()].view(p.shape)
        full.untyped_storage().resize_(0)
        shard_param = nn.Parameter(master, requires_grad=True)
        return _Unit(index, name, module, params, names, layout, full, master, shadow, acc, shard_param,
                     offsets=offsets)

    def _register_hooks(self, unit: _Unit) -> None:
        self._handles.append(unit.module.register_forward_pre_hook(
            lambda _m, args, u=unit: self._pre_forward(u, args)))
        self._handles.append(unit.module.register_forward_hook(
            lambda _m, _args, out, u=unit: self._post_forward(u, out)))
        for p in unit.params:
            self._handles.append(p.register_post_accumulate_grad_hook(
                lambda _p, u=unit: self._param_grad_done(u)))

    def optimizer(self, lr: float, betas: tuple[float, float], eps: float,
                  weight_decay: float) -> torch.optim.Optimizer:
        """AdamW over this rank's own fp32 shards: optimizer state is sharded like FSDP's."""
        return torch.optim.AdamW([u.shard_param for u in self.units], lr=lr, betas=betas, eps=eps,
                                 weight_decay=weight_decay)

    # ---- the minibatch protocol ------------------------------------------------------
    def begin_minibatch(self) -> None:
        """Publish this rank's shards for the new minibatch: nothing here waits for a peer."""
        self.minibatch += 1
        for unit in self.units:
            unit.acc.zero_()
            unit.shard_param.grad = unit.acc
            if unit.shadow is not None:
                unit.shadow.copy_(unit.master)
        self.heap.store(FLAGS, VERSION, self.minibatch + 1)

    def finish_minibatch(self) -> None:
        """The one synchronisation: every rank's gradients have landed in their owners."""
        for unit in self.units:
            if unit.grad is not None:
                raise RuntimeError(f"unit {unit.name}: backward finished without pushing its gradients")
        self.heap.quiet()
        self.heap.store(FLAGS, DONE, self.minibatch + 1)
        for peer in range(self.world_size):
            self.heap.wait_until(FLAGS, peer, DONE, self.minibatch + 1, self.timeout_s)

    def claim(self) -> int:
        """Take the next ticket of the run's shared work counter: one atomic add on rank 0's
        heap, which rank 0 takes no part in."""
        return self.heap.fetch_add(CLAIMS, 0, 0, 1)

    # ---- hooks ------------------------------------------------------------------------
    def _pre_forward(self, unit: _Unit, args: tuple):
        self._ensure_gathered(unit)
        if unit.index + 1 < len(self.units):
            self._prefetch(self.units[unit.index + 1])
        x = args[0] if args else None
        unit.takes_grad_input = torch.is_tensor(x) and x.requires_grad
        if unit.takes_grad_input:
            return (_AfterBackward.apply(x, self, unit.index), *args[1:])
        return None

    def _post_forward(self, unit: _Unit, output) -> None:
        if unit.index + 1 < len(self.units):
            self._reshard(unit)  # the last unit's backward starts at once: keep it
        if torch.is_tensor(output) and output.requires_grad:
            output.register_hook(lambda _g, u=unit: self._pre_backward(u))

    def _pre_backward(self, unit: _Unit) -> None:
        self._ensure_gathered(unit)
        unit.grad = torch.zeros(unit.layout.padded_numel, dtype=self.compute_dtype, device=self.device)
        for p, off in zip(unit.params, unit.offsets, strict=True):
            # Autograd accumulates into an existing .grad in place, so the flat buffer fills
            # up without a copy and is pushed as it is.
            p.grad = unit.grad[off:off + p.numel()].view(p.shape)
        unit.grads_ready, unit.input_done = 0, False
        if unit.index > 0:
            self._prefetch(self.units[unit.index - 1])

    def _param_grad_done(self, unit: _Unit) -> None:
        unit.grads_ready += 1
        self._maybe_push(unit)

    def _input_grad_done(self, index: int) -> None:
        unit = self.units[index]
        unit.input_done = True
        self._maybe_push(unit)

    def _maybe_push(self, unit: _Unit) -> None:
        """Push once the unit's backward is over: all its parameter gradients have
        accumulated and (when it has one) the gradient of its input has left it."""
        if unit.grads_ready < len(unit.params) or (unit.takes_grad_input and not unit.input_done):
            return
        assert unit.grad is not None, "_pre_backward gave the unit its flat gradient"
        t0 = _now()
        scatter_accumulate(self.heap, unit.acc_name, unit.grad, unit.layout)
        self._emit("push", t0, unit=unit.name)
        for p in unit.params:
            p.grad = None
        unit.grad = None
        self._reshard(unit)

    # ---- gathering --------------------------------------------------------------------
    def _ensure_gathered(self, unit: _Unit) -> None:
        if unit.pending is not None:
            t0 = _now()
            unit.pending.result()
            unit.pending = None
            self._emit("prefetch_wait", t0, unit=unit.name)
        if not unit.gathered:
            t0 = _now()
            self._gather(unit)
            self._emit("gather", t0, unit=unit.name)

    def _prefetch(self, unit: _Unit) -> None:
        if self._pool is None or unit.gathered or unit.pending is not None:
            return
        unit.pending = self._pool.submit(self._gather, unit)

    def _gather(self, unit: _Unit) -> None:
        storage = unit.full.untyped_storage()
        storage.resize_(unit.layout.padded_numel * unit.full.element_size())
        needed = self.minibatch + 1
        for owner in range(self.world_size):
            if self._ready[owner] < needed:
                t0 = _now()
                self.heap.wait_until(FLAGS, owner, VERSION, needed, self.timeout_s)
                self._ready[owner] = needed
                self._emit("wait", t0, unit=unit.name, peer=owner)
        gather(self.heap, unit.gather_name, _alias(unit.full, unit.layout.padded_numel), unit.layout)
        unit.gathered = True

    def _reshard(self, unit: _Unit) -> None:
        unit.full.untyped_storage().resize_(0)
        unit.gathered = False

    def _emit(self, kind: str, t0: float, **info: object) -> None:
        if self.trace is not None:
            self.trace(kind, t0, _now(), **info)

    # ---- outside minibatches ----------------------------------------------------------
    def full_parameters(self) -> dict[str, torch.Tensor]:
        self.heap.barrier(self.timeout_s)
        out: dict[str, torch.Tensor] = {}
        for unit in self.units:
            flat = torch.empty(unit.layout.padded_numel, dtype=torch.float32, device=self.device)
            gather(self.heap, f"odc/master/{unit.name}", flat, unit.layout)
            for name, p, off in zip(unit.names, unit.params, unit.offsets, strict=True):
                out[name] = flat[off:off + p.numel()].view(p.shape).cpu().clone()
        self.heap.barrier(self.timeout_s)  # nobody closes the heap while a peer still reads it
        return out

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._pool is not None:
            # After a failure a queued gather would only wait out its timeout on a dead peer.
            self._pool.shutdown(wait=True, cancel_futures=True)
        self.heap.close()


def build(ctx: EngineContext, options: OdcOptions) -> OdcEngine:
    heap = make_heap(options.transport, ctx.device.type, dist.get_rank(), dist.get_world_size(), ctx.job_id,
                     ctx.store, ctx.timeout_s)
    return OdcEngine(ctx.device, heap, ctx.precision, options.prefetch, ctx.timeout_s)
