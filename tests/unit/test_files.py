"""Files written so that nothing is half-written, and files that belong together replaced together
(odc_bench/files.py)."""

from __future__ import annotations

import os
import signal

import pytest

from odc_bench import files
from odc_bench.files import atomic_paths


def _pair(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "table.csv").write_text("old table")
    (folder / "figure.png").write_text("old figure")
    return folder / "table.csv", folder / "figure.png"


def test_a_pair_written_in_full_replaces_both_and_leaves_no_temporary(tmp_path):
    table, figure = _pair(tmp_path)
    with atomic_paths(table, figure) as (t, f):
        t.write_text("new table")
        f.write_text("new figure")
    assert (table.read_text(), figure.read_text()) == ("new table", "new figure")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figure.png", "table.csv"]


def test_a_failure_or_ctrl_c_in_the_block_leaves_both_as_they_were(tmp_path):
    table, figure = _pair(tmp_path)
    for stop in (RuntimeError("the figure failed"), KeyboardInterrupt()):
        with pytest.raises(type(stop)), atomic_paths(table, figure) as (t, f):
            t.write_text("new table")
            raise stop
        assert (table.read_text(), figure.read_text()) == ("old table", "old figure")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["figure.png", "table.csv"]


def test_a_failed_block_removes_the_folders_it_made_and_no_other(tmp_path):
    (tmp_path / "kept").mkdir()
    with pytest.raises(RuntimeError), atomic_paths(tmp_path / "kept" / "new" / "deeper" / "a.csv",
                                                   tmp_path / "kept" / "new" / "b.png"):
        raise RuntimeError("stopped")
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and not any((tmp_path / "kept").iterdir())


def test_ctrl_c_during_the_renames_is_raised_once_both_are_replaced(tmp_path, monkeypatch):
    table, figure = _pair(tmp_path)
    replace = os.replace
    calls = []

    def ctrl_c_then_replace(src, dst):
        if not calls:
            signal.raise_signal(signal.SIGINT)  # lands between the two renames
        calls.append(dst)
        replace(src, dst)

    monkeypatch.setattr(files.os, "replace", ctrl_c_then_replace)
    with pytest.raises(KeyboardInterrupt), atomic_paths(table, figure) as (t, f):
        t.write_text("new table")
        f.write_text("new figure")
    assert len(calls) == 2
    assert (table.read_text(), figure.read_text()) == ("new table", "new figure")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the handler is put back"


def test_sigterm_with_a_python_handler_waits_for_the_block_and_arrives_once():
    """The command line turns SIGTERM into an exit that unwinds like Ctrl-C (cli/__init__.py): a
    block that must not be cut short holds it as it holds Ctrl-C, then delivers it once."""
    taken: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: taken.append(signum))
    try:
        with files.interrupts_deferred():
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)
            assert taken == [], "held inside the block"
        assert taken == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
