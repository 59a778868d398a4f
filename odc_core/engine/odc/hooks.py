"""Where a unit's life meets autograd: the module and tensor hooks that gather a unit before
its forward and backward, free it after, and push its gradients once its backward is over.

A unit's life in one microbatch (docs/odc_engine.md): forward pre-hook, gather (or wait for the
prefetch) and prefetch the next unit; forward hook, free it (except a last unit, whose
backward follows at once) and hook its outputs; the first output gradient, gather again, give
its parameters one flat gradient buffer and prefetch the previous unit; once every parameter
gradient has accumulated and the gradients of its inputs have left it, push and free.

Not every unit gets there: a trainable parameter the microbatch did not use gets no gradient,
and an input's gradient may never leave a unit. As FSDP2 does with its root's final callback,
the end of every backward pass pushes and frees each unit whose backward began and is not over:
its unused parameters' gradients are zero. Frozen parameters (requires_grad False at wrap())
are gathered like the others and never pushed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.autograd.graph import get_gradient_edge
from torch.utils._pytree import tree_map_only
from torch.utils.hooks import RemovableHandle

from odc_core.engine.base import refuse_create_graph
from odc_core.engine.odc.fetch import Fetcher
from odc_core.engine.odc.order import ExecutionOrder
from odc_core.engine.odc.unit import Backward, FlatUnit
from odc_core.engine.odc.versions import Versions
from odc_core.engine.outputs import check_output, grad_outputs


class UnitHooks:
    """The hooks of every flat unit, in the order wrap() was given the modules."""

    def __init__(self, modules: Sequence[nn.Module], labels: Sequence[str], group_of: Sequence[FlatUnit | None],
                 fetcher: Fetcher, versions: Versions, compute_dtype: torch.dtype, device: torch.device) -> None:
        self.modules, self.labels, self.group_of = list(modules), list(labels), list(group_of)
        self.fetcher, self.versions = fetcher, versions
        self.compute_dtype, self.device = compute_dtype, device
        self.handles: list[RemovableHandle] = []
        self._finishing = False  # the end of this backward pass is queued (finish_backward)
        self.order = ExecutionOrder(len(self.modules))  # what a prefetch gathers
        # Since the last finish_minibatch(): whether a forward of the model inside a minibatch
        # ran to its end with units awaiting a backward, and whether any unit pushed gradients
        # (engine.py's check).
        self.armed_in_minibatch = False
        self.pushed = False

    def register(self, unit: FlatUnit) -> None:
        for pos in unit.modules:
            module = self.modules[pos]
            self.handles.append(module.register_forward_pre_hook(
                lambda _m, args, kwargs, u=unit, pos=pos: self.pre_forward(u, pos, args, kwargs), with_kwargs=True))
            self.handles.append(module.register_forward_hook(
                lambda _m, _args, out, u=unit, pos=pos: self.post_forward(u, pos, out)))
        for p in (p for p, trainable in zip(unit.params, unit.trainable, strict=True) if trainable):
            self.handles.append(p.register_post_accumulate_grad_hook(lambda _p, u=unit: self.param_grad_done(u)))

    def watch_model(self, model: nn.Module) -> None:
        """Note a forward of the whole model that ended inside a minibatch with a unit awaiting its
        backward: one cut short by an exception (an out-of-memory a loop skips) never ends."""
        def forward_over(_m: nn.Module, _args: tuple, _output: object) -> None:
            if torch.is_grad_enabled() and self.versions.inside and any(
                    u is not None and u.backward is Backward.ARMED for u in self.group_of):
                self.armed_in_minibatch = True

        self.handles.append(model.register_forward_hook(forward_over))

    def _second_backward(self, unit: FlatUnit) -> None:
        modules = " and ".join(self.labels[pos] for pos in unit.modules)
        raise RuntimeError(f"unit {modules}: a gradient reached it after its backward was over (a backward through "
                           f"a forward of a minibatch already finished, or a parameter used outside the forward of "
                           f"the unit that holds it, as when unit.forward(x) is called, which skips the engine's "
                           f"hooks, rather than unit(x)); call backward before finish_minibatch(), and call units "
                           f"themselves")

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def _group_at(self, pos: int | None) -> FlatUnit | None:
        return None if pos is None else self.group_of[pos]

    def pre_forward(self, unit: FlatUnit, pos: int, args: tuple, kwargs: dict):
        self.finish_cut_short()
        self.versions.serve()
        self.fetcher.ensure(unit)
        if unit.backward is not Backward.RUNNING:  # not a recomputation inside its backward
            unit.forwards_open += 1
            if torch.is_grad_enabled() and not self._finishing:  # a training forward, not inside a backward
                self.order.began(pos)
        following = self._group_at(self.order.after(pos))
        if following is not None and following is not unit:
            self.fetcher.prefetch(following)
        if self.compute_dtype != torch.float32:
            # As FSDP2's MixedPrecisionPolicy (cast_forward_inputs): a loop written for it feeds a
            # unit fp32 tensors, which would meet weights gathered in the compute dtype.
            args, kwargs = tree_map_only(torch.Tensor, self._in_compute_dtype, (args, kwargs))
        if not torch.is_grad_enabled():
            return args, kwargs
        # A leaf that carries a gradient (a perturbation of the input, x.requires_grad_()) enters
        # as a view of itself: torch's multi-grad hook below cannot ask whether a
        # torch.autograd.grad() that asks for the leaf's gradient will reach it (it refused: "A
        # leaf node was passed to _will_engine_execute_node"), and of a view it can.
        args, kwargs = tree_map_only(torch.Tensor, _as_view_if_leaf, (args, kwargs))
        # Every input that carries a gradient, positional or keyword (transformers' layers take
        # hidden_states either way), found where the unit's outputs are (a dataclass one unit
        # returns is the next one's input): their gradients leaving the unit end its backward.
        # Waiting for the first top-level tensor alone pushed and freed a unit whose frozen
        # weights a gradient inside a container still needed (a storage error inside backward).
        # A hook on the tensors themselves needs no rebuilding of the containers they came in.
        inputs = grad_outputs((args, kwargs), "both")
        if unit.pushed_in is not None and unit.backward is Backward.IDLE:  # a training forward after its last push
            unit.pushed_in, unit.inputs_hooked = None, 0
        if inputs:
            unit.inputs_pending += 1
            unit.inputs_hooked += 1
            torch.autograd.graph.register_multi_grad_hook(inputs, lambda _grads, u=unit: self.input_grad_done(u))
        return args, kwargs

    def _in_compute_dtype(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.compute_dtype) if x.is_floating_point() else x

    def post_forward(self, unit: FlatUnit, pos: int, output: object) -> None:
        # A group stays gathered until its last unit's forward, and while any unit of it is still
        # inside its forward (units that nest and share a parameter: a layer using its MLP's
        # weight, whose forward ends first); the last unit's backward starts at once, so it stays
        # gathered for that too.
        if unit.backward is Backward.RUNNING:
            # A recomputation (activation checkpointing) inside the group's backward, not counted:
            # one that stops early (torch's default) never reaches this hook.
            done = pos == unit.modules[-1]
        else:
            unit.forwards_open = max(0, unit.forwards_open - 1)
            unit.last_ran = unit.last_ran or pos == unit.modules[-1]
            done = unit.last_ran and not unit.forwards_open
            if done:
                unit.last_ran = False
        if not torch.is_grad_enabled():  # no backward follows (evaluation)
            if done:
                unit.release()
            return
        if done and self.order.after(pos) is not None:  # the last unit's backward begins at once
            unit.release()
        # Every output that carries a gradient (transformers' layers return tuples): the first
        # of them whose gradient arrives starts the group's backward.
        outputs = check_output(self.labels[pos], output, "both",
                               lambda: bool(unit.trainable_count or unit.inputs_pending))
        if outputs:
            unit.backward = Backward.ARMED
        for t in outputs:
            t.register_hook(lambda _g, u=unit, pos=pos: self.pre_backward(u, pos))

    def pre_backward(self, unit: FlatUnit, pos: int) -> None:
        if torch.is_grad_enabled():  # the backward records a graph of itself: create_graph=True
            refuse_create_graph(self.labels[pos], "ODC")
        if unit.backward is Backward.IDLE:  # its gradients are pushed and its parameters freed
            if unit.pushed_in is None or unit.pushed_in == torch._C._current_graph_task_id():
                self._second_backward(unit)
            # A later backward through the same forward (retain_graph): autograd saved views of
            # the flat buffer, which the gather below fills again, and the owners add the
            # gradients pushed again to the first ones, as .grad accumulates in one process.
            unit.backward = Backward.ARMED
            unit.inputs_pending = unit.inputs_hooked
        if unit.backward is Backward.ARMED:
            unit.backward = Backward.RUNNING
            self.fetcher.ensure(unit)
            if unit.trainable_count:
                unit.attach_grad(torch.zeros(unit.layout.padded_numel, dtype=self.compute_dtype, device=self.device))
            unit.grads_ready, unit.grads_due = 0, _grads_due(unit)
            if not self._finishing:
                self._finishing = True
                self.order.pass_over()
                torch.autograd.Variable._execution_engine.queue_callback(self.finish_backward)
        preceding = self._group_at(self.order.before(pos))
        if preceding is not None and preceding is not unit:
            self.fetcher.prefetch(preceding)

    def param_grad_done(self, unit: FlatUnit) -> None:
        if unit.backward is not Backward.RUNNING:
            # Its gradient went to a fresh .grad, not the flat buffer the push sends: it would be lost.
            self._second_backward(unit)
        unit.grads_ready += 1
        self._maybe_push(unit)

    def input_grad_done(self, unit: FlatUnit) -> None:
        if unit.backward is Backward.IDLE:  # a later backward that reached its inputs, not its outputs
            return
        unit.inputs_pending -= 1
        self._maybe_push(unit)

    def _maybe_push(self, unit: FlatUnit) -> None:
        """Push once the unit's backward is over: all its trainable parameters' gradients have
        accumulated and (when it has any) the gradients of its inputs have left it."""
        if unit.backward is Backward.RUNNING and unit.grads_ready >= unit.grads_due and not unit.inputs_pending:
            self._push(unit)

    def _push(self, unit: FlatUnit) -> None:
        if unit.grad is not None:  # None: every parameter is frozen, nothing to push
            if unit.grads_ready:  # none: a pass that left .grad alone (torch.autograd.grad()), zeros to add
                self.fetcher.push(unit)
                self.pushed = True
            unit.detach_grad()
        unit.backward = Backward.IDLE
        unit.inputs_pending = 0
        unit.pushed_in = torch._C._current_graph_task_id()
        unit.release()
        self.versions.serve()

    def finish_cut_short(self) -> None:
        """Outside any backward pass, push each unit that a backward cut short by an exception (an
        out-of-memory a loop catches to skip its microbatch) left running: autograd drops the
        queued finish_backward then. The gradients it computed are kept, as one process keeps the
        .grad it accumulated; before, the next forward took such a unit for a recomputation and
        finish_minibatch() failed in "backward finished without pushing its gradients"."""
        if self._finishing and torch._C._current_graph_task_id() == -1:
            self.finish_backward()

    def finish_backward(self) -> None:
        """The end of a backward pass: push each unit whose backward began but did not finish
        (a parameter without a gradient, an input whose gradient never left it)."""
        self._finishing = False
        for unit in self.group_of:  # a shared group is listed once per unit: pushed once, then IDLE
            if unit is not None and unit.backward is Backward.RUNNING:
                self._push(unit)


def _as_view_if_leaf(t: torch.Tensor) -> torch.Tensor:
    return t.view_as(t) if t.is_leaf and t.requires_grad else t


def _accumulates(p: nn.Parameter) -> bool:
    """Whether the backward pass running now accumulates into p.grad: not a torch.autograd.grad()
    (which returns the gradients it is asked for, raising here for p's own), nor a
    backward(inputs=...) without p, nor a backward that p is not in."""
    try:
        return torch._C._will_engine_execute_node(get_gradient_edge(p).node)
    except RuntimeError:  # torch.autograd.grad() asked for p's gradient: it returns it, leaving .grad
        return False


def _grads_due(unit: FlatUnit) -> int:
    """How many of the unit's trainable parameters the backward pass now beginning will give a
    gradient: its backward is over once they have and its inputs' gradients have left it. Only a
    unit whose inputs carry a gradient expects fewer than all of them (so a torch.autograd.grad()
    of a perturbation frees each unit as it passes, where the whole model stayed gathered to the
    pass's end): a reentrant checkpoint inside a unit accumulates its parameters in a backward
    of its own, which the pass outside cannot see but which ends before the inputs' gradients
    leave. The first parameter's answer stands for all in a backward that accumulates it (one
    query per unit and pass); a parameter it does not reach ends the unit at the pass's end."""
    trainable = [p for p, kept in zip(unit.params, unit.trainable, strict=True) if kept]
    if not unit.inputs_pending or not trainable or _accumulates(trainable[0]):
        return len(trainable)
    return sum(map(_accumulates, trainable[1:]))

