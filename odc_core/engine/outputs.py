"""What a unit's forward returns, as the engines see it. Both find where a unit's backward
begins by hooking the tensors in its output that carry a gradient; a gradient that flows through
a tensor held where an engine does not look reaches the unit's parameters unannounced: ODC then
finds them freed or pushed, FSDP2 resharded (a storage error deep inside backward). So a unit
whose output hides what carries its gradient is refused as its forward returns, in one line.

Where each looks: FSDP2 into dataclasses, dicts, lists and tuples of any type (torch 2.13; a
release before it took the leaves of torch's pytree, which leaves a dict subclass or a dataclass
nobody registered whole); ODC into those and into any type registered with torch's pytree."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterator
from typing import Literal

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_leaves

# Leaves that hold no tensor: what a unit may return beside its tensors (a flag, a count).
_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, enum.Enum)

# "containers": dataclasses, dicts, lists and tuples; "pytree": torch's pytree leaves alone;
# "both": the containers, and any other type registered with the pytree.
Walk = Literal["containers", "pytree", "both"]
_ADVICE: dict[Walk, str] = {
    "containers": "a tuple, list, dict or dataclass (a transformers ModelOutput is one)",
    "both": "a tuple, list, dict or dataclass (a transformers ModelOutput is one), or register its type with torch's "
            "pytree",
    "pytree": "a plain tuple, list or dict, or register its type with torch's pytree (a dataclass: "
              "torch.export.register_dataclass; a transformers ModelOutput is registered)",
}


def output_leaves(output: object, walk: Walk) -> Iterator[object]:
    """The leaves of a unit's output as `walk` looks into it: tensors, and what it does not
    look into."""
    if walk == "pytree":
        yield from tree_leaves(output)
    elif torch.is_tensor(output):
        yield output
    elif dataclasses.is_dataclass(output) and not isinstance(output, type):
        for field in dataclasses.fields(output):
            yield from output_leaves(getattr(output, field.name), walk)
    elif isinstance(output, dict):
        for item in output.values():
            yield from output_leaves(item, walk)
    elif isinstance(output, (list, tuple)):
        for item in output:
            yield from output_leaves(item, walk)
    elif walk == "both" and not (flat := tree_flatten(output))[1].is_leaf():
        for item in flat[0]:
            yield from output_leaves(item, walk)
    else:
        yield output


def grad_outputs(output: object, walk: Walk) -> list[torch.Tensor]:
    """The tensors in a unit's output that carry a gradient."""
    return [leaf for leaf in output_leaves(output, walk) if torch.is_tensor(leaf) and leaf.requires_grad]


def check_output(label: str, output: object, walk: Walk, needs_grad: Callable[[], bool]) -> list[torch.Tensor]:
    """The output's tensors that carry a gradient, for the engine to hook; an error in one line
    when there are none the engine can see but the output holds an object it cannot look into
    and the unit has a gradient to give (`needs_grad()`: a trainable parameter, or an input that
    carries one; asked only then, as it runs on every forward). An output with visible tensors
    may also hold such objects (a layer's cache)."""
    found = grad_outputs(output, walk)
    if found or not needs_grad():
        return found
    opaque = next((leaf for leaf in output_leaves(output, walk)
                   if not torch.is_tensor(leaf) and not isinstance(leaf, _PLAIN)), None)
    if opaque is None:
        return found
    kind = type(opaque).__qualname__
    inside = "" if opaque is output else f" inside a {type(output).__qualname__}"
    raise TypeError(f"the forward of {label} returned an object of type {kind}{inside}, into which the engine does "
                    f"not look for the tensors that carry its gradient, so it cannot tell when the unit's backward "
                    f"begins; return them as a tensor, or in {_ADVICE[walk]}")


def unit_labels(model: nn.Module) -> dict[int, str]:
    """Each module of the model by id: its name in the model, the way errors name a unit."""
    return {id(m): f"{name} ({type(m).__qualname__})" if name else f"the model ({type(m).__qualname__})"
            for name, m in model.named_modules(remove_duplicate=False)}
