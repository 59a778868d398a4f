"""How a rank gets an engine: its context from the process group, and the engine itself."""

from __future__ import annotations

import importlib
import itertools
import math
import uuid

import torch
import torch.distributed as dist

from odc_core.engine.base import DataParallelEngine, EngineContext, MixedPrecision
from odc_core.engine.registry import EngineOptions, engine_spec

_contexts = itertools.count()


def engine_context(device: torch.device | str | None = None, *, precision: str | MixedPrecision = "fp32",
                   timeout_s: float = 120.0) -> EngineContext:
    """An EngineContext from the default process group, as torchrun and SLURM launchers set it
    up: every rank calls it, in the same order. `device` defaults to this rank's current CUDA
    device when the group runs NCCL, else the CPU; precision "bf16" computes in bf16 on fp32
    master weights and reduces in fp32 (MixedPrecision(torch.bfloat16, torch.float32)), a
    MixedPrecision names both dtypes. Rank 0 names the engine's shared segments (job_id) for
    all ranks through the group's store. `device` may be named as torch.device takes it ("cuda",
    "cuda:1", "cpu"); ValueError, one line, for a device neither engine runs on or this machine
    lacks (_device) or a timeout that is not a positive number of seconds (0 or NaN made every wait
    for a peer fail or never end)."""
    if not dist.is_initialized():
        raise RuntimeError("engine_context() needs torch.distributed initialised: call "
                           "dist.init_process_group() first (torchrun sets up its environment)")
    MixedPrecision.of(precision)  # a ValueError now, not at make_engine
    if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"engine_context(timeout_s=...) must be a positive number of seconds, got {timeout_s!r}")
    if device is not None:
        device = _device(device)
    if device is None:
        nccl = "nccl" in str(dist.get_backend())
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    # The default group's own store (private in torch; the harness passes a TCPStore of its own).
    store = dist.distributed_c10d._get_default_store()
    key = f"odc_core/context/{next(_contexts)}"
    if dist.get_rank() == 0:
        store.set(key, uuid.uuid4().hex[:12])
    job_id = store.get(key).decode()
    return EngineContext(device, dist.PrefixStore(f"odc_core/{job_id}", store), job_id, timeout_s, precision)


def _device(named: torch.device | str) -> torch.device:
    """The device an engine runs on, or ValueError, one line: a name torch does not know, a kind
    neither engine runs on (mps, xpu, meta: the collective engine failed in an AttributeError of
    torch.mps or an assertion inside FSDP2), or a CUDA device this machine lacks (cuda:3 with one
    GPU failed in CUDA's "invalid device ordinal" at the first tensor)."""
    try:
        device = torch.device(named)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"engine_context(device={named!r}) is not a device torch knows ({e}); give 'cpu', 'cuda' "
                         f"or 'cuda:N'") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"engine_context(device={str(device)!r}): odc_core's engines run on CPU and CUDA devices "
                         f"only; give device='cpu' or 'cuda'")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"engine_context(device={str(device)!r}): this machine has no CUDA device "
                         f"(torch.cuda.is_available() is False); give device='cpu'")
    if device.type == "cuda" and device.index is not None and device.index >= (count := torch.cuda.device_count()):
        seen = f"{count} CUDA devices (cuda:0 to cuda:{count - 1})" if count > 1 else f"{count} CUDA device (cuda:0)"
        raise ValueError(f"engine_context(device={str(device)!r}): this process sees {seen}; give one of those "
                         f"(CUDA_VISIBLE_DEVICES may hide the others)")
    return device


def make_engine(name: str, ctx: EngineContext | None = None,
                options: EngineOptions | None = None) -> DataParallelEngine:
    """This rank's engine `name` ("odc" or "collective"); torch.distributed must already be
    initialised (under torchrun: dist.init_process_group()). `ctx` defaults to engine_context()
    of the default process group, `options` to the engine's defaults; either way the options
    are resolved for ctx's device (ValueError, one line, where the device cannot run them)."""
    spec = engine_spec(name)
    if ctx is None:
        ctx = engine_context()
    elif not isinstance(ctx, EngineContext):  # a device given as ctx failed in "'str' object has no attribute"
        raise TypeError(f"make_engine's ctx is an EngineContext, got {type(ctx).__name__}: for a device, "
                        f"make_engine({name!r}, engine_context(device={str(ctx)!r}))")
    chosen = spec.options() if options is None else options
    if not isinstance(chosen, spec.options):
        raise TypeError(f"engine {name!r} takes {spec.options.__name__}, got {type(chosen).__name__}")
    engine: DataParallelEngine = importlib.import_module(spec.module).build(ctx, chosen.for_device(ctx.device.type))
    return engine
