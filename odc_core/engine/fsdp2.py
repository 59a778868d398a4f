"""The collective baseline: torch's FSDP2 (fully_shard) per unit plus the root, unmodified.

Which process group FSDP2 runs on is the engine's `backend` option. On CPU the default is
`shm`: a process group whose all-gathers and reduce-scatters move bytes through the same
shared memory as the ODC engine (odc_core/transport/shm_group.py), so that the two engines
differ in how they synchronise (a barrier per collective against one per minibatch) and not
in how fast their bytes move. `gloo` (TCP over loopback, milliseconds per call) stays
selectable for the record: against it ODC would win on transport alone. On CUDA the
default is NCCL, the paper's baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from typing import cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from odc_core.engine.base import EngineContext, TraceHook
from odc_core.engine.registry import Backend, CollectiveOptions


class CollectiveEngine:
    """Per-unit all-gather before forward and backward, reduce-scatter after backward.

    Every one of those collectives is a barrier across ranks, so all ranks must run the same
    number of microbatches; the worker checks the plan before starting.
    """

    name = "collective"

    def __init__(self, device: torch.device, precision: str = "fp32", reshard_after_forward: bool = True,
                 backend: Backend = "auto", *, job_id: str = "collective", timeout_s: float = 120.0) -> None:
        self.device = device
        self.backend = CollectiveOptions(backend=backend).for_device(device.type).backend
        self.job_id, self.timeout_s = job_id, timeout_s
        self.group: dist.ProcessGroup | None = None
        self.world_size = dist.get_world_size()
        # FSDP2 divides reduced gradients by the world size, and gloo cannot run the
        # pre-multiplied sum that set_gradient_divide_factor(1) needs, so the worker scales
        # its loss instead; the result is the plain sum of gradients, as with ODC.
        self.loss_scale = float(self.world_size)
        self.precision = precision
        self.reshard_after_forward = reshard_after_forward
        self.trace: TraceHook | None = None
        self.model: nn.Module | None = None
        self._opt: torch.optim.Optimizer | None = None

    def wrap(self, model: nn.Module, units: Sequence[nn.Module]) -> nn.Module:
        if self.backend == "shm":
            from odc_core.transport.shm_group import new_shm_group

            self.group = new_shm_group(self.job_id, self.timeout_s)
            mesh = DeviceMesh.from_group(self.group, self.device.type)
        else:  # the default group, which the worker created with this backend
            mesh = init_device_mesh(self.device.type, (self.world_size,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if self.precision == "bf16" else MixedPrecisionPolicy()
        for unit in units:
            fully_shard(unit, mesh=mesh, mp_policy=mp, reshard_after_forward=self.reshard_after_forward)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=self.reshard_after_forward)
        self.model = model
        return model

    def configure_optimizer(self, lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
        assert self.model is not None, "wrap() the model first"
        self._opt = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=betas, eps=eps,
                                      weight_decay=weight_decay)

    def begin_minibatch(self) -> None:
        """Nothing to do: FSDP2 synchronises inside every unit's forward and backward."""

    def finish_minibatch(self) -> None:
        """The optimizer step; nothing to wait for: FSDP2's post-backward callback already
        waited for the last reduce-scatter."""
        assert self._opt is not None, "configure_optimizer() first"
        self._emit("sync", perf_counter())  # a span of nothing, as a real and a simulated trace both have
        t0 = perf_counter()
        self._opt.step()
        self._opt.zero_grad(set_to_none=True)
        self._emit("optimizer", t0)

    def drain(self) -> None:
        """Nothing to do: every step ran in finish_minibatch."""

    def _emit(self, kind: str, t0: float) -> None:
        if self.trace is not None:
            self.trace(kind, t0, perf_counter())

    def claim(self) -> int:
        raise RuntimeError("collective FSDP cannot balance at run time: every rank must run the same "
                           "microbatch count; use engine=odc")

    def full_parameters(self) -> dict[str, torch.Tensor]:
        assert self.model is not None
        # fully_shard made every parameter a DTensor sharded over the ranks.
        return {n: cast(DTensor, p).full_tensor().detach().float().cpu() for n, p in self.model.named_parameters()}

    @property
    def heap_bytes(self) -> int:
        """Shared memory this rank owns for the shm group's collectives (0 on other groups)."""
        return getattr(self.group, "heap_bytes", 0)

    def close(self) -> None:
        self.model = None
        if self.group is not None:
            group, self.group = self.group, None
            dist.destroy_process_group(group)


def build(ctx: EngineContext, options: CollectiveOptions) -> CollectiveEngine:
    return CollectiveEngine(ctx.device, ctx.precision, options.reshard_after_forward, options.backend,
                            job_id=ctx.job_id, timeout_s=ctx.timeout_s)
