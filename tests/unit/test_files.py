"""Files written so that nothing is half-written, and files that belong together replaced together
(odc_bench/files.py)."""

from __future__ import annotations

import errno
import importlib
import os
import signal
import sys
import uuid
from pathlib import Path

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


def _package_interrupted_while_it_loads(folder: Path, name: str) -> Path:
    """A package whose __init__ sends this process Ctrl-C and then imports the rest of it, which
    touches the file returned."""
    (folder / name).mkdir()
    (folder / name / "__init__.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n"
                                               "from . import rest\n", encoding="utf-8")
    ran = folder / f"{name}.ran"
    (folder / name / "rest.py").write_text(f"import pathlib\npathlib.Path({str(ran)!r}).touch()\n", encoding="utf-8")
    return ran


def test_ctrl_c_while_a_held_package_loads_is_raised_once_its_code_has_run(tmp_path, monkeypatch):
    """How torch is imported by the commands (odc_bench/__main__.py): a KeyboardInterrupt raised
    inside its C++ initialisation aborted the interpreter. A package not named is not held."""
    held, free = f"held_{uuid.uuid4().hex[:8]}", f"free_{uuid.uuid4().hex[:8]}"
    held_ran, free_ran = (_package_interrupted_while_it_loads(tmp_path, n) for n in (held, free))
    monkeypatch.syspath_prepend(str(tmp_path))
    # Without the finder that importing odc_bench.__main__ installs (test_help.py does): one of
    # this test's own, gone with it.
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, files._HeldImports)])
    files.hold_interrupts_while_importing(held)
    with pytest.raises(KeyboardInterrupt):
        importlib.import_module(held)
    assert held_ran.exists(), "the held package's code ran to its end first"
    with pytest.raises(KeyboardInterrupt):
        importlib.import_module(free)
    assert not free_ran.exists()
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


@pytest.mark.parametrize("given,says", [
    ("{tmp}/a-file", "{tmp}/a-file is not a directory; give a folder"),
    ("{tmp}/a-file/sub", "{tmp}/a-file/sub cannot be created: {tmp}/a-file is not a directory; give a folder"),
    ("/proc/x", "/proc/x is on proc (/proc), a pseudo-filesystem showing the kernel's state, which cannot hold "
                "results; give a folder on a disk"),
])
def test_an_output_folder_that_cannot_be_written_is_refused_in_one_line(given, says, tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(files.argparse.ArgumentTypeError) as refused:
        files.writable_folder(given.format(tmp=tmp_path))
    assert str(refused.value) == says.format(tmp=tmp_path)
    assert files.writable_folder(str(tmp_path / "new" / "deeper")) == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists(), "checking makes nothing"


def test_an_output_file_needs_a_folder_that_takes_it_and_is_not_a_folder_itself(tmp_path):
    with pytest.raises(files.argparse.ArgumentTypeError, match=f"^{tmp_path} is a directory; give a file's path$"):
        files.writable_file(str(tmp_path))
    with pytest.raises(files.argparse.ArgumentTypeError, match="^/sys/t.csv: its folder /sys is on sysfs"):
        files.writable_file("/sys/t.csv")
    assert files.writable_file(str(tmp_path / "sub" / "t.csv")) == tmp_path / "sub" / "t.csv"


def test_a_command_refuses_an_output_it_cannot_write_before_its_work(tmp_path, capsys):
    """The results command's collect, one of the commands whose output options are typed so."""
    from odc_bench.results.__main__ import main

    (tmp_path / "a-file").write_text("x")
    with pytest.raises(SystemExit) as stop:
        main(["collect", str(tmp_path / "nowhere"), "--out", str(tmp_path / "a-file" / "all.csv")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert f"argument --out: {tmp_path}/a-file/all.csv: its folder {tmp_path}/a-file is not a directory; give a file " \
        "in a folder" in err


def test_a_quoted_tilde_in_an_output_or_input_path_is_the_home_folder(tmp_path, monkeypatch):
    """`--out "~/x"` (quoted, the shell leaves it) made a folder named ~ in the working folder."""
    from odc_bench.files import readable_file, writable_file, writable_folder

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "in.csv").write_text("a\n")
    assert writable_folder("~/out") == tmp_path / "out"
    assert writable_file("~/out.csv") == tmp_path / "out.csv"
    assert readable_file("~/in.csv") == tmp_path / "in.csv"
    from odc_bench.errors import CommandParser

    parser = CommandParser("python -m some.tool")
    parser.add_argument("dirs", nargs="+", type=Path, help="folders")
    assert parser.parse_args(["~/a", "b"]).dirs == [tmp_path / "a", Path("b")], "every Path option alike"


def test_a_full_file_system_is_one_line_naming_the_file_and_keeps_the_old_one(tmpfs):
    """A write's own ENOSPC names no file ("[Errno 28] No space left on device" from deep inside
    pandas or gzip): the command that met it could not say what it was writing, or where."""
    folder = tmpfs("64k")
    path = folder / "runs.csv"
    files.atomic_write_text(path, "old\n")
    with pytest.raises(OSError) as full:
        files.atomic_write_text(path, "x" * 200_000)
    assert full.value.errno == errno.ENOSPC
    assert full.value.strerror.startswith(f"cannot write {path}: no space left on device (")
    assert full.value.strerror.endswith(" free of 64 KiB there); free some space or write elsewhere")
    assert path.read_text() == "old\n" and sorted(p.name for p in folder.iterdir()) == ["runs.csv"]


def test_a_command_that_meets_a_full_file_system_ends_in_one_line_with_status_1(capsys):
    """Hydra's job or a side command printed the OSError's traceback."""
    from odc_bench.errors import ends_cleanly

    with pytest.raises(SystemExit) as stop, ends_cleanly():
        raise OSError(errno.ENOSPC, "cannot write /r/runs.csv: no space left on device")
    assert stop.value.code == 1
    assert capsys.readouterr().err == "odc_bench: error: cannot write /r/runs.csv: no space left on device\n"
    with pytest.raises(SystemExit), ends_cleanly("python -m paper_figures"):  # one from a library names its file
        raise OSError(errno.EDQUOT, "Disk quota exceeded", "/r/fig.png")
    assert capsys.readouterr().err == "python -m paper_figures: error: Disk quota exceeded: /r/fig.png\n"
    with pytest.raises(PermissionError), ends_cleanly():  # any other OSError is not this
        raise PermissionError(errno.EACCES, "Permission denied", "/r")


def test_a_claim_is_held_by_one_holder_names_it_to_others_and_survives_its_killed_holder(tmp_path):
    path = tmp_path / "r" / ".run.running"
    with files.claimed(path, "pid 7 on a") as first:
        assert first is None and path.read_text() == "pid 7 on a"
        with files.claimed(path, "pid 8 on b") as second:
            assert second == "pid 7 on a"
        assert path.read_text() == "pid 7 on a", "a refused claim leaves the holder's file alone"
    assert not path.parent.exists(), "let go, the file goes, and the folder made for it"
    path.parent.mkdir()
    path.write_text("pid 9 on a killed host")  # a holder SIGKILLed: its file stays, its lock does not
    with files.claimed(path, "pid 10 on c") as again:
        assert again is None and path.read_text() == "pid 10 on c"
    fresh = tmp_path / "new" / "results" / ".run.running"
    with files.claimed(fresh, "pid 11 on d"):
        (tmp_path / "new" / "kept").write_text("written meanwhile")
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["kept"], "a folder made for the claim alone goes"


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP])
def test_a_results_folder_without_file_locks_is_refused_before_a_run_and_a_lock_met_later_is_one_line(
        code, tmp_path, monkeypatch, capsys):
    # What flock says on NFS whose lock daemon is gone, on Lustre mounted without -o flock, on
    # some FUSE mounts: the table's lock and the run's claim would raise a traceback mid-command.
    import fcntl

    from odc_bench.errors import ConfigError, ends_cleanly
    from odc_bench.results.table import check_results_dir

    def no_locks(fd, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    results = tmp_path / "results"
    with pytest.raises(ConfigError, match=rf"results_dir {results} is on \w+ \(.*\) where file locks fail "
                                          rf"\({os.strerror(code)}\).*set results_dir to a folder on a file system "
                                          r"with locks"):
        check_results_dir(results)
    assert list(tmp_path.iterdir()) == [], "the probe leaves nothing"
    claim = tmp_path / "made" / "for" / ".run.running"
    with pytest.raises(OSError, match=f"cannot lock {claim}"), files.claimed(claim, "pid 7"):
        pass
    assert list(tmp_path.iterdir()) == [], "neither the claim's file nor the folders made for it stay"
    with pytest.raises(SystemExit), ends_cleanly("python -m odc_bench.results"), files.locked(results / "runs.csv"):
        pass
    said = capsys.readouterr().err
    assert said.startswith(f"python -m odc_bench.results: error: cannot lock {results / 'runs.csv'}: ")
    assert said.count("\n") == 1 and "file system with locks" in said
