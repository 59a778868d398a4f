"""The collective baseline: torch's FSDP2 (fully_shard) per unit plus the root, unmodified.

Which process group FSDP2 runs on is the engine's `backend` option. On CPU the default is
`shm`: a process group whose all-gathers and reduce-scatters move bytes through the same
shared memory as the ODC engine (odc_core/transport/shm_group.py), so that the two engines
differ in how they synchronise (a barrier per collective against one per minibatch) and not
in how fast their bytes move. `gloo` (TCP over loopback, milliseconds per call) stays
selectable for the record: against it ODC would win on transport alone. On CUDA the
default is NCCL, the paper's baseline.

Hybrid sharding (`shard=hybrid`, nodes of `ranks_per_node` consecutive ranks) is FSDP2's own
HSDP: fully_shard on a 2D device mesh ("replicate", "shard"), parameters sharded over a node's
ranks and all-reduced across the nodes. On the shm backend the mesh is built from shm groups
of its own, one per node and one per set of replicas (DeviceMesh.from_group), so HSDP's
reduce-scatters stay on shared memory like full sharding's; its all-reduces run on each shm
group's inner gloo backend, which is what that group does with every call it does not override.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping, Sequence
from time import perf_counter
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp import _common_utils as _fsdp_common
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_leaves, tree_map_only

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
    check_state_keys,
    check_state_shape,
    check_wrap,
    configured,
    group_options,
    parameter_ids,
    reduction_device,
    refuse_create_graph,
    refuse_written_in_place,
)
from odc_core.engine.closing import peer_closed, tell_peers
from odc_core.engine.outputs import Walk, check_output, grad_outputs, unit_labels
from odc_core.engine.rank0 import skeleton_from_rank0
from odc_core.engine.registry import Backend, CollectiveOptions, shard_group_size
from odc_core.engine.sharing import check_units, sharing_groups, unit_parameters


class CollectiveEngine:
    """Per-unit all-gather before forward and backward, reduce-scatter after backward.

    Every one of those collectives is a barrier across ranks, so all ranks must run the same
    number of microbatches; the worker checks the plan before starting.
    """

    name = "collective"

    def __init__(self, device: torch.device, precision: str | MixedPrecision = "fp32",
                 reshard_after_forward: bool = True, backend: Backend = "auto", *, job_id: str = "collective",
                 timeout_s: float = 120.0, shard_group: int | None = None, store: dist.Store) -> None:
        self.device = device
        self.store = store  # through which wrap() and configure_optimizer() check that the ranks agree
        self.backend = CollectiveOptions(backend=backend).for_device(device.type).backend
        self.job_id, self.timeout_s = job_id, timeout_s
        self.groups: list[dist.ProcessGroup] = []  # the shm groups this engine made
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        # Ranks a unit is sharded over: all, or (hybrid sharding, HSDP) one node's.
        self.shard_group = self.world_size if shard_group is None else shard_group
        if self.shard_group < 1 or self.world_size % self.shard_group:
            raise ValueError(f"a shard group of {self.shard_group} ranks does not divide {self.world_size} ranks "
                             f"into nodes")
        # FSDP2 divides reduced gradients by the world size, and gloo cannot run the
        # pre-multiplied sum that set_gradient_divide_factor(1) needs, so the worker scales
        # its loss instead; the result is the plain sum of gradients, as with ODC.
        self.loss_scale = float(self.world_size)
        self.policy = MixedPrecision.of(precision)
        self.reshard_after_forward = reshard_after_forward
        self.trace: TraceHook | None = None
        self.clock: Clock = perf_counter
        self.model: nn.Module | None = None
        self.wrapped: dict[str, tuple[int, torch.dtype]] = {}  # parameter_ids at wrap(): the sharded DTensor parameters
        self._step: OptimizerStep | None = None
        # Where this rank stands: the minibatch, its microbatches so far, and whether it is in one.
        self._minibatch, self._microbatches, self._inside = -1, 0, False
        self._closed = False
        # The minibatch of the backward pass under way through the model's output, until autograd
        # runs the callback queued at its start; still set outside any pass, an exception cut it short.
        self._backward_in: int | None = None

    def _mesh(self) -> DeviceMesh:
        """1D over every rank, or (hybrid) 2D: replicas across nodes by shard within a node."""
        nodes, group = self.world_size // self.shard_group, self.shard_group
        if self.backend != "shm":  # the default group, which the worker created with this backend
            if nodes == 1:
                return init_device_mesh(self.device.type, (self.world_size,))
            return init_device_mesh(self.device.type, (nodes, group), mesh_dim_names=("replicate", "shard"))
        from odc_core.transport.shm_group import new_shm_group

        # DeviceMesh equality ignores the mesh's process groups, so DTensor's caches would hand a
        # later engine's mesh the groups of an earlier one, closed with it (a second engine in one
        # process): dimension names with this engine's job id keep the meshes apart.
        names = (f"replicate.{self.job_id}", f"shard.{self.job_id}")
        if nodes == 1:
            self.groups = [new_shm_group(self.job_id, self.timeout_s)]
            return DeviceMesh.from_group(self.groups[0], self.device.type, mesh_dim_names=names[1:])
        # new_group is collective over every rank: every rank makes every group, in one order,
        # and keeps the two it is in. Each group names its segments after its own job id.
        layout = torch.arange(self.world_size).view(nodes, group)
        rank = dist.get_rank()
        mine: dict[str, dist.ProcessGroup] = {}
        for node in range(nodes):
            made = new_shm_group(f"{self.job_id}.n{node}", self.timeout_s, layout[node].tolist())
            if rank // group == node:
                mine["shard"] = made
        for index in range(group):
            made = new_shm_group(f"{self.job_id}.r{index}", self.timeout_s, layout[:, index].tolist())
            if rank % group == index:
                mine["replicate"] = made
        self.groups = [mine["replicate"], mine["shard"]]
        return DeviceMesh.from_group(self.groups, self.device.type, layout, mesh_dim_names=names)

    def wrap(self, model: nn.Module, units: Sequence[nn.Module]) -> nn.Module:
        check_wrap(model, self.model)
        # The model itself among the units is the root, sharded last below.
        units = [u for u in check_units(model, units) if u is not model]
        settings = {"engine": "collective", "precision": precision_name(self.policy), "backend": self.backend,
                    "shard group": self.shard_group, "reshard_after_forward": self.reshard_after_forward}
        check_ranks_agree(self.store, self.job_id, dist.get_rank(), self.world_size, self.timeout_s,
                          description(model, units, settings))
        warn_if_values_differ(self.store, self.job_id, dist.get_rank(), self.world_size, self.timeout_s, model)
        labels = unit_labels(model)  # before fully_shard renames the classes (FSDP<name>)
        sparse = [m for m in model.modules()
                  if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse and m.weight.requires_grad]
        if sparse:
            # FSDP2 reduce-scatters dense gradients only: a sparse one ends the first backward in
            # "Could not run 'fsdp::chunk_cat' with arguments from the 'SparseCPU' backend".
            raise ValueError(f"{labels[id(sparse[0])]} makes sparse gradients (sparse=True), which FSDP2 cannot "
                             f"reduce-scatter; build it with sparse=False, or use engine odc")
        _refuse_gradient_hooks(model, sharded=False)
        _lay_out_contiguously(model)
        mesh = self._mesh()
        mp = _fsdp2_policy(self.policy)
        # Units that share a parameter (tied embeddings), with each other or with the root's own
        # modules (`model.w = model.layers[0].weight`), are not sharded on their own: FSDP2 allows
        # a parameter in one group only, so the shared one falls to the root's group with the rest
        # of those units' parameters, gathered for the whole forward and backward.
        # Inner units first, as FSDP2 needs (fully_shard of an outer module takes the parameters no
        # inner one has taken): a unit listed before a unit inside it (a layer, then its MLP)
        # failed in the first forward, "got mixed torch.Tensor and DTensor".
        holders = [*units, model]
        alone = _inner_first([holders[g[0]] for g in sharing_groups(unit_parameters(holders))
                              if len(g) == 1 and g[0] < len(units)])
        _check_one_dtype_per_group(model, alone, labels)
        for unit in alone:
            fully_shard(unit, mesh=mesh, mp_policy=mp, reshard_after_forward=self.reshard_after_forward)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=self.reshard_after_forward)
        for module in (*units, model):
            module.register_forward_hook(functools.partial(_check_output, labels[id(module)]), with_kwargs=True)
        _watch_writes(model, alone)
        # Ahead of FSDP2's own pre-forward hook (fully_shard prepended it): the count's check must
        # come before a microbatch's first all-gather.
        model.register_forward_pre_hook(self._microbatch_starts, prepend=True)
        _make_gather_buffers(model, alone)
        model.register_forward_hook(self._watch_backward)
        self.model, self.wrapped = model, parameter_ids(model)
        return model

    def configure_optimizer(self, factory: OptimizerFactory, *, scheduler: SchedulerFactory | None = None,
                            max_grad_norm: float | None = None, param_groups: ParamGroups | None = None) -> None:
        """The optimizer over this rank's DTensor shards, as an FSDP2 training loop builds it:
        param_groups' groups passed through as torch-style group dicts."""
        if self.model is None:
            raise RuntimeError("wrap() the model before configure_optimizer()")
        check_factories(factory, scheduler, param_groups)
        params: list[Any] = list(self.model.parameters())
        if param_groups is not None:
            named = dict(self.model.named_parameters())
            params = [{"params": [named[n] for n in names], **options}
                      for options, names in group_options(list(named.items()), param_groups)]
        step = OptimizerStep.build(params, factory, scheduler, max_grad_norm)
        check_ranks_agree(self.store, self.job_id, dist.get_rank(), self.world_size, self.timeout_s,
                          optimizer_description(step), OPTIMIZER_FIX)
        self._step = step

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return configured(self._step, "engine.optimizer").optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler | None:
        return configured(self._step, "engine.scheduler").scheduler

    def begin_minibatch(self) -> None:
        """FSDP2 synchronises inside every unit's forward and backward; here the microbatch count starts."""
        self._reshard()
        check_parameters(self.model, self.wrapped)
        if self.model is not None:
            _refuse_gradient_hooks(self.model, sharded=True)
        check_order("begin_minibatch", self._minibatch if self._inside else None, self._closed)
        configured(self._step, "begin_minibatch()")  # a minibatch that cannot be stepped is refused before it opens
        self._minibatch += 1
        self._microbatches, self._inside = 0, True

    def _microbatch_starts(self, _module: nn.Module, _args: tuple) -> None:
        if self._inside and torch.is_grad_enabled():
            self._refuse_cut_short()
            self._microbatches += 1
            self._agree(starting=True)

    def _watch_backward(self, _module: nn.Module, _args: tuple, output: object) -> None:
        if torch.is_grad_enabled():
            for t in grad_outputs(output, _FSDP2_WALK):
                t.register_hook(self._backward_begins)

    def _backward_begins(self, _grad: torch.Tensor) -> None:
        if torch.is_grad_enabled():  # the backward records a graph of itself: create_graph=True
            refuse_create_graph(f"the model ({type(self.model).__qualname__})", "FSDP2")
        if self._backward_in is None:
            self._backward_in = self._minibatch
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_ends)

    def _backward_ends(self) -> None:
        self._backward_in = None

    def _refuse_cut_short(self) -> None:
        """A RuntimeError, one line, where this rank's last backward through the model was cut
        short by an exception (an out-of-memory a loop catches to skip its microbatch): FSDP2 never
        reduce-scattered the units it had not reached, so this rank's next collectives would pair
        with its peers' reduce-scatters, and on one rank its state is left mid-backward; either way
        it trained on, away from one process, without an error. ODC keeps what such a backward
        computed, as one process keeps its .grad."""
        if self._backward_in is None or torch._C._current_graph_task_id() != -1:
            return
        cut, self._backward_in = self._backward_in, None
        raise RuntimeError(f"this rank's backward in minibatch {cut} was cut short by an exception, and FSDP2 cannot "
                           f"go on from it (the reduce-scatters of the units it did not reach would pair with its "
                           f"peers' next collectives); end the run here and resume from a checkpoint, or use engine "
                           f"odc, which keeps the gradients such a backward computed")

    def _agree(self, starting: bool) -> None:
        """Every rank must be at the same point: all starting their next microbatch, or all
        finishing the minibatch. FSDP2's collectives would otherwise pair across microbatch and
        minibatch boundaries and train wrong without an error. One all-gather of two integers,
        before the microbatch's first collective or the step's; the same on every rank while the
        counts agree, and on every rank an error naming each rank's count when they do not."""
        mine = torch.tensor([int(starting), self._microbatches], device=reduction_device(self.device))
        every = [torch.empty_like(mine) for _ in range(self.world_size)]
        try:
            dist.all_gather(every, mine)
        except Exception as e:  # a peer gone from the group: say which, when and why where it told
            why = self._peer_closed(f"its peers in minibatch {self._minibatch}")
            if why is None:
                raise
            raise RuntimeError(why) from e
        if all(int(other[0]) == int(starting) for other in every):
            return
        counts = ", ".join(f"rank {r} ran {'at least ' if int(s) else ''}{int(n)}" for r, (s, n) in enumerate(every))
        raise RuntimeError(f"collective FSDP needs every rank to run the same number of microbatches, but in "
                           f"minibatch {self._minibatch} {counts}; give every rank the same count, or use "
                           f"engine odc, whose ranks may run different counts")

    def finish_minibatch(self) -> float | None:
        """The optimizer step, once every rank has run as many microbatches as this one; nothing
        else to wait for: FSDP2's post-backward callback already waited for the last
        reduce-scatter. The gradient norm before clipping when it clips (base.py)."""
        check_order("finish_minibatch", self._minibatch if self._inside else None, self._closed)
        step, model = configured(self._step, "finish_minibatch()"), self.model
        assert model is not None
        self._refuse_cut_short()
        self._inside = False
        self._agree(starting=False)
        self._reshard()  # before clipping reads model.parameters() and the step changes the shards
        self._refuse_untouched(model)
        self._emit("sync", self.clock())  # a span of nothing, as a real and a simulated trace both have
        t0 = self.clock()
        # DTensor gradients: the norm's partial sums are reduced over the mesh inside.
        norm = step.apply(lambda max_norm: _value(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        self._emit("optimizer", t0)
        return norm

    def _refuse_untouched(self, model: nn.Module) -> None:
        """A RuntimeError, one line, where the minibatch ran microbatches and yet no trainable
        parameter holds a gradient, and the step trained nothing without a word: a loop that
        forgot loss.backward(), FSDP2's set_requires_gradient_sync(False), as a ported loop sets
        it for all but the last microbatch, left on through the last one (no reduce-scatter ran),
        or backward(inputs=model.parameters()), which names FSDP2's shards, not the unsharded
        parameters the graph uses. Every rank decides alike: the counts agree and the gradients
        come from reduce-scatters."""
        trainable = [p for p in model.parameters() if p.requires_grad]
        if self._microbatches and trainable and all(p.grad is None for p in trainable):
            raise RuntimeError(f"minibatch {self._minibatch} ran {self._microbatches} microbatch"
                               f"{'es' if self._microbatches > 1 else ''} but gave no parameter of the model a "
                               f"gradient, so its step would change nothing: no backward() reached the model's "
                               f"parameters (call loss.backward() for each microbatch; run a forward for its outputs "
                               f"alone under torch.no_grad()), or FSDP2's set_requires_gradient_sync(False) was left "
                               f"on through the last microbatch (turn it back on before the minibatch's last "
                               f"backward), or backward(inputs=model.parameters()) named FSDP2's shards, which the "
                               f"graph does not use (call backward() without inputs; engine odc takes them)")

    def drain(self) -> None:
        """Nothing to wait for: every step ran in finish_minibatch."""
        self.between_minibatches("drain")

    def between_minibatches(self, call: str) -> None:
        check_order(call, self._minibatch if self._inside else None, self._closed, self.model is not None)
        self._reshard()

    def _reshard(self) -> None:
        """Between minibatches, FSDP2's sharded parameters in the model: with reshard_after_forward
        off, a forward no backward follows (an evaluation under no_grad, or old log-probs computed
        inside a minibatch) leaves the unsharded ones registered, which the next begin_minibatch()
        took for parameters replaced since wrap(), and which a forward after the step read, a step
        behind."""
        if self.model is not None and not self._inside and not self._closed:
            for module in self.model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()

    def _emit(self, kind: str, t0: Any) -> None:
        if self.trace is not None:
            self.trace(kind, t0, self.clock())

    def claim(self) -> int:
        raise RuntimeError("collective FSDP cannot balance at run time: every rank must run the same "
                           "microbatch count; use engine=odc")

    def full_parameters(self) -> dict[str, torch.Tensor]:
        self.between_minibatches("full_parameters")
        assert self.model is not None
        # fully_shard made every parameter a DTensor sharded over the ranks (and replicated across nodes).
        return {n: _at_least_fp32(cast(DTensor, p).full_tensor().detach().cpu())
                for n, p in self.model.named_parameters()}

    @property
    def heap_bytes(self) -> int:
        """Shared memory this rank owns for the shm group's collectives (0 on other groups)."""
        return sum(getattr(group, "heap_bytes", 0) for group in self.groups)

    def sharded_state(self, for_load: bool = False, optimizer: bool = True) -> dict[str, Any]:
        """The model's and optimizer's state dicts as DCP's get_state_dict gives them (DTensors);
        the model's alone without `optimizer` or an optimizer (torch's get_state_dict would give a
        fresh optimizer state, a step at learning rate 0, that a load of the model alone keeps)."""
        self.between_minibatches("sharded_state")
        from torch.distributed.checkpoint.state_dict import get_state_dict

        assert self.model is not None  # between_minibatches refused a call before wrap()
        if self._step is None or not optimizer:
            return {"model": get_state_dict(self.model, ())[0]}
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_sharded_state(self, state: dict[str, Any]) -> None:
        """After DCP has loaded every key of sharded_state(for_load=True) but the optimizer state
        of parameters the checkpoint has none for (odc_core/checkpoint.py): those start fresh,
        as they would in a new optimizer; torch's strict check would refuse them."""
        self.between_minibatches("load_sharded_state")
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

        assert self.model is not None
        if "optim" not in state:  # the model alone (an engine without an optimizer)
            set_model_state_dict(self.model, state["model"], options=StateDictOptions(strict=False))
            return
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(strict=False))

    def state_dict(self, full: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
        """torch's get_state_dict of the model and optimizer: DTensors, or with `full` whole tensors."""
        self.between_minibatches("state_dict")
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        assert self.model is not None  # between_minibatches refused a call before wrap()
        # An engine without an optimizer (a reference model's) has the model's state alone, as
        # torch's get_state_dict of no optimizers gives it.
        optimizers = () if self._step is None else (self.optimizer,)
        return get_state_dict(self.model, optimizers, options=StateDictOptions(full_state_dict=full))

    def load_state_dict(self, model_state_dict: dict[str, Any], optim_state_dict: dict[str, Any], *,
                        broadcast_from_rank0: bool = False) -> None:
        """torch's set_state_dict: sharded (DTensors) or full state dicts, by what they hold (or
        rank 0's full ones, broadcast_from_rank0)."""
        self.between_minibatches("load_state_dict")
        from torch.distributed._shard.sharded_tensor import ShardedTensor
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        assert self.model is not None  # between_minibatches refused a call before wrap()
        meta = [name for name, p in self.model.named_parameters() if p.is_meta]
        if meta:
            # torch's load put new parameters in their place, which the next minibatch then refused
            # as replaced since wrap().
            more = f" (and {len(meta) - 1} more)" if len(meta) > 1 else ""
            raise ValueError(f"parameter {meta[0]}{more} is on the meta device, which FSDP2 sharded without memory: "
                             f"call model.to_empty(device=...) after wrap(), then set_state_dict(...)")
        if broadcast_from_rank0:
            # Refuses sharded ones on every rank; and keys are checked on every rank here, where torch
            # refused a key rank 0 lacks on rank 0 alone and the others waited for its broadcast.
            held, optim_skeleton = skeleton_from_rank0(model_state_dict, optim_state_dict)
            own = self.model.state_dict(keep_vars=True)
            groups = _state_names(own)
            check_state_keys(groups, held.keys())
            _check_state_shapes(own, held)
            # torch reads the model's own keys on the other ranks, and no values; on rank 0 it puts
            # what it loaded into the dict it is given (below): a copy, not the caller's.
            model_state_dict = _with_aliases(model_state_dict, groups) if dist.get_rank() == 0 else {}
            optim_state_dict = optim_state_dict if dist.get_rank() == 0 else {}
            # One call each: set_state_dict takes an empty model dict (the other ranks') for
            # "optimizer only", and rank 0 then broadcast the model's tensors to nobody.
            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            set_model_state_dict(self.model, model_state_dict, options=options)
            if not optim_skeleton:  # the model alone: the optimizer stays as it is
                return
            # Where nothing is to be sent, the skeleton is rank 0's whole dict, on every rank.
            as_given = _nothing_to_shard(optim_skeleton)
            given = optim_skeleton if as_given else optim_state_dict
            set_optimizer_state_dict(self.model, self.optimizer, tree_map_only(torch.Tensor, torch.Tensor.clone, given),
                                     options=_optimizer_options(as_given, full=True, from_rank0=True))
            self._start_fresh(optim_skeleton)
            return
        check_optimizer_state(optim_state_dict)
        check_ranks_agree(self.store, self.job_id, dist.get_rank(), self.world_size, self.timeout_s,
                          state_description(model_state_dict, optim_state_dict), STATE_FIX)
        own = self.model.state_dict(keep_vars=True)
        groups = _state_names(own)
        check_state_keys(groups, model_state_dict.keys())
        model_state_dict = _with_aliases(model_state_dict, groups)
        values = list(model_state_dict.values())
        if any(isinstance(v, ShardedTensor) for v in values):
            raise ValueError("a sharded ODC state dict cannot load into collective FSDP; pass a full one "
                             "(get_state_dict(engine, full=True)) or go through odc_core.checkpoint")
        _check_state_shapes(own, model_state_dict)
        full = not any(isinstance(v, DTensor) for v in values)
        if not full:
            mesh = next(p.device_mesh for p in self.model.parameters() if isinstance(p, DTensor))
            model_state_dict, optim_state_dict = tree_map_only(
                DTensor, functools.partial(_onto_mesh, mesh), (model_state_dict, optim_state_dict))
        # torch's optimizer takes the state's tensors as its own, and a state dict views another
        # engine's (get_state_dict): its moments and step counts would move with that engine's
        # steps. ODC copies what it loads into its shards.
        optim_state_dict = tree_map_only(torch.Tensor, torch.Tensor.clone, optim_state_dict)
        # torch puts what it loaded into the model dict it is given (DTensors where a full dict
        # held the caller's tensors): a copy (_with_aliases'), not the caller's.
        set_model_state_dict(self.model, model_state_dict, options=StateDictOptions(full_state_dict=full))
        if not optim_state_dict:  # the model alone: the optimizer stays as it is
            return
        set_optimizer_state_dict(self.model, self.optimizer, optim_state_dict,
                                 options=_optimizer_options(_nothing_to_shard(optim_state_dict), full))
        self._start_fresh(optim_state_dict)

    def _start_fresh(self, loaded: dict[str, Any]) -> None:
        """Drop the optimizer state of the trainable parameters `loaded` (an optimizer state dict)
        holds none for, so that each starts as in a fresh optimizer at its next step, as one
        process's load_state_dict leaves it: torch's full load gives every parameter state first
        (a step at learning rate 0), and such a parameter then kept that step's count with
        moments of zero (its first AdamW step after the load bias-corrected as a later one's)."""
        assert self.model is not None and self.optimizer is not None
        held = loaded.get("state", {})
        for name, param in self.model.named_parameters():
            if param.requires_grad and name not in held:
                self.optimizer.state.pop(param, None)

    def _peer_closed(self, what: str) -> str | None:
        """The error of this rank's collective for `what` where a peer closed its engine first
        (closing.py); None where none did, or the store does not answer."""
        for peer in range(self.world_size):
            try:
                why = peer_closed(self.store, self.job_id, peer, what) if peer != self.rank else None
            except Exception:  # the store's errors are of many kinds (DistNetworkError, RuntimeError)
                return None
            if why is not None:
                return why
        return None

    def close(self) -> None:
        # Before the groups go: a peer's collective fails once they do, and then looks this up.
        tell_peers(self.store, self.job_id, self.rank, self._minibatch, self._inside, sys.exc_info()[1])
        self.model, self._closed = None, True
        groups, self.groups = self.groups, []
        for group in groups:
            dist.destroy_process_group(group)


def _state_names(own: Mapping[str, Any]) -> list[list[str]]:
    """The names of each tensor of the model's state dict (`own`, its state_dict(keep_vars=True)):
    tied weights have several."""
    groups: dict[int, list[str]] = {}
    for name, value in own.items():
        groups.setdefault(id(value), []).append(name)
    return list(groups.values())


def _check_state_shapes(own: Mapping[str, Any], model_sd: Mapping[str, Any]) -> None:
    """Each tensor of a model state dict of the model's keys is of the whole shape of its tensor
    in `own` (the model's state_dict(keep_vars=True); a DTensor's shape is the whole one), or a
    one-line ValueError before anything loads."""
    for name, given in model_sd.items():
        if isinstance(own[name], torch.Tensor):  # not a module's extra state (get_extra_state)
            check_state_shape(name, given, tuple(own[name].shape))


def _with_aliases(model_sd: Mapping[str, Any], groups: list[list[str]]) -> dict[str, Any]:
    """A copy of `model_sd` holding a tied weight under each of its names, where it held one (as a
    Hugging Face checkpoint leaves out lm_head.weight when it is the embedding's)."""
    out = dict(model_sd)
    for group in groups:
        present = [name for name in group if name in out]
        for name in group if present else ():
            out.setdefault(name, out[present[0]])
    return out


def _optimizer_options(as_given: bool, full: bool, from_rank0: bool = False) -> Any:
    """torch's StateDictOptions for loading an optimizer's state into FSDP2's: `as_given` where
    the state has nothing to shard (_nothing_to_shard). Not strict: FSDP2's optimizer keeps no
    state for a parameter that never had a gradient, and torch's strict load refused FSDP2's own
    state dict then ("Missing optimizer state for parameter ..."); such a parameter starts
    fresh, as odc_core.checkpoint loads it (the model's state stays strict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    if as_given:
        return StateDictOptions(full_state_dict=False, strict=False)
    return StateDictOptions(full_state_dict=full, broadcast_from_rank0=from_rank0, strict=False)


def _nothing_to_shard(optim_state_dict: dict[str, Any]) -> bool:
    """Whether an optimizer state dict holds no tensor with a dimension (SGD without momentum,
    whose state per parameter is a momentum_buffer of None): full or sharded, it is the same dict.
    torch's full load spreads a state over the device of the optimizer's own state tensors, and
    asserted "Expected device to be set" where there are none."""
    return not any(isinstance(t, torch.Tensor) and t.dim() > 0 for t in tree_leaves(optim_state_dict))


def _onto_mesh(mesh: DeviceMesh, t: DTensor) -> DTensor:
    """A shard of another engine of these ranks (another model's, in this process: an RL policy's
    weights into its reference model) as a shard on this engine's mesh. Each engine's mesh has
    dimension names of its own (_mesh), and DTensor refused to copy across two meshes of the
    same ranks ("Cannot run aten.copy_.default on inputs with different meshes")."""
    if t.device_mesh == mesh or t.device_mesh.mesh.tolist() != mesh.mesh.tolist():
        return t
    return DTensor.from_local(t.to_local(), mesh, t.placements, shape=t.shape, stride=t.stride())


def _inner_first(units: list[nn.Module]) -> list[nn.Module]:
    """The units in their order, but each after every unit inside it."""
    inside = {id(u): {id(m) for m in u.modules()} - {id(u)} for u in units}
    ordered: list[nn.Module] = []
    while units:
        ready = [u for u in units if not any(id(v) in inside[id(u)] for v in units)]
        ordered += ready
        units = [u for u in units if all(u is not r for r in ready)]
    return ordered


def _at_least_fp32(tensor: torch.Tensor) -> torch.Tensor:
    """bf16 and fp16 as fp32; a float64 or complex parameter (which FSDP2 shards and steps in its
    own dtype) as it is, where .float() rounded the one and dropped the other's imaginary part."""
    if tensor.is_floating_point() and tensor.element_size() < 4:
        return tensor.float()
    return tensor


def _lay_out_contiguously(model: nn.Module) -> None:
    """fully_shard refuses a parameter that is not contiguous (a transposed view, a convolution
    in channels_last) in "FSDP does not support non-contiguous parameters yet", where ODC trains
    it; its unsharded parameter is contiguous anyway, so the same values in that layout compute
    the same. In place (.data), so a parameter shared by two modules stays one."""
    with torch.no_grad():
        for param in model.parameters():
            if not param.is_contiguous():
                param.data = param.data.contiguous()


def _refuse_gradient_hooks(model: nn.Module, sharded: bool) -> None:
    """A ValueError (at wrap()) or RuntimeError (at a minibatch), one line, for a parameter gradient
    hook FSDP2 never runs (probed: a hook halving a weight's gradient trained as without it). Before
    `fully_shard`, every hook (`register_hook`, `register_post_accumulate_grad_hook`) is on a
    parameter it replaces with its sharded one; on that one, `register_hook` is never reached, as
    FSDP2 sets its .grad itself after its reduce-scatter, where it runs post-accumulate hooks. ODC,
    whose parameters get their gradients through autograd, runs both as one process does."""
    for name, p in model.named_parameters():
        kind = ("register_hook" if p._backward_hooks else "register_post_accumulate_grad_hook"
                if not sharded and getattr(p, "_post_accumulate_grad_hooks", None) else None)
        if kind is None:
            continue
        where = ("on a parameter fully_shard replaces with its sharded one" if not sharded else
                 "on its sharded parameter, whose .grad it sets itself after its reduce-scatter")
        fix = ("register it after wrap(), on the parameter the model then holds, where FSDP2 runs it" if
               kind == "register_post_accumulate_grad_hook" else "change the gradient through the loss or a "
               "module's backward hook (register_full_backward_hook)")
        error = RuntimeError if sharded else ValueError
        raise error(f"parameter {name} has a gradient hook ({kind}), which FSDP2 never runs {where}; {fix}, or use "
                    f"engine odc, which runs it")


def _check_one_dtype_per_group(model: nn.Module, units: list[nn.Module], labels: dict[int, str]) -> None:
    """ValueError, in one line, where a group fully_shard makes (each unit in `units`' order with
    the parameters no earlier one took, then the model with the rest) holds trainable parameters
    of several dtypes: FSDP2 keeps a group's in one dtype, and asserted it only in the first
    forward ("FSDP expects uniform original parameter dtype"), after wrap() had sharded the
    model. A model loaded in bf16 with some modules kept in fp32 (transformers'
    `_keep_in_fp32_modules`) is one."""
    names = {id(p): n for n, p in model.named_parameters()}
    taken: set[int] = set()
    for holder in (*units, model):
        first: dict[torch.dtype, str] = {}
        for p in holder.parameters():
            if id(p) not in taken:
                taken.add(id(p))
                if p.requires_grad:
                    first.setdefault(p.dtype, f"{names[id(p)]} {str(p.dtype).removeprefix('torch.')}")
        if len(first) > 1:
            where = f"{labels[id(holder)]}, with the parameters no unit holds," if holder is model and units else \
                labels[id(holder)]
            raise ValueError(f"{where} holds trainable parameters of {len(first)} dtypes ({', '.join(first.values())}) "
                             "and FSDP2 shards a unit's in one dtype: cast them to one (model.float(): "
                             "precision='bf16' still computes in bf16), or use engine odc, which keeps float32 masters "
                             "of float32 and compute-dtype parameters alike")


def _fsdp2_policy(policy: MixedPrecision) -> MixedPrecisionPolicy:
    """FSDP2's policy for ours: None (the parameters' own dtype) where a dtype is fp32, as FSDP2
    without a policy runs."""
    fp32 = torch.float32
    return MixedPrecisionPolicy(
        param_dtype=None if policy.param_dtype == fp32 else policy.param_dtype,
        reduce_dtype=None if policy.reduce_dtype == fp32 == policy.param_dtype else policy.reduce_dtype)


def _value(norm: torch.Tensor) -> float:
    """A norm clip_grad_norm_ returned: over DTensor gradients a DTensor, reduced over the mesh."""
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def build(ctx: EngineContext, options: CollectiveOptions) -> CollectiveEngine:
    job_id, store = ctx.own_job()
    return CollectiveEngine(ctx.device, ctx.precision, options.reshard_after_forward, options.backend,
                            job_id=job_id, timeout_s=ctx.timeout_s, store=store,
                            shard_group=shard_group_size(options.shard, options.ranks_per_node, dist.get_world_size()))


# Where FSDP2 looks for the tensors it hooks: torch 2.13's walks containers (collect_grad_tensors);
# a release without that function hooked the leaves of torch's pytree.
_FSDP2_WALK: Walk = "containers" if hasattr(_fsdp_common, "collect_grad_tensors") else "pytree"


def _make_gather_buffers(model: nn.Module, sharded: Sequence[nn.Module]) -> None:
    """Before the first forward of the model or of any unit (ahead of every other hook), gather
    and free each unit once outside torch.inference_mode(), the root first. FSDP2 makes the
    buffers it gathers into at a unit's first gather, and made under inference_mode (a first RL
    rollout, an evaluation before any training) they were inference tensors, whose use failed
    then and in every later gather ("Inference tensors do not track version counter"); and it
    takes the first module called for the root, so a unit called before the model (an embedding
    looked up first) left the model's forward failing in "FSDP state has already been lazily
    initialized for layers.0". At the first forward, not at wrap(): a model built on the meta
    device has no values to gather until to_empty(). Collective over the ranks, as that forward
    is; one all-gather per unit, each freed before the next."""
    handles: list[Any] = []

    @torch.compiler.disable
    def first_forward(_module: nn.Module, _args: tuple) -> None:
        for handle in handles:
            handle.remove()
        # FSDP2's lazy init of the model's state marks it the root and the units not (private in
        # torch 2.11 and 2.13 alike; its unshard() initialises the unit's parameters alone).
        cast(FSDPModule, model)._get_fsdp_state()._lazy_init()
        with torch.inference_mode(False), torch.no_grad():
            for module in (model, *sharded):
                cast(FSDPModule, module).unshard()
                cast(FSDPModule, module).reshard()

    handles.extend(module.register_forward_pre_hook(first_forward, prepend=True) for module in (model, *sharded))


def _watch_writes(model: nn.Module, sharded: Sequence[nn.Module]) -> None:
    """Refuse an in-place write to a unit's parameters during its forward (nn.Embedding's
    max_norm, weight clipping under torch.no_grad()): it reaches the copy FSDP2 gathered, which
    its reshard then drops, and the model trained on without it, without a word. Each unit's own
    parameters are the plain tensors among its parameters once FSDP2's pre-forward hook has
    gathered them (its inner units' are still DTensor shards); their version counters are read
    then and again ahead of FSDP2's post-forward hook, which reshards them."""
    prefixes = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}
    seen: dict[int, list[tuple[str, torch.Tensor, int]]] = {}

    def gathered(module: nn.Module, _args: tuple) -> None:
        prefix = f"{prefixes[id(module)]}." if prefixes[id(module)] else ""
        seen[id(module)] = [(prefix + n, p, p._version) for n, p in module.named_parameters()
                            if not isinstance(p, DTensor)]

    def forward_over(module: nn.Module, _args: tuple, _output: object) -> None:
        written = next((n for n, p, v in seen.pop(id(module), []) if p._version != v), None)
        if written is not None:
            refuse_written_in_place(written, "FSDP2")

    # Opaque to Dynamo: traced, they added graphs to a compiled model where FSDP2's own hooks
    # leave it none or few, and the counters would be read at trace time.
    for module in (*sharded, model):
        module.register_forward_pre_hook(torch.compiler.disable(gathered))
        module.register_forward_hook(torch.compiler.disable(forward_over), prepend=True)


def _check_output(label: str, module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
    """FSDP2 unshards a unit for its backward from hooks on the tensors in its output: an output
    whose gradient flows through a tensor FSDP2 does not find would reach the unit's parameters
    resharded (a storage error deep inside backward), so it is refused here (outputs.py)."""
    def needs_grad() -> bool:
        inputs = (t for t in tree_leaves((args, kwargs)) if torch.is_tensor(t))
        return any(p.requires_grad for p in module.parameters()) or any(t.requires_grad for t in inputs)

    if torch.is_grad_enabled():
        check_output(label, output, _FSDP2_WALK, needs_grad)
