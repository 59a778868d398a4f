"""A flat unit: the parameters of one sharding unit (or of several that share a parameter) as
one flat vector, its shards in the symmetric heap, and the state of its unsharded copy.

Like FSDP2's FSDPParam and FSDPParamGroup together, minus the communication: fetch.py moves
the bytes, versions.py decides when they may move.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from odc_core.engine.base import placeholders, refuse_written_in_place
from odc_core.engine.sharing import sharing_groups, unit_parameters
from odc_core.primitives import ShardLayout
from odc_core.transport.base import SymmetricHeap


class Storage(enum.Enum):
    """Where a unit's unsharded parameters are."""

    SHARDED = enum.auto()   # only the shards exist: the flat buffer's storage is freed
    FETCHING = enum.auto()  # a prefetch is filling it (its handle is FlatUnit.pending)
    GATHERED = enum.auto()  # complete: the module's parameters can be read


class Backward(enum.Enum):
    """Where a unit is in a microbatch's backward."""

    IDLE = enum.auto()      # no backward due: evaluation, or its gradients are pushed
    ARMED = enum.auto()     # a forward with gradients ran: its backward's first hook sets it up
    RUNNING = enum.auto()   # autograd is accumulating into its flat gradient buffer


def buffer_name(kind: str, unit: str, slot: int) -> str:
    return f"odc/{kind}/{unit}/{slot}"


def alias(storage_owner: torch.Tensor, numel: int) -> torch.Tensor:
    """A tensor over the same storage with its own autograd version counter.

    Writing the gathered parameters through it does not bump the version counter of the
    parameter views that autograd saved for backward: their values are meant to come back.
    """
    return torch.empty(0, dtype=storage_owner.dtype, device=storage_owner.device).set_(
        storage_owner.untyped_storage(), 0, (numel,), (1,))


@dataclass
class Piece:
    """A run [lo, hi) of this rank's shard whose parameters are all in one optimizer group and
    all trainable or all frozen: what the optimizer steps, its data a view of the newest
    version's slot and its gradient the accumulator's (versions.py re-points both at every
    step). A frozen piece is in its group with no gradient, so the optimizer never steps it and
    keeps no state for it, as for a frozen parameter under FSDP2."""

    lo: int
    hi: int
    group: int
    param: nn.Parameter
    frozen: bool = False


@dataclass(repr=False)
class FlatUnit:
    """One flat group of parameters: a unit's, or several units' that share a parameter."""

    index: int
    name: str
    modules: list[int]                  # positions of its units in the order wrap() was given them
    params: list[nn.Parameter]
    names: list[str]
    offsets: list[int]                  # each parameter's first element in the flat vector
    layout: ShardLayout
    full: torch.Tensor                  # unsharded flat parameters, compute dtype; storage freed when SHARDED
    master: list[torch.Tensor]          # heap: this rank's fp32 shard, one slot per live version
    shadow: list[torch.Tensor] | None   # heap: the slots in the compute dtype, when that is not fp32
    acc: list[torch.Tensor]             # heap: gradient accumulators (reduce dtype), one per minibatch in flight
    shard_index: int                    # which shard of the layout this rank owns
    pieces: list[Piece]                 # the shard cut by optimizer group, covering it whole (split())
    # Whether each parameter required a gradient at wrap(): a frozen one is gathered, never
    # pushed or stepped.
    trainable: list[bool]
    storage: Storage = Storage.SHARDED
    backward: Backward = Backward.IDLE
    pending: Any = None                 # the prefetch filling `full` while FETCHING (fetch.py's handle)
    grad: torch.Tensor | None = None    # flat gradient of the current backward, compute dtype
    grads_ready: int = 0
    grads_due: int = 0                  # the trainable parameters this backward pass gives a gradient (hooks.py)
    # Gradients of its units' inputs still to leave them in this backward: until they have, the
    # units' backward still reads the gathered parameters.
    inputs_pending: int = 0
    # Input hooks its forwards registered since it last pushed: what a later backward through
    # the same forward (retain_graph) waits for again.
    inputs_hooked: int = 0
    # The backward pass (autograd graph task) that pushed its gradients in this minibatch, if any:
    # a gradient reaching it from a later pass is a backward through the same forward again.
    pushed_in: int | None = None
    # Each parameter's view of `full`, made once (its storage is resized, never replaced).
    views: list[torch.Tensor] = field(default_factory=list)
    # Whether the parameters hold placeholders (hide()) rather than their views of `full`.
    hidden: bool = False
    # Their placeholders' values, one NaN per parameter (base.placeholders): one that is not NaN
    # was written while hidden, which the shards never see. And the placeholders themselves.
    absent: torch.Tensor | None = None
    stand_ins: list[torch.Tensor] = field(default_factory=list)
    # Its units inside their forward now, and whether its last unit's forward has run since the
    # group was last freed after a forward (hooks.py's post_forward).
    forwards_open: int = 0
    last_ran: bool = False
    # Each parameter's autograd version counter when the flat buffer was last gathered: an
    # in-place write to the gathered copy (nn.Embedding's max_norm, arithmetic under
    # torch.no_grad() in a forward) moves it, and the write is gone once the buffer is freed.
    seen: list[int] = field(default_factory=list)

    def __repr__(self) -> str:
        # Not the dataclass's field by field: printing `full` while its storage is freed reads
        # memory it no longer has and crashed the process (pytest prints a failing hook's unit).
        return (f"FlatUnit({self.name}: {', '.join(self.names)}; {self.layout.numel} elements over "
                f"{self.layout.world_size} owners, {self.storage.name.lower()}, backward {self.backward.name.lower()})")

    def materialize(self) -> torch.Tensor:
        """Allocate the flat buffer's storage, the parameters views of it again; a view to
        gather into."""
        self.full.untyped_storage().resize_(self.layout.padded_numel * self.full.element_size())
        if self.hidden:
            for p, view in zip(self.params, self.views, strict=True):
                p.data = view
            self.hidden = False
        self.seen = [p._version for p in self.params]
        return alias(self.full, self.layout.padded_numel)

    # Opaque to Dynamo, as hide() is: the version counters must be read when the hook runs, not
    # when a compiled unit was traced.
    @torch.compiler.disable
    def release(self) -> None:
        """free() after a forward or backward, refusing a write to the gathered parameters that
        freeing loses: the shards, where the parameters live, never saw it."""
        written = None
        if self.storage is not Storage.SHARDED:
            written = next((n for n, p, v in zip(self.names, self.params, self.seen, strict=True) if p._version != v),
                           None)
        self.free()
        if written is not None:
            refuse_written_in_place(written, "ODC")

    def free(self) -> None:
        """Free the flat buffer's storage; the parameters hold their placeholders meanwhile."""
        self.full.untyped_storage().resize_(0)
        self.storage = Storage.SHARDED
        self.hide()

    # Opaque to Dynamo, which runs these hooks in a compiled unit: traced, the swaps could come
    # before the graph that computes with the parameters, which then met a placeholder's strides.
    @torch.compiler.disable
    def hide(self) -> None:
        """Wherever the flat buffer's storage is freed, each parameter holds NaN in its shape (its
        element of `absent`) instead of a view of the freed buffer, whose reading or writing
        crashed the process: print(p) between minibatches, an L2 penalty over model.parameters()
        between a forward and its backward, a write between microbatches. Autograd saved the
        parameters themselves, not their data, and a unit's backward gathers them back
        (materialize) before its first node reads them. Two swaps of tensors made once, per
        parameter and use."""
        if self.storage is Storage.SHARDED and not self.hidden:
            if self.absent is None:
                self.absent = placeholders(len(self.params), self.full.dtype, self.full.device)
                self.stand_ins = [self.absent[j].expand(p.shape) for j, p in enumerate(self.params)]
            for p, stand_in in zip(self.params, self.stand_ins, strict=True):
                p.data = stand_in
            self.hidden = True

    def gather_source(self, slot: int) -> str:
        """The heap buffer peers gather: the compute-dtype shadow when there is one."""
        return buffer_name("shadow" if self.shadow is not None else "master", self.name, slot)

    def attach_grad(self, grad: torch.Tensor) -> None:
        """Point every trainable parameter's .grad at its view of `grad`: autograd accumulates
        into an existing .grad in place, so the flat buffer fills up without a copy. A frozen
        parameter's part stays zero."""
        self.grad = grad
        for p, off, trainable in zip(self.params, self.offsets, self.trainable, strict=True):
            if trainable:
                p.grad = grad[off:off + p.numel()].view(p.shape)

    def detach_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self.grad = None

    def local_range(self, j: int) -> tuple[int, int]:
        """Parameter j's elements in this rank's shard: [a, b) in shard coordinates (a >= b: none)."""
        size = self.layout.shard_numel
        lo = self.shard_index * size
        return max(self.offsets[j], lo) - lo, min(self.offsets[j] + self.params[j].numel(), lo + size) - lo

    @property
    def trainable_count(self) -> int:
        return sum(self.trainable)

    def split(self, group_of: list[int], slot: int) -> None:
        """Cut this rank's shard into runs of consecutive parameters in the same optimizer group
        (group_of[j]: parameter j's) and all trainable or all frozen; the padding goes with the
        last run, and a shard of padding only with the unit's last parameter's run, so every
        rank steps every trainable element it owns. Each run is one optimizer parameter over
        `slot`'s master shard: per-parameter options cost one tensor per change of group, not
        one per parameter, and the elementwise optimizers step the same values either way."""
        starts: list[tuple[int, tuple[int, bool]]] = []  # (first element in the shard, (group, frozen))
        for j, group in enumerate(group_of):
            a, b = self.local_range(j)
            key = (group, not self.trainable[j])
            if a < b and (not starts or starts[-1][1] != key):
                starts.append((a, key))
        if not starts:
            starts = [(0, (group_of[-1], not self.trainable[-1]))]
        # The first run starts at 0: the shard's first element is in its first parameter.
        ends = [a for a, _ in starts[1:]] + [self.layout.shard_numel]
        self.pieces = [Piece(a, end, group, nn.Parameter(self.master[slot][a:end]), frozen)
                       for (a, (group, frozen)), end in zip(starts, ends, strict=True)]

    def point(self, version_slot: int, acc_slot: int) -> None:
        """Each piece steps version_slot's master shard with acc_slot's accumulated gradients (in
        fp32: a lower-precision accumulator is converted)."""
        for piece in self.pieces:
            piece.param.data = self.master[version_slot][piece.lo:piece.hi]  # optimizers key state by parameter
            grad = self.acc[acc_slot][piece.lo:piece.hi]
            piece.param.grad = None if piece.frozen else grad if grad.dtype == torch.float32 else grad.float()

    def piece_at(self, a: int) -> Piece:
        """The piece holding shard element a."""
        return next(piece for piece in self.pieces if piece.lo <= a < piece.hi)


def flat_groups(model: nn.Module, units: list[nn.Module]) -> tuple[list[nn.Module], list[list[int]],
                                                                   list[list[nn.Parameter]]]:
    """The modules to hook (the units, and the model as the root when it holds parameters no
    unit does: FSDP2's convention, last in order so nothing prefetches it), and for each flat
    group its modules' positions and its parameters, each parameter once. Units sharing a
    parameter (tied embeddings) share one group (sharing.py)."""
    modules = list(units)
    if all(u is not model for u in modules) and unit_parameters([*modules, model])[-1]:
        modules.append(model)
    held = unit_parameters(modules)
    seen: set[int] = set()
    groups, params_of = [], []
    for group in sharing_groups(held):
        params: list[nn.Parameter] = []
        for p in (p for pos in group for p in held[pos]):
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        if params:  # a unit with no parameters of its own has nothing to gather
            groups.append(group)
            params_of.append(params)
    return modules, groups, params_of


def shard_unit(heap: SymmetricHeap, index: int, modules: list[int], params: list[nn.Parameter], names: list[str],
               *, owners: int, shard_index: int, slots: int, compute_dtype: torch.dtype,
               reduce_dtype: torch.dtype = torch.float32, device: torch.device) -> FlatUnit:
    """Allocate a group's heap buffers (collective over the ranks), put this rank's shard of
    the parameters in version slot 0, and make the parameters views of a freed flat buffer."""
    # A group whose parameters hold no elements (a zero-size placeholder parameter, the root's
    # only one) is laid out as one element of padding per owner: no transport allocates an
    # empty buffer, and the parameters stay in the engine's state dicts and full parameters.
    layout = ShardLayout(max(1, sum(p.numel() for p in params)), owners)
    name = f"u{index}"
    master = [heap.alloc(buffer_name("master", name, j), layout.shard_numel, torch.float32) for j in range(slots)]
    shadow = None
    if compute_dtype != torch.float32:
        shadow = [heap.alloc(buffer_name("shadow", name, j), layout.shard_numel, compute_dtype)
                  for j in range(slots)]
    acc = [heap.alloc(buffer_name("acc", name, j), layout.shard_numel, reduce_dtype) for j in range(slots)]
    flat = torch.zeros(layout.padded_numel, dtype=torch.float32, device=device)
    offsets, offset = [], 0
    for p in params:
        flat[offset:offset + p.numel()].copy_(p.detach().reshape(-1))
        offsets.append(offset)
        offset += p.numel()
    lo = shard_index * layout.shard_numel
    master[0].copy_(flat[lo:lo + layout.shard_numel])
    if shadow is not None:
        shadow[0].copy_(master[0])
    full = torch.empty(layout.padded_numel, dtype=compute_dtype, device=device)
    views = [full[off:off + p.numel()].view(p.shape) for p, off in zip(params, offsets, strict=True)]
    for p, view in zip(params, views, strict=True):
        p.data = view
    unit = FlatUnit(index, name, modules, params, names, offsets, layout, full, master, shadow, acc, shard_index,
                    [], [p.requires_grad for p in params], views=views)
    unit.split([0] * len(params), 0)
    unit.free()
    return unit
