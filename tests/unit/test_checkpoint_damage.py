"""A checkpoint damaged after it was complete (a file cut short or gone, its metadata unreadable,
bytes overwritten) is skipped by latest() with a warning, or refused by load() in one line; a
save DCP could not write is one line too. DCP's own error derives from BaseException, which
`except Exception` (torch's process wrappers included) lets through without a word."""

from __future__ import annotations

import re
import uuid
import warnings
from functools import partial
from pathlib import Path

import pytest
import torch
from torch import nn

from odc_core import checkpoint
from odc_core.engine.base import EngineContext
from odc_core.engine.build import make_engine
from odc_core.engine.registry import OdcOptions


@pytest.fixture
def engine(one_rank_group):
    eng = make_engine("odc", EngineContext(torch.device("cpu"), one_rank_group, uuid.uuid4().hex[:8], 30.0, "fp32"),
                      OdcOptions(transport="shm", prefetch=False))
    model = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3))
    eng.wrap(model, list(model))
    eng.configure_optimizer(partial(torch.optim.AdamW, lr=1e-2))
    yield eng
    eng.close()


def _saved(engine, root: Path) -> tuple[Path, Path]:
    return checkpoint.save(engine, root, 1, {"at": 1}), checkpoint.save(engine, root, 2, {"at": 2})


def _data_file(folder: Path) -> Path:
    return next(p for p in sorted(folder.iterdir()) if p.suffix == ".distcp")


def _latest(root: Path) -> tuple[Path | None, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", checkpoint.DamagedCheckpointWarning)
        found = checkpoint.latest(root)
    return found, [str(w.message) for w in caught]


def _cut_short(folder: Path) -> None:
    _data_file(folder).write_bytes(_data_file(folder).read_bytes()[:100])


@pytest.mark.parametrize(("damage", "why"), [
    (_cut_short, r"__0_0.distcp holds 100 of its [\d,]+ bytes"),
    (lambda f: _data_file(f).unlink(), r"__0_0.distcp is missing"),
    (lambda f: (f / ".metadata").write_bytes(b"not a pickle"), r"its .metadata cannot be read \(UnpicklingError"),
])
def test_latest_skips_a_damaged_checkpoint_with_a_warning_and_finds_the_one_before(engine, tmp_path, damage, why):
    first, second = _saved(engine, tmp_path)
    assert checkpoint.damage(second) is None and _latest(tmp_path) == (second, [])
    damage(second)
    found, said = _latest(tmp_path)
    assert found == first, "the resume takes the checkpoint before the damaged one"
    assert len(said) == 1 and said[0].startswith(f"checkpoint {second} is damaged (")
    assert re.search(why, said[0]), said[0]
    assert second.exists(), "a damaged checkpoint is left for its owner to look at"
    assert checkpoint.load(engine, found) == {"at": 1}
    damage(first)
    assert _latest(tmp_path)[0] is None and len(_latest(tmp_path)[1]) == 2


def test_a_checkpoint_damaged_inside_its_files_is_refused_in_one_line(engine, tmp_path):
    _, second = _saved(engine, tmp_path)
    data = _data_file(second)
    data.write_bytes(bytes(data.stat().st_size))  # every byte zero, the size unchanged: only reading finds it
    assert checkpoint.latest(tmp_path) == second
    with pytest.raises(checkpoint.CheckpointError) as refused:
        checkpoint.load(engine, second)
    message = str(refused.value)
    assert isinstance(refused.value, Exception) and "\n" not in message
    assert message.startswith(f"checkpoint {second} cannot be loaded (rank 0: ")
    assert "UnpicklingError" in message and message.endswith("; move it away to resume from the one before")


def test_a_save_dcp_cannot_write_is_refused_in_one_line(engine, tmp_path):
    (tmp_path / "step-3.partial").write_text("a file where the save's folder goes")
    with pytest.raises(checkpoint.CheckpointError, match=r"^checkpoint step-3 could not be saved in .* \(rank 0: "):
        checkpoint.save(engine, tmp_path, 3)
    assert not (tmp_path / "step-3").exists()


def test_a_failed_save_of_a_step_saved_before_leaves_the_one_saved_before(engine, tmp_path, monkeypatch):
    """A run that saves again the step it resumed from: the save removed the complete checkpoint
    of that step before writing, so a save that failed left neither, and latest() the one before
    (or none). Now the old one goes once the new one is complete."""
    _, second = _saved(engine, tmp_path)
    with monkeypatch.context() as failing:
        failing.setattr(torch.distributed.checkpoint.FileSystemWriter, "write_data", _no_room)
        with pytest.raises(checkpoint.CheckpointError):
            checkpoint.save(engine, tmp_path, 2, {"at": "again"})
    assert checkpoint.latest(tmp_path) == second and checkpoint.load(engine, second) == {"at": 2}
    assert checkpoint.save(engine, tmp_path, 2, {"at": "again"}, keep=1) == second
    assert checkpoint.complete(tmp_path) == [second] and checkpoint.load(engine, second) == {"at": "again"}
    # cut short between its two renames: the replaced one is found until the next save is done
    second.rename(tmp_path / "step-2.replaced")
    found = checkpoint.latest(tmp_path)
    assert found == tmp_path / "step-2.replaced" and checkpoint.step_of(found) == 2
    assert checkpoint.save(engine, tmp_path, 3, keep=1) == checkpoint.latest(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["step-3"]


def test_an_extra_that_does_not_pickle_is_refused_before_anything_is_written(engine, tmp_path):
    with pytest.raises(ValueError, match=r"^a checkpoint's extra must pickle, and it does not \((AttributeError|"
                                         r"PicklingError|TypeError): .*; keep plain values in it"):
        checkpoint.save(engine, tmp_path / "root", 1, {"schedule": lambda step: 0.1})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kwargs,error,said", [
    (dict(extra=[1, 2]), TypeError, "a checkpoint's extra must be a dict of names to plain values (load() returns "
                                    "it), got list; save {'name': value}"),
    (dict(keep=1.5), ValueError, "keep must be a whole number of at least 1 (the checkpoint just saved), or None to "
                                 "keep every one; got 1.5"),
    (dict(keep="2"), ValueError, "keep must be a whole number of at least 1"),
    (dict(keep=True), ValueError, "keep must be a whole number of at least 1"),
])
def test_a_checkpoints_extra_or_keep_of_another_type_is_refused_before_anything_is_written(engine, tmp_path, kwargs,
                                                                                          error, said):
    """A list as extra was refused as if it did not pickle ("cannot convert dictionary update
    sequence"); keep=1.5 saved, then failed in the pruning ("slice indices must be integers"),
    and keep=True kept one."""
    with pytest.raises(error) as refused:
        checkpoint.save(engine, tmp_path / "root", 1, **kwargs)
    assert str(refused.value).startswith(said)
    assert list(tmp_path.iterdir()) == []


class _Warmup(torch.optim.lr_scheduler.LRScheduler):
    """An LR schedule that keeps a function among its attributes, so in its state_dict()."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.rule = lambda step: min(1.0, (step + 1) / 10)
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        return [base * self.rule(self.last_epoch) for base in self.base_lrs]


def test_an_lr_schedule_whose_state_does_not_pickle_is_refused_before_anything_is_written(one_rank_group, tmp_path):
    """Checkpoints hold the engine's LR schedule: one that keeps a lambda is refused in one line
    before anything is written, as an extra that does not pickle is."""
    eng = make_engine("odc", EngineContext(torch.device("cpu"), one_rank_group, uuid.uuid4().hex[:8], 30.0, "fp32"),
                      OdcOptions(transport="shm", prefetch=False))
    try:
        model = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3))
        eng.wrap(model, list(model))
        eng.configure_optimizer(partial(torch.optim.AdamW, lr=1e-2), scheduler=_Warmup)
        with pytest.raises(ValueError, match=r"^the LR schedule's state must pickle to be saved, and _Warmup's does "
                                             r"not \((AttributeError|PicklingError|TypeError): .*; keep functions out"):
            checkpoint.save(eng, tmp_path / "root", 1)
        assert list(tmp_path.iterdir()) == []
    finally:
        eng.close()


def _no_room(*args: object, **kwargs: object) -> None:
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("cut", [SystemExit(-1), KeyboardInterrupt()], ids=["exit", "ctrl-c"])
def test_an_exit_that_lands_mid_save_stays_an_exit(engine, tmp_path, monkeypatch, cut):
    """submitit's time-limit handler exits the task it requeues (SystemExit(-1)); DCP wraps what
    its writer raises, exits too, and as a failed save the run was recorded failed and its
    requeued job had nothing to resume."""
    def cut_short(*args, **kwargs):
        raise cut

    monkeypatch.setattr(torch.distributed.checkpoint.FileSystemWriter, "write_data", cut_short)
    with pytest.raises(type(cut)) as raised:
        checkpoint.save(engine, tmp_path, 3)
    assert raised.value.args == cut.args
    assert not (tmp_path / "step-3").exists()


@pytest.mark.parametrize("step", [3.0, -1, "x", True, "../up"])
def test_a_step_latest_could_not_find_is_refused_before_anything_is_written(engine, tmp_path, step):
    """Before, such a checkpoint was written (step-3.0, step--1, step-x, step-True, or outside the
    root) and latest() never found it: a resume started again from the first step."""
    with pytest.raises(ValueError, match=r"^a checkpoint's step must be a whole number >= 0 \(latest\(\) finds the "
                                         r"newest by it\), got "):
        checkpoint.save(engine, tmp_path / "root", step)
    assert list(tmp_path.iterdir()) == []


def test_a_step_of_any_integer_type_is_found_by_latest(engine, tmp_path):
    import numpy as np

    assert checkpoint.latest(tmp_path) is None
    assert checkpoint.save(engine, tmp_path, np.int64(4)) == tmp_path / "step-4" == checkpoint.latest(tmp_path)


def test_loading_what_latest_found_under_an_empty_root_says_so(engine, tmp_path):
    """Before: TypeError, "argument should be a str or an os.PathLike object ..., not 'NoneType'"."""
    with pytest.raises(FileNotFoundError, match=r"^no checkpoint to load: latest\(root\) found none under root; "):
        checkpoint.load(engine, checkpoint.latest(tmp_path))
