"""Sharded checkpoints (odc_core/checkpoint.py): a resumed run equals an uninterrupted one, a
checkpoint of either engine loads into the other and at another world size, a save that
never finished leaves the previous checkpoint what latest() finds, and `keep` keeps the newest."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from odc_bench.run.ranks import run_ranks
from odc_core import checkpoint
from odc_core.engine.base import EngineContext
from odc_core.engine.build import make_engine
from odc_core.engine.registry import CollectiveOptions, OdcOptions

pytestmark = pytest.mark.slow

STEPS, SAVE_AT, SAMPLES = 5, 2, 12  # 12 samples: equal counts for FSDP2 on 2, 3 and 4 ranks
# eps 1e-4: engines on other world sizes add gradients in another order; with a tiny eps that
# fp32 noise decides the sign of a near-zero parameter's step of size lr (see examples/hf_train.py).
LR, EPS = 1e-2, 1e-4


class Net(nn.Module):
    """Odd shapes, so that flat shards split rows (ODC's boxes) and ranks hold unequal parts."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(7, 13)
        self.mid = nn.Sequential(nn.Tanh(), nn.Linear(13, 11), nn.Tanh())
        self.out = nn.Linear(11, 3, bias=False)
        self.register_buffer("scale", torch.tensor([2.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.mid(self.inp(x))) * self.scale


def _data(step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(step)
    return [(torch.randn(4, 7, generator=g), torch.randn(4, 3, generator=g)) for _ in range(SAMPLES)]


def _mine(step: int, rank: int, world: int, uneven: bool) -> list[int]:
    """This rank's samples: for ODC unevenly, some ranks none, shifting with the step."""
    if not uneven:
        return list(range(rank, SAMPLES, world))
    owner = [(i * i + step) % world for i in range(SAMPLES)]
    return [i for i in range(SAMPLES) if owner[i] == rank]


def _engine(rank: int, world: int, store: dist.Store, engine_name: str, precision: str):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    return _another_engine(rank, store, engine_name, precision)


def _another_engine(rank: int, store: dist.Store, engine_name: str, precision: str):
    options = OdcOptions() if engine_name == "odc" else CollectiveOptions()
    ctx = EngineContext(torch.device("cpu"), dist.PrefixStore("engine", store), f"ck{uuid.uuid4().hex[:6]}"
                        if rank == 0 else "", 60.0, precision)
    job = [ctx.job_id]
    dist.broadcast_object_list(job)
    ctx = EngineContext(ctx.device, ctx.store, job[0], ctx.timeout_s, precision)
    return make_engine(engine_name, ctx, options)


def _train(rank: int, world: int, store: dist.Store, engine_name: str, precision: str, root: str,
           resume: bool, save_at: int | None) -> dict:
    engine = _engine(rank, world, store, engine_name, precision)
    try:
        torch.manual_seed(0)
        model = Net()
        model = engine.wrap(model, [model.inp, model.mid, model.out])
        engine.configure_optimizer(partial(torch.optim.AdamW, lr=LR, eps=EPS, weight_decay=0.1))
        start, extra, extra_ranks = 0, {}, []
        if resume:
            folder = checkpoint.latest(root)
            assert folder is not None
            extra = checkpoint.load(engine, folder)
            start = int(extra["next_step"])
            extra_ranks = [None] * world  # whose extra each rank loaded
            dist.all_gather_object(extra_ranks, extra["rank"])
        losses = []
        for step in range(start, STEPS):
            data = _data(step)
            engine.begin_minibatch()
            total = torch.zeros(())
            for i in _mine(step, rank, world, engine_name == "odc"):
                x, y = data[i]
                out = model(x.to(torch.bfloat16 if precision == "bf16" else torch.float32)).float()
                loss = ((out - y) ** 2).sum() / SAMPLES
                (loss * engine.loss_scale).backward()
                total += loss.detach()
            engine.finish_minibatch()
            dist.all_reduce(total)
            losses.append(float(total))
            if save_at is not None and step + 1 == save_at:
                checkpoint.save(engine, root, step + 1,
                                {"next_step": step + 1, "note": {"engine": engine_name}, "rank": rank})
        engine.drain()
        return {"params": engine.full_parameters(), "losses": losses, "start": start, "extra": extra,
                "extra_ranks": extra_ranks}
    finally:
        engine.close()
        dist.destroy_process_group()


def _run(engine: str, world: int, root: Path, resume: bool = False, save_at: int | None = None,
         precision: str = "fp32") -> dict:
    return run_ranks(_train, world, engine, precision, str(root), resume, save_at, timeout_s=120)[0]


Saved = Callable[[str, int, Path, str], dict]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Saved:
    """saved(engine, world, root, precision): the uninterrupted run that checkpointed at SAVE_AT,
    its checkpoints copied into `root`. Each run is made once and shared by the tests that resume
    from it (a resume only reads the checkpoint it loads; the copy is the test's to change)."""
    runs: dict[tuple[str, int, str], tuple[dict, Path]] = {}

    def get(engine: str, world: int, root: Path, precision: str = "fp32") -> dict:
        key = (engine, world, precision)
        if key not in runs:
            folder = tmp_path_factory.mktemp(f"{engine}-{world}-{precision}")
            runs[key] = (_run(engine, world, folder, save_at=SAVE_AT, precision=precision), folder)
        whole, folder = runs[key]
        shutil.copytree(folder, root, dirs_exist_ok=True)
        return whole

    return get


@pytest.mark.parametrize(("engine", "precision"), [("odc", "fp32"), ("odc", "bf16"), ("collective", "fp32")])
def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path: Path, saved: Saved, engine: str, precision: str) -> None:
    whole = saved(engine, 2, tmp_path, precision)
    resumed = _run(engine, 2, tmp_path, resume=True, precision=precision)
    assert resumed["start"] == SAVE_AT
    # Each rank's own extra (a loop's RNG state is its rank's): DCP kept one rank's for all.
    assert resumed["extra"] == {"next_step": SAVE_AT, "note": {"engine": engine}, "rank": 0}
    assert resumed["extra_ranks"] == [0, 1]
    if engine == "collective":  # the same run, bit for bit
        assert resumed["losses"] == whole["losses"][SAVE_AT:]
        for name, value in whole["params"].items():
            assert torch.equal(resumed["params"][name], value), name
        return
    # ODC: two ranks' pushes into one owner's accumulator land in whichever order they arrive,
    # so even two uninterrupted runs differ by fp32 rounding of those sums (1e-8 here); a resume
    # that lost or repeated any state would move a parameter by a step of about lr (1e-2).
    torch.testing.assert_close(resumed["losses"], whole["losses"][SAVE_AT:], rtol=1e-6, atol=0)
    for name, value in whole["params"].items():
        torch.testing.assert_close(resumed["params"][name], value, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize(("saver", "loader", "saved_on", "loaded_on"),
                         [("odc", "collective", 2, 2), ("collective", "odc", 2, 2), ("odc", "odc", 4, 2),
                          ("collective", "odc", 4, 3), ("odc", "collective", 2, 3)])
def test_a_checkpoint_loads_into_the_other_engine_and_another_world_size(
        tmp_path: Path, saved: Saved, saver: str, loader: str, saved_on: int, loaded_on: int) -> None:
    whole = saved(saver, saved_on, tmp_path, "fp32")
    resumed = _run(loader, loaded_on, tmp_path, resume=True)
    assert resumed["start"] == SAVE_AT
    # Each rank the save had loads its own extra; one it had not, rank 0's.
    assert resumed["extra_ranks"] == [r if r < saved_on else 0 for r in range(loaded_on)]
    for name, value in whole["params"].items():
        torch.testing.assert_close(resumed["params"][name], value, rtol=0, atol=1e-5, msg=name)
    torch.testing.assert_close(resumed["losses"], whole["losses"][SAVE_AT:], rtol=1e-5, atol=0)


def test_a_save_that_never_finished_is_ignored_and_cleared(tmp_path: Path, saved: Saved) -> None:
    saved("odc", 2, tmp_path, "fp32")
    crashed = tmp_path / f"step-{SAVE_AT + 1}.partial"  # what a crash while saving step 3 leaves
    crashed.mkdir()
    (crashed / "__0_0.distcp").write_bytes(b"half a file")
    assert checkpoint.latest(tmp_path) == tmp_path / f"step-{SAVE_AT}"
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        checkpoint.load(None, crashed)  # type: ignore[arg-type]
    resumed = _run("odc", 2, tmp_path, resume=True, save_at=STEPS)
    assert resumed["start"] == SAVE_AT
    assert checkpoint.latest(tmp_path) == tmp_path / f"step-{STEPS}" and not crashed.exists()


def test_boxes_cover_a_flat_range_exactly() -> None:
    shape = (3, 4, 5)
    for lo, hi in [(0, 60), (7, 8), (3, 47), (20, 40), (19, 41), (59, 60)]:
        seen = torch.zeros(shape, dtype=torch.int64)
        for offsets, sizes, start, end in checkpoint.boxes(shape, lo, hi):
            box = tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=True))
            assert seen[box].numel() == end - start
            seen[box] += 1
            assert torch.equal(torch.arange(60).view(shape)[box].flatten(), torch.arange(start, end))
        assert torch.equal(seen.flatten(), ((torch.arange(60) >= lo) & (torch.arange(60) < hi)).long())


def _save_steps(rank: int, world: int, store: dist.Store, root: str, keep: int | None) -> list[str]:
    engine = _engine(rank, world, store, "odc", "fp32")
    try:
        model = Net()
        engine.wrap(model, [model.inp, model.mid, model.out])
        engine.configure_optimizer(partial(torch.optim.AdamW, lr=LR))
        left = []
        for step in range(1, 5):
            checkpoint.save(engine, root, step, keep=keep)
            left.append(" ".join(sorted(p.name for p in Path(root).iterdir())))
        return left
    finally:
        engine.close()
        dist.destroy_process_group()


def test_save_keeps_the_newest_checkpoints_it_is_asked_to(tmp_path: Path) -> None:
    left = run_ranks(_save_steps, 2, str(tmp_path / "two"), 2, timeout_s=120)[0]
    assert left == ["step-1", "step-1 step-2", "step-2 step-3", "step-3 step-4"]
    every = run_ranks(_save_steps, 2, str(tmp_path / "all"), None, timeout_s=120)[0]
    assert every[-1] == "step-1 step-2 step-3 step-4", "keep=None keeps every checkpoint"
    with pytest.raises(ValueError, match="keep must be a whole number of at least 1"):
        checkpoint.save(None, tmp_path, 1, keep=0)  # type: ignore[arg-type]


def _unlike_checkpoints(rank: int, world: int, store: dist.Store, root: str, engine_name: str) -> list[str]:
    """Save with rank 1 on another step, then under another root, then load other folders: the errors."""
    engine = _engine(rank, world, store, engine_name, "fp32")
    errors = []
    try:
        model = Net()
        engine.wrap(model, [model.inp, model.mid, model.out])
        engine.configure_optimizer(partial(torch.optim.AdamW, lr=LR))
        for call in (lambda: checkpoint.save(engine, root, 3 + rank),
                     lambda: checkpoint.save(engine, f"{root}/r{rank}", 3),
                     lambda: checkpoint.save(engine, root, 1),
                     lambda: checkpoint.save(engine, root, 2),
                     lambda: checkpoint.load(engine, f"{root}/step-{1 + rank}")):
            try:
                call()
                errors.append("")
            except ValueError as e:
                errors.append(str(e))
        return errors
    finally:
        engine.close()
        dist.destroy_process_group()


@pytest.mark.parametrize("engine", ["odc", "collective"])
def test_ranks_naming_different_checkpoints_are_refused_before_anything_is_written_or_loaded(tmp_path: Path,
                                                                                               engine: str) -> None:
    """Before, ranks saving steps of their own each said they saved: the complete-looking step-3
    held rank 0's shards and metadata naming rank 1's file in step-4.partial, and latest() skipped it
    as damaged."""
    root = tmp_path / "ckpt"
    ranks = run_ranks(_unlike_checkpoints, 2, str(root), engine, timeout_s=120)
    assert ranks[0] == ranks[1]
    step, where, first, second, load = ranks[0]
    assert step == (f"the ranks disagree on the checkpoint to save: step 3 under {root} on rank 0, step 4 under "
                    f"{root} on rank 1; every rank must save the same step under the same root")
    assert where.startswith(f"the ranks disagree on the checkpoint to save: step 3 under {root}/r0 on rank 0, ")
    assert first == second == "", "ranks that agree save"
    assert load.startswith(f"the ranks disagree on the checkpoint to load: {root}/step-1 on rank 0, {root}/step-2 on "
                           f"rank 1; every rank must load the same checkpoint")
    assert sorted(p.name for p in root.iterdir()) == ["step-1", "step-2"], "the refused saves wrote nothing"



def _scheduled(rank: int, world: int, store: dist.Store, root: str, engine_name: str) -> list[object]:
    """The learning rate after each of five minibatches uninterrupted, then over a save after
    three and a resume from it; what loading a checkpoint saved without a schedule warns, and
    the error of loading one into a run of another schedule."""
    import warnings

    halving = partial(torch.optim.lr_scheduler.LambdaLR, lr_lambda=partial(pow, 0.5))
    rates: list[object] = []
    engine = _engine(rank, world, store, engine_name, "fp32")
    try:
        for phase, minibatches in (("whole", 5), ("first", 3), ("resumed", 2), ("bare", 0), ("unscheduled", 0),
                                   ("stepped", 0)):
            if phase != "whole":
                engine = _another_engine(rank, store, engine_name, "fp32")
            try:
                model = Net()
                engine.wrap(model, [model.inp, model.mid, model.out])
                stepped = partial(torch.optim.lr_scheduler.StepLR, step_size=2)
                engine.configure_optimizer(partial(torch.optim.AdamW, lr=LR), scheduler=None if phase == "bare"
                                           else stepped if phase == "stepped" else halving)
                if phase in ("resumed", "unscheduled", "stepped"):
                    folder = checkpoint.latest(f"{root}/{'bare' if phase == 'unscheduled' else 's'}")
                    with warnings.catch_warnings(record=True) as warned:
                        warnings.simplefilter("always")
                        try:
                            checkpoint.load(engine, folder)
                        except ValueError as e:
                            rates.append(str(e))
                    rates += [str(w.message) for w in warned if "LR schedule" in str(w.message)]
                for step in range(minibatches):
                    engine.begin_minibatch()
                    for x, y in _data(step)[rank::world]:
                        nn.functional.mse_loss(model(x), y).backward()
                    engine.finish_minibatch()
                    rates.append(engine.optimizer.param_groups[0]["lr"])
                if phase in ("first", "bare"):
                    checkpoint.save(engine, f"{root}/{'s' if phase == 'first' else 'bare'}", 3)
            finally:
                engine.close()
        return rates
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("engine", ["odc", "collective"])
def test_a_resumed_run_goes_on_with_its_lr_schedule_where_it_stopped(tmp_path: Path, engine: str) -> None:
    """Before, the checkpoint held no schedule and the engine gave no handle on the one it built:
    a resumed run's schedule started again from its first rate (here 8x the rate due), without
    a word."""
    rates = run_ranks(_scheduled, 2, str(tmp_path), engine, timeout_s=120)
    assert rates[0] == rates[1]
    halved = [LR * 0.5 ** k for k in range(1, 6)]
    assert rates[0][:10] == pytest.approx([*halved, *halved[:3], *halved[3:]])
    assert len(rates[0]) == 12 and rates[0][10].startswith(f"checkpoint {tmp_path}/bare/step-3 holds no LR schedule")
    assert rates[0][11] == (f"checkpoint {tmp_path}/s/step-3 holds the state of a LambdaLR LR schedule, and this run's "
                            f"is a StepLR: configure_optimizer(scheduler=...) with the schedule it was saved with")


def _unlike_checkpoint(rank: int, world: int, store: dist.Store, root: str, engine_name: str) -> list[str]:
    """A checkpoint of a model trained with SGD and momentum, loaded into the same model with
    AdamW, then into a model with a bias more, then into one with a bias less: the errors."""
    errors = []
    engine = _engine(rank, world, store, engine_name, "fp32")
    try:
        for case in ("save", "optimizer", "model", "smaller"):
            if case != "save":
                engine = _another_engine(rank, store, engine_name, "fp32")
            try:
                model = Net()
                if case == "model":
                    model.out = nn.Linear(11, 3)  # with a bias
                if case == "smaller":
                    model.mid[1] = nn.Linear(13, 11, bias=False)
                engine.wrap(model, [model.inp, model.mid, model.out])
                momentum = partial(torch.optim.SGD, lr=LR, momentum=0.9)
                engine.configure_optimizer(partial(torch.optim.AdamW, lr=LR) if case == "optimizer" else momentum)
                if case == "save":
                    engine.begin_minibatch()
                    for x, y in _data(0)[rank::world]:
                        nn.functional.mse_loss(model(x), y).backward()
                    engine.finish_minibatch()
                    checkpoint.save(engine, root, 1)
                else:
                    checkpoint.load(engine, checkpoint.latest(root))
                    errors.append("loaded")
            except ValueError as e:
                errors.append(str(e))
            finally:
                engine.close()
        return errors
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("engine", ["odc", "collective"])
def test_a_checkpoint_of_another_optimizer_or_model_is_refused_in_one_line_naming_what_differs(tmp_path: Path,
                                                                                             engine: str) -> None:
    """Before, DCP's words came as a CheckpointError that called the checkpoint damaged ("Missing
    key in checkpoint state_dict: optim.state.inp.weight.step"; "move it away to resume from the
    one before")."""
    ranks = run_ranks(_unlike_checkpoint, 2, str(tmp_path), engine, timeout_s=120)
    assert ranks[0] == ranks[1]
    optimizer, model, smaller = ranks[0]
    folder = tmp_path / "step-1"
    assert smaller == (f"checkpoint {folder} holds 'mid.1.bias', which the model has not: it is a checkpoint of "
                       f"another model; load it into the model it was saved from")
    assert optimizer.startswith(f"checkpoint {folder} holds other optimizer state for 'inp.weight' (momentum_buffer) "
                                f"than this optimizer keeps (exp_avg, exp_avg_sq, step): configure_optimizer() with")
    assert model.startswith(f"checkpoint {folder} has no 'out.bias', which the model has: it is a checkpoint of "
                            f"another model")
