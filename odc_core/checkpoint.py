"""Sharded checkpoints in one format for both engines, through torch.distributed.checkpoint (DCP).

What is saved is what an FSDP2 training loop saves with DCP's get_state_dict: `model` (each
parameter by its name, sharded) and `optim` (the optimizer's state by parameter name, and its
param_groups), the LR schedule's state where configure_optimizer() built one (a resumed run
restarted it, at its first rate, without a word), plus `extra` (the caller's: data position, RNG
states, anything picklable). FSDP2 gives DCP its DTensors. ODC gives it, for each parameter, the pieces
of its flat shard that fall in that parameter, as boxes of the parameter's shape (a flat range
of a matrix is a partial row, whole rows and a partial row), viewing the heap itself: saving
copies no shard and runs no collective per unit, and loading writes into the heap in place.
So a checkpoint of either engine loads into the other, and at another world size (DCP reads
each box from whichever saved chunks overlap it).

A save is complete or invisible: ranks write into `<root>/step-<N>.partial`, and once DCP has
written its metadata (after every rank's data) rank 0 renames the folder to `<root>/step-<N>`.
A crash before the rename leaves a `.partial` folder that latest() ignores and the next save
removes; the previous checkpoint stays what latest() finds. `keep` removes older complete
checkpoints, only once the new one is complete.

A complete checkpoint can still be damaged later (a copy cut short, a file deleted, a disk that
filled on a file system that reported it late): latest() skips one whose metadata cannot be read
or names a file that is missing or shorter than the metadata says, with a warning, so that a
resume takes the one before (what `keep` is for). Damage inside a file of the right size shows
only as it is read: load() then fails in one line naming the checkpoint.

DCP's own error, CheckpointException, derives from BaseException, so `except Exception` lets it
through (torch.multiprocessing's process wrapper too, which then records no error for the rank):
save() and load() raise CheckpointError, a RuntimeError, with every rank's error in one line.
"""

from __future__ import annotations

import contextlib
import io
import operator
import os
import pickle
import re
import shutil
import traceback
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from odc_core.state import sharded_tensors_quietly

if TYPE_CHECKING:  # the engines import this module's flat_pieces
    from odc_core.engine.base import DataParallelEngine

# DCP is imported where a checkpoint is read or written, not with this module: it loads DTensor
# and sympy, about a second of every rank's start, which a run that never checkpoints (and an
# ODC rank, which has no DTensor) would pay for nothing.

_STEP = re.compile(r"step-(\d+)")
_REPLACED = ".replaced"  # a complete checkpoint a save of its step again replaces, until it is done


def complete(root: str | os.PathLike[str]) -> list[Path]:
    """The complete checkpoints under root, oldest (lowest step) first: step-N, or step-N.replaced
    where a save of step N again was cut short between its two renames (save())."""
    root = Path(root)
    if not root.is_dir():
        return []
    folders = {p.name: p for p in root.iterdir() if p.is_dir()}
    steps = [(int(m.group(1)), p) for name, p in folders.items() if (m := _STEP.fullmatch(name.removesuffix(_REPLACED)))
             and (name == m.group(0) or m.group(0) not in folders)]
    return [p for _, p in sorted(steps)]


def step_of(folder: str | os.PathLike[str]) -> int:
    """The step of a complete checkpoint (one complete() or latest() gives)."""
    m = _STEP.fullmatch(Path(folder).name.removesuffix(_REPLACED))
    if m is None:
        raise ValueError(f"{folder} is not a checkpoint folder (step-N)")
    return int(m.group(1))


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or loaded: the message names it and each rank's error."""


class DamagedCheckpointWarning(UserWarning):
    """latest() skipped a complete checkpoint that cannot be loaded (damage())."""


def damage(folder: str | os.PathLike[str]) -> str | None:
    """Why a complete checkpoint cannot be loaded, found without reading its data: its metadata
    cannot be read, or a file the metadata names is missing or shorter than it says; None when
    neither holds."""
    import torch.distributed.checkpoint as dcp

    folder = Path(folder)
    try:
        metadata = dcp.FileSystemReader(folder).read_metadata()
    except Exception as e:  # a pickle of another torch, cut short, or not a pickle: many kinds
        return f"its .metadata cannot be read ({type(e).__name__}: {e})"
    need: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(need.items()):
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if (held := path.stat().st_size) < size:
            return f"{name} holds {held:,} of its {size:,} bytes"
    return None


def latest(root: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint under root (the highest step) that damage() finds nothing
    wrong with, or None; each newer one skipped for damage is named in a DamagedCheckpointWarning."""
    for folder in reversed(complete(root)):
        why = damage(folder)
        if why is None:
            return folder
        warnings.warn(f"checkpoint {folder} is damaged ({why}): skipped, left as it is",
                      DamagedCheckpointWarning, stacklevel=2)
    return None


@contextlib.contextmanager
def _dcp_errors(what: str, then: str = "") -> Iterator[None]:
    """DCP's CheckpointException as a CheckpointError: `what`, each rank's error line, `then`."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as e:
        # An exit or Ctrl-C that landed mid-save (submitit's time-limit handler exits the task
        # that is to be requeued) stays what it was: DCP wraps even those, and as a failed save the
        # run was recorded failed and its requeue found nothing to resume.
        own = e.failures.get(dist.get_rank()) if dist.is_initialized() else None
        if own is not None and not isinstance(own[0], Exception):
            raise own[0] from None
        by_line: dict[str, list[int]] = {}
        for rank, (exc, _trace) in sorted(e.failures.items()):
            line = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]
            by_line.setdefault(line, []).append(rank)
        ranks = "; ".join(f"rank{'s' * (len(r) > 1)} {', '.join(map(str, r))}: {line}" for line, r in by_line.items())
        raise CheckpointError(f"{what} ({ranks}){f'; {then}' if then else ''}") from e


def save(engine: DataParallelEngine, root: str | os.PathLike[str], step: int,
         extra: dict[str, Any] | None = None, keep: int | None = None) -> Path:
    """Save the engine's parameters and optimizer state, and `extra`, as checkpoint `step`
    under root; collective over the ranks, between minibatches. Returns the folder.

    keep: once this checkpoint is complete, remove all but the newest `keep` complete checkpoints
    under root (by step; None keeps every one). Older ones go only after the new one is complete,
    so a crash mid-save still leaves the previous one."""
    import torch.distributed.checkpoint as dcp

    # A count of another type failed after the save, in the pruning (keep=1.5: "slice indices
    # must be integers"), and keep=True kept one.
    if keep is not None and (isinstance(keep, bool) or not hasattr(keep, "__index__") or operator.index(keep) < 1):
        raise ValueError(f"keep must be a whole number of at least 1 (the checkpoint just saved), or None to keep "
                         f"every one; got {keep!r}")
    # latest() finds step-<N> by its whole number: a checkpoint saved as step-3.0 or step--1 was
    # written and never found, so a resume started again from the first step.
    if isinstance(step, bool) or not hasattr(step, "__index__") or operator.index(step) < 0:
        raise ValueError(f"a checkpoint's step must be a whole number >= 0 (latest() finds the newest by it), got "
                         f"{step!r}")
    step = operator.index(step)
    engine.between_minibatches("checkpoint.save")
    if extra is not None and not isinstance(extra, Mapping):  # dict() of a list failed as if it did not pickle
        raise TypeError(f"a checkpoint's extra must be a dict of names to plain values (load() returns it), got "
                        f"{type(extra).__name__}; save {{'name': value}}")
    try:  # before anything is written: a lambda or an open file in it failed once the save was under way
        extra_bytes = pickle.dumps(dict(extra or {}))
    except Exception as e:  # pickle raises PicklingError, AttributeError or TypeError by what it meets
        raise ValueError(f"a checkpoint's extra must pickle, and it does not ({type(e).__name__}: {e}); keep plain "
                         f"values in it (numbers, strings, tensors, state dicts)") from None
    schedule = _schedule(engine)
    try:
        schedule_bytes = pickle.dumps(schedule.state_dict()) if schedule is not None else None
    except Exception as e:
        raise ValueError(f"the LR schedule's state must pickle to be saved, and {type(schedule).__name__}'s does not "
                         f"({type(e).__name__}: {e}); keep functions out of its attributes, as LambdaLR keeps its "
                         f"lambdas out of its state_dict()") from None
    root = Path(root)
    _same_on_every_rank("the checkpoint to save", f"step {step} under {root}",
                        "every rank must save the same step under the same root")
    final, partial = root / f"step-{step}", root / f"step-{step}.partial"
    engine.drain()  # stale-synchronous ODC: every step begun is applied before anything is read
    if dist.get_rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob("step-*.partial"):
            shutil.rmtree(stale, ignore_errors=True)
        for replaced in root.glob(f"step-*{_REPLACED}"):  # a save's last moment cut short: its new one stands
            if (root / replaced.name.removesuffix(_REPLACED)).is_dir():
                shutil.rmtree(replaced, ignore_errors=True)
    dist.barrier()
    # One pickled object: DCP would flatten a dict of plain values on save but not on load. Each
    # rank's under a key of its own: under one key DCP kept one rank's (it saves a value every
    # rank holds once), and every rank loaded it, where a loop saves state of its own (its RNG).
    state = {**engine.sharded_state(), _extra_key(dist.get_rank()): io.BytesIO(extra_bytes)}
    if schedule is not None and schedule_bytes is not None:
        state[_schedule_key(schedule)] = io.BytesIO(schedule_bytes)
    with sharded_tensors_quietly(), _dcp_errors(f"checkpoint step-{step} could not be saved in {root}"):
        dcp.save(state, checkpoint_id=partial)
    dist.barrier()  # every rank's files and DCP's metadata are written
    if dist.get_rank() == 0:
        # A checkpoint of this step saved before (a run that saves again the step it resumed
        # from) goes only now that the new one is complete: removed before the save, as it was,
        # a save that failed left neither, and latest() the one before or none.
        replaced = root / f"{final.name}{_REPLACED}"
        if final.is_dir():
            final.rename(replaced)
        partial.rename(final)
        _fsync_dir(root)
        shutil.rmtree(replaced, ignore_errors=True)
        if keep is not None:
            for old in complete(root)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load(engine: DataParallelEngine, folder: str | os.PathLike[str] | None) -> dict[str, Any]:
    """Load a checkpoint (of either engine, any world size) into a wrapped engine, before its
    first minibatch; collective. Returns its `extra`. The model alone where the engine has no
    optimizer (a reference model) or the checkpoint holds none (saved by such an engine)."""
    import torch.distributed.checkpoint as dcp

    if folder is None:  # load(engine, latest(root)) where root holds no complete checkpoint
        raise FileNotFoundError("no checkpoint to load: latest(root) found none under root; start from the model "
                                "as it is, or give the root the checkpoints were saved in")
    folder = Path(folder)
    if not (folder / ".metadata").is_file():
        raise FileNotFoundError(f"{folder} is not a complete checkpoint (no .metadata); use latest(root)")
    engine.between_minibatches("checkpoint.load")
    _same_on_every_rank("the checkpoint to load", str(folder), "every rank must load the same checkpoint (find it "
                        "with latest(root) on one rank and broadcast it, or give every rank the same folder)")
    try:
        stored = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
    except Exception as e:  # as damage() reads it: a pickle of another torch, cut short, or not a pickle
        raise CheckpointError(f"checkpoint {folder} cannot be loaded: its .metadata cannot be read "
                              f"({type(e).__name__}: {e}); move it away to resume from the one before") from None
    # A checkpoint of the model alone (an engine without an optimizer saved it: a reference model,
    # weights to start from) loads the model and leaves the optimizer as it is, fresh or not;
    # DCP refused it, missing the optimizer's groups, in words that called it damaged.
    model_alone = not any(key.startswith("optim.") for key in stored)
    # This rank's own extra; at a world size larger than the save's, a rank it did not have gets
    # rank 0's; a checkpoint of every rank's under one key (saved before 2026-12-08) holds one;
    # DCP's own checkpoint of a model and optimizer (dcp.save of FSDP2's state dicts) none.
    extra_key = next((key for key in (_extra_key(dist.get_rank()), _extra_key(0), "extra") if key in stored), None)
    state = {**engine.sharded_state(for_load=True, optimizer=not model_alone)}
    if extra_key is not None:
        state[extra_key] = io.BytesIO()
    schedule = _schedule(engine)
    if "optim" in state:
        _start_absent_fresh(state["optim"]["state"], stored)
        _keep_absent_options(state["optim"]["param_groups"], stored)
    with sharded_tensors_quietly():
        _check_fits(state, stored, folder)
    saved = next((key for key in stored if key.startswith(_SCHEDULE)), None)
    if schedule is not None and saved is not None and saved != _schedule_key(schedule):
        raise ValueError(f"checkpoint {folder} holds the state of a {saved.removeprefix(_SCHEDULE)} LR schedule, and "
                         f"this run's is a {type(schedule).__name__}: configure_optimizer(scheduler=...) with the "
                         f"schedule it was saved with")
    if schedule is not None and saved is not None:
        state[saved] = io.BytesIO()
    elif schedule is not None:
        warnings.warn(f"checkpoint {folder} holds no LR schedule (saved without one, or before checkpoints held "
                      f"it): the schedule starts from its first step", stacklevel=2)
    # No ShardedTensor here nests another, and the pass that unnests them would turn the
    # optimizer's param_groups (plain values only) into one key the checkpoint does not have.
    with sharded_tensors_quietly(), _dcp_errors(f"checkpoint {folder} cannot be loaded",
                                                 "move it away to resume from the one before"):
        dcp.load(state, checkpoint_id=folder, planner=dcp.DefaultLoadPlanner(flatten_sharded_tensors=False))
    engine.load_sharded_state(state)
    if schedule is not None and saved is not None:
        schedule.load_state_dict(pickle.loads(state[saved].getvalue()))
    extra: dict[str, Any] = pickle.loads(state[extra_key].getvalue()) if extra_key is not None else {}
    return extra


def _extra_key(rank: int) -> str:
    return f"extra/{rank}"


# The key a checkpoint holds its LR schedule's state under, with the schedule's type after it: a
# load checks the type before it reads anything (another type's state_dict() loaded as this one's
# attributes without a word).
_SCHEDULE = "scheduler/"


def _schedule_key(schedule: torch.optim.lr_scheduler.LRScheduler) -> str:
    return f"{_SCHEDULE}{type(schedule).__name__}"


def _schedule(engine: DataParallelEngine) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The engine's LR schedule; None without one, or before configure_optimizer()."""
    try:
        return engine.scheduler
    except RuntimeError:  # configure_optimizer() first: a checkpoint of the model alone
        return None


def _same_on_every_rank(what: str, mine: str, fix: str) -> None:
    """ValueError on every rank, before anything is written or read, where the ranks name different
    checkpoints: ranks saving steps of their own (a step counted from a rank's own microbatches)
    each reported it saved, while the complete-looking folder held rank 0's shards and metadata
    naming files another rank had written elsewhere, and latest() then skipped it as damaged;
    ranks loading different ones trained on apart."""
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    other = next((r for r, v in enumerate(every) if v != every[0]), None)
    if other is not None:
        raise ValueError(f"the ranks disagree on {what}: {every[0]} on rank 0, {every[other]} on rank {other}; {fix}")


def start_fresh(views: dict[str, Any]) -> None:
    """A trainable parameter the given state holds nothing for (FSDP2's optimizer keeps none for
    one that never had a gradient, nor for one frozen when it was saved): its moments start at
    zero, as a fresh optimizer's would, and its scalars come with its piece's other parameters."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    for view in views.values():
        if isinstance(view, ShardedTensor):
            for shard in view.local_shards():
                shard.tensor.zero_()


def _start_absent_fresh(optim: dict[str, Any], stored: Mapping[str, Any]) -> None:
    """Leave out of the load, starting them fresh, the parameters the checkpoint (its metadata's
    keys, `stored`) has no optimizer state for: FSDP2 saves none for a parameter that never had
    a gradient, ODC one for every parameter that trains (docs/use_odc.md, "Frozen and unused
    parameters")."""
    prefix = "optim.state."
    held = {key[len(prefix):].rsplit(".", 1)[0] for key in stored if key.startswith(prefix)}
    for name in [name for name in optim if name not in held]:
        start_fresh(optim.pop(name))


def _check_fits(state: dict[str, Any], stored: Mapping[str, Any], folder: Path) -> None:
    """A ValueError, one line and on every rank, before anything loads, where the checkpoint is of
    another model (a parameter or buffer it lacks, or holds in another shape, or one it holds and
    the model has not) or of another optimizer (other state kept for a parameter: SGD's
    momentum_buffer where AdamW keeps exp_avg): DCP's own words were a CheckpointError that called
    the checkpoint damaged, and DCP loads what the model asks for only, so a checkpoint of a deeper
    model loaded its first layers into a shallower one without a word."""
    extra = [key.removeprefix("model.") for key in stored
             if key.startswith("model.") and not _held_by(key.removeprefix("model."), state["model"])]
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise ValueError(f"checkpoint {folder} holds {extra[0]!r}{more}, which the model has not: it is a checkpoint "
                         f"of another model; load it into the model it was saved from")
    for name, value in state["model"].items():
        held = stored.get(f"model.{name}")
        if held is None and isinstance(value, Mapping) and (
                not value or any(key.startswith(f"model.{name}.") for key in stored)):
            continue  # a module's extra state, which DCP stores key by key (an empty one not at all)
        if held is None:
            raise ValueError(f"checkpoint {folder} has no {name!r}, which the model has: it is a checkpoint of another "
                             f"model; load it into the model it was saved from")
        size = getattr(held, "size", None)
        if isinstance(value, torch.Tensor) and size is not None and tuple(size) != tuple(value.size()):
            raise ValueError(f"checkpoint {folder} holds {name!r} in shape {tuple(size)}, the model in "
                             f"{tuple(value.size())}: it is a checkpoint of another model; load it into the model it "
                             f"was saved from")
    for name, values in state.get("optim", {}).get("state", {}).items():
        if any(f"optim.state.{name}.{key}" not in stored for key in values):
            prefix = f"optim.state.{name}."
            kept = sorted(k for k in (key[len(prefix):] for key in stored if key.startswith(prefix)) if "." not in k)
            raise ValueError(f"checkpoint {folder} holds other optimizer state for {name!r} ({', '.join(kept)}) than "
                             f"this optimizer keeps ({', '.join(sorted(values))}): configure_optimizer() with the "
                             f"optimizer and options it was saved with (its type; amsgrad, momentum), then load it")


def _held_by(key: str, model_state: Mapping[str, Any]) -> bool:
    """Whether a checkpoint's model key is one of the model's state keys, or inside one (DCP
    stores a value that is a dict, a module's extra state, key by key under its name)."""
    parts = key.split(".")
    return any(".".join(parts[:n]) in model_state for n in range(len(parts), 0, -1))


def _keep_absent_options(groups: list[dict[str, Any]], stored: Mapping[str, Any]) -> None:
    """Leave out of the load the optimizer group options the checkpoint lacks, which keep the
    values configured, as torch's Optimizer.load_state_dict fills them: an LR schedule's
    initial_lr in a run that adds one to a checkpoint saved without (DCP refused the load with
    "Missing key in checkpoint state_dict: optim.param_groups.0.initial_lr")."""
    for i, group in enumerate(groups):
        for key in [k for k in group if k != "params" and f"optim.param_groups.{i}.{k}" not in stored]:
            del group[key]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def boxes(shape: tuple[int, ...], lo: int, hi: int) -> list[tuple[tuple[int, ...], tuple[int, ...], int, int]]:
    """The flat range [lo, hi) of a row-major tensor of `shape` as boxes: (offsets, sizes, start,
    end), each box the contiguous flat range [start, end)."""
    if lo >= hi:
        return []
    if not shape:
        return [((), (), lo, hi)]
    inner = 1
    for d in shape[1:]:
        inner *= d
    first, last = lo // inner, (hi - 1) // inner
    if first == last:  # within one index of the first dimension
        return [((first, *off), (1, *size), start + first * inner, end + first * inner)
                for off, size, start, end in boxes(shape[1:], lo - first * inner, hi - first * inner)]
    out = []
    whole_lo, whole_hi = -(-lo // inner), hi // inner
    if lo % inner:
        out += boxes(shape, lo, whole_lo * inner)
    if whole_hi > whole_lo:
        out.append(((whole_lo, *[0] * (len(shape) - 1)), (whole_hi - whole_lo, *shape[1:]),
                    whole_lo * inner, whole_hi * inner))
    if hi % inner:
        out += boxes(shape, whole_hi * inner, hi)
    return out


def flat_pieces(name: str, shape: torch.Size, flat: torch.Tensor, flat_lo: int, ranges: list[tuple[int, int, int]],
                rank: int) -> torch.Tensor:
    """A ShardedTensor of a parameter of `shape` whose flat elements are spread over ranks:
    `ranges` gives, for every rank, (rank, lo, hi) of the parameter's flat elements it holds;
    this rank's are `flat`, starting at the parameter's flat element flat_lo. No collective."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardedTensorMetadata
    from torch.distributed._shard.sharded_tensor.metadata import TensorProperties

    metadata, local = [], []
    # A parameter without elements: a ShardedTensor needs a shard, so rank 0 holds it whole.
    pieces = [(r, boxes(tuple(shape), lo, hi)) for r, lo, hi in ranges] or [(0, [((0,) * len(shape), shape, 0, 0)])]
    for owner, owned in pieces:
        for offsets, sizes, start, end in owned:
            md = ShardMetadata(shard_offsets=list(offsets), shard_sizes=list(sizes), placement=f"rank:{owner}/cpu")
            metadata.append(md)
            if owner == rank:
                local.append(Shard(flat[start - flat_lo:end - flat_lo].view(sizes), md))
    props = TensorProperties(dtype=flat.dtype, layout=torch.strided, requires_grad=False,
                             memory_format=torch.contiguous_format, pin_memory=False)
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        local, ShardedTensorMetadata(shards_metadata=metadata, size=shape, tensor_properties=props))
