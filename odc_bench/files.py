"""Writing files so that nothing is ever half-written: a temporary beside the target, renamed over it."""

from __future__ import annotations

import argparse
import codecs
import contextlib
import errno
import fcntl
import importlib.abc
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from odc_bench.errors import NO_LOCKS, NO_ROOM, given_path
from odc_bench.sizes import size_label


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def stale_temporaries(path: Path) -> list[Path]:
    """Temporary files a writer of `path` killed mid-write left behind (see atomic_path)."""
    return list(path.parent.glob(f".{path.name}.*.tmp"))


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary file beside `path` to write; it replaces `path` only when the block succeeds."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        if e.errno in NO_ROOM:
            raise no_room(e, path) from None
        raise
    os.close(fd)
    try:
        # mkstemp makes the file private; give it the mode a plain open() would (results are shared)
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask())
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno in NO_ROOM:
            raise no_room(e, path) from None
        raise


@contextlib.contextmanager
def atomic_paths(*paths: Path) -> Iterator[tuple[Path, ...]]:
    """Temporaries beside several files that belong together (a table and its figure), which
    replace them together when the block succeeds: an error or a Ctrl-C in the block leaves
    every file as it was, and a Ctrl-C during the renames is raised once they are all done, so
    the files never come from two different calls. Folders it made for them go again when the
    block fails."""
    made = sorted({folder for p in paths for folder in _missing_folders(p)}, key=lambda f: len(f.parts), reverse=True)
    try:
        with contextlib.ExitStack() as stack:
            temporaries = tuple(stack.enter_context(atomic_path(p)) for p in paths)
            yield temporaries
            with interrupts_deferred():
                stack.close()
    except BaseException:
        for folder in made:  # deepest first; one that holds something else now stays
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def no_room(error: OSError, path: Path) -> OSError:
    """`error` (ENOSPC or EDQUOT from writing `path`) in words that name the file and the room its
    file system has left: a write's own error names no file."""
    reason = (error.strerror or "no space left").lower()
    return OSError(error.errno, f"cannot write {path}: {reason}{room_left(path)}; free some space or write elsewhere")


def room_left(path: Path) -> str:
    """` (<free> free of <size> there)` for the file system `path` would be written to; empty where
    it cannot be read."""
    try:
        fs = os.statvfs(nearest_existing(path.absolute().parent))
    except OSError:
        return ""
    return f" ({size_label(fs.f_bavail * fs.f_frsize)} free of {size_label(fs.f_blocks * fs.f_frsize)} there)"


def nearest_existing(path: Path) -> Path:
    """`path`, or the nearest folder above it that exists (a name too long exists nowhere)."""
    while not os.path.exists(path) and path != path.parent:
        path = path.parent
    return path


def _missing_folders(path: Path) -> list[Path]:
    missing, folder = [], path.absolute().parent
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


# The interrupts_deferred blocks open in the main thread, innermost last: each with the signals
# it noted and the handlers it replaced.
_holds: list[tuple[list[int], dict[signal.Signals, Any]]] = []


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Ctrl-C (SIGINT), and SIGTERM and SIGHUP where a Python handler makes them unwind like
    Ctrl-C (the command line's, cli/__init__.py), noted rather than raised inside the block and
    delivered after it, also when the block raised (the signal's exception then replaces the
    block's). Under their default action the process ends at once: nothing to hold.
    A Python-level handler, not a blocked signal: the process's other threads would still take
    the signal, and CPython raises it in the main thread whichever thread took it."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread sets handlers, and only there is Ctrl-C raised
        return
    noted: list[int] = []
    held = [signal.SIGINT] + [s for s in (signal.SIGTERM, signal.SIGHUP) if callable(signal.getsignal(s))]
    previous = {signum: signal.signal(signum, lambda signum, frame: noted.append(signum)) for signum in held}
    _holds.append((noted, previous))
    try:
        yield
    finally:
        _holds.pop()
        # Delivered whether the block ended well or not: a signal sent to the command's whole
        # process group also ends the fork server a block may be starting ranks from, and the
        # block's EOFError is then its echo, not what the command must end with.
        _deliver(noted, previous)


def _deliver(noted: list[int], previous: dict[signal.Signals, Any]) -> None:
    """The handlers in `previous` back, then each signal `noted` once, as they would have taken it."""
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    taken, noted[:] = list(dict.fromkeys(noted)), []
    for number in taken:
        handler = previous[signal.Signals(number)]
        if callable(handler):
            handler(number, None)
        elif handler == signal.SIG_DFL:
            signal.raise_signal(number)


@contextlib.contextmanager
def interrupts_live() -> Iterator[None]:
    """Inside an interrupts_deferred block, a block where its signals act as they did before it
    (what it noted so far delivered first), held again after. The command line holds Ctrl-C while
    Hydra's own code runs, and its jobs, sweeper and launcher run in such blocks."""
    if not _holds or threading.current_thread() is not threading.main_thread():
        yield
        return
    noted, previous = _holds[-1]
    noting = {signum: signal.getsignal(signum) for signum in previous}
    try:
        _deliver(noted, previous)
        yield
    finally:
        for signum, handler in noting.items():
            signal.signal(signum, handler)


class _HeldImports(importlib.abc.MetaPathFinder):
    """Finds nothing itself: a module of its packages is found by the finders after it, and its
    loading (an extension's init included) runs under interrupts_deferred."""

    def __init__(self) -> None:
        self.packages: set[str] = set()

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name.partition(".")[0] not in self.packages:
            return None
        for finder in sys.meta_path[sys.meta_path.index(self) + 1:]:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                # A file loader is this module's own (one per file found), so wrapping its
                # methods leaves every other module's loading alone.
                if isinstance(spec.loader, importlib.abc.FileLoader):
                    for method in ("create_module", "exec_module"):
                        setattr(spec.loader, method, _deferring(getattr(spec.loader, method)))
                return spec
        return None


def _deferring(load: Callable[..., Any]) -> Callable[..., Any]:
    def held(*args: Any) -> Any:
        with interrupts_deferred():
            return load(*args)
    return held


def hold_interrupts_while_importing(*packages: str) -> None:
    """From now on, Ctrl-C (and what interrupts_deferred holds) that comes while a module of
    `packages` loads is delivered as that module's code ends (the import then raises it, with no
    C++ frame of the module's below it). torch's own initialisation runs
    Python from C++ that may not throw: a KeyboardInterrupt raised there aborted the command
    (`terminate called after throwing an instance of 'pybind11::error_already_set'`, SIGABRT),
    leaving its cleanup undone; the commands import torch late, only when a run needs it."""
    finder = next((f for f in sys.meta_path if isinstance(f, _HeldImports)), None)
    if finder is None:
        finder = _HeldImports()
        sys.meta_path.insert(0, finder)
    finder.packages.update(packages)


def text_encoding(path: Path) -> str:
    """The codec that reads a user's text file as the text it holds: UTF-32 or UTF-16 where it
    starts with their byte-order mark (Windows PowerShell's `>` writes UTF-16), else UTF-8, with
    a mark at its start dropped (Windows editors and some exporters save one)."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):  # before UTF-16: FF FE 00 00 starts like it
        return "utf-32"
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    return "utf-8-sig"


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def _flock(fd: int, operation: int, path: Path) -> None:
    """flock, a file system without locks said with the file and what to do (the check of a
    results folder, locks_fail, says it before a run; a command that skipped it meets it here)."""
    try:
        fcntl.flock(fd, operation)
    except BlockingIOError:
        raise
    except OSError as e:
        if e.errno not in NO_LOCKS:
            raise
        raise OSError(e.errno, f"cannot lock {path}: {(e.strerror or 'no locks').lower()}, and the harness locks "
                               f"the files several commands write; write them on a file system with locks (a "
                               f"local disk, Lustre mounted with -o flock, NFS with its lock daemon)") from None


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path`'s lock file (path + .lock) for writers that read-modify-write it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(path.suffix + ".lock"), "a", encoding="utf-8") as lock:
        _flock(lock.fileno(), fcntl.LOCK_EX, path)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def claimed(path: Path, owner: str) -> Iterator[str | None]:
    """Claim `path` (a lock file) for this process without waiting: yields None once claimed,
    the file then holding `owner` until the claim ends and the file is removed; or, where another
    process holds it, what that one wrote there ("" if it has not yet). The kernel drops a
    killed holder's lock, so a file it left is claimed again. Folders made for the file go with
    it where nothing else was put in them."""
    made = _missing_folders(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666 & ~_umask())
        try:
            _flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, path)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace")
            os.close(fd)
            yield holder
            return
        except OSError:  # no locks here: the file, and folders made for it, go
            os.close(fd)
            path.unlink(missing_ok=True)
            for folder in made:
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise
        # A holder that ended between this open and this lock removed the file: a lock on it
        # would claim nothing, so claim the path again.
        with contextlib.suppress(FileNotFoundError):
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner.encode(), 0)
        yield None
    finally:
        path.unlink(missing_ok=True)  # before the lock goes, so no one claims a file about to vanish
        os.close(fd)
        for folder in made:  # deepest first; one that holds something now stays
            with contextlib.suppress(OSError):
                folder.rmdir()


# File systems that show the kernel's state as files and cannot hold a results folder.
PSEUDO_FILESYSTEMS = frozenset({
    "proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "pstore", "bpf", "configfs",
    "fusectl", "mqueue", "binfmt_misc", "efivarfs", "selinuxfs", "devpts", "nsfs", "rpc_pipefs", "autofs",
})


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes are written as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def filesystem_of(path: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> tuple[str, Path] | None:
    """The type and mount point of the file system that holds `path` (or would hold it: the
    nearest existing folder above it decides); None where the kernel does not say (not Linux)."""
    existing = nearest_existing(path.absolute())
    try:
        lines = mountinfo.read_text(encoding="utf-8", errors="surrogateescape").splitlines()  # as os.fsdecode
    except OSError:
        return None
    resolved, best = existing.resolve(), None
    for line in lines:
        fields = line.split()
        if "-" not in fields:
            continue
        mount = Path(_unescape(fields[4]))
        fstype = fields[fields.index("-") + 1]
        if resolved.is_relative_to(mount) and (best is None or len(mount.parts) >= len(best[1].parts)):
            best = (fstype, mount)
    return best


def folder_problem(folder: Path) -> tuple[str, str] | None:
    """Why files cannot be written into `folder` (made where missing), or None where they can:
    (what is wrong, the kind of folder to give instead), in words a message goes on with after
    the folder's name. Checked before a command does its work, so that bad input writes nothing."""
    if (too_long := name_too_long(folder)) is not None:
        return too_long, "a folder with shorter names"
    if folder.exists() and not folder.is_dir():
        return "is not a directory", "a folder"
    existing = nearest_existing(folder)
    if not existing.is_dir():
        return f"cannot be created: {existing} is not a directory", "a folder"
    fs = filesystem_of(folder)
    if fs is not None and fs[0] in PSEUDO_FILESYSTEMS:
        return (f"is on {fs[0]} ({fs[1]}), a pseudo-filesystem showing the kernel's state, which cannot hold "
                "results"), "a folder on a disk"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"is not writable ({existing})", "a folder you can write"
    return None


def locks_fail(folder: Path) -> str | None:
    """Why file locks fail in `folder` (or the nearest folder above it, whose file system it would be
    on), or None: a probe file, unnamed or unlinked at once, locked and closed. Only a file system
    without locks is an answer; a folder that cannot be written is folder_problem's."""
    try:
        with tempfile.TemporaryFile(dir=nearest_existing(folder.absolute())) as probe:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in NO_LOCKS:
            return e.strerror or errno.errorcode[e.errno]
    return None


def name_too_long(path: Path) -> str | None:
    """Why `path` is longer than the file system it is or would be on takes (a name over NAME_MAX
    bytes, the whole over PATH_MAX), or None: the kernel's ENAMETOOLONG came out of whatever
    first touched it, an input's check or an output's first write, as a traceback."""
    path = path.absolute()
    existing = nearest_existing(path)
    name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    for name in path.parts[1:]:
        if (size := len(os.fsencode(name))) > name_max:
            return f"has a name of {size} bytes ({name[:12]}...), over the {name_max} its file system takes"
    if (size := len(os.fsencode(str(path)))) >= path_max:
        return f"is {size} bytes long, over the {path_max - 1} a path may have"
    return None


# A Unix socket's path holds 107 bytes (sun_path, its NUL besides), and multiprocessing's fork
# server, which starts a run's local ranks, puts its socket two names below the temporary folder:
# pymp-XXXXXXXX/listener-XXXXXXXX. A longer TMPDIR failed the run in "AF_UNIX path too long".
SOCKET_PATH_MAX = 107
FORKSERVER_SOCKET = "/pymp-XXXXXXXX/listener-XXXXXXXX"


def tmpdir_too_long() -> str | None:
    """Why the temporary folder cannot hold the fork server's socket, as one line, or None."""
    folder = tempfile.gettempdir()
    size = len(os.fsencode(folder + FORKSERVER_SOCKET))
    if size <= SOCKET_PATH_MAX:
        return None
    return (f"the temporary folder {folder} ({len(os.fsencode(folder))} bytes, from TMPDIR) is too long for the socket "
            f"that starts the local ranks, {len(FORKSERVER_SOCKET)} bytes below it, where a socket's path holds "
            f"{SOCKET_PATH_MAX}: set TMPDIR to a folder of at most {SOCKET_PATH_MAX - len(FORKSERVER_SOCKET)} bytes "
            f"(TMPDIR=/tmp)")


def writable_folder(text: str) -> Path:
    """An output folder option's argparse type: the folder, or the one-line reason it cannot be
    written, before the command does any work (results_dir: check_results_dir). A leading ~ is
    the home folder, as the shell makes it where the path is not quoted."""
    folder = given_path(text, "a folder")
    problem = folder_problem(folder)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{folder} {problem[0]}; give {problem[1]}")
    return folder


def readable_file(text: str) -> Path:
    """An input file option's argparse type: the file must be there, or the command is refused in
    one line before any work (it was a FileNotFoundError's traceback once the work reached it)."""
    path = given_path(text, "a file")
    if (too_long := name_too_long(path)) is not None:
        raise argparse.ArgumentTypeError(f"{text} {too_long}: no file can have it")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: {'a folder, not a file' if path.is_dir() else 'no such file'}")
    return path


def missing_inputs(folder: Path, names: Sequence[str]) -> list[str]:
    """The files of `names` that `folder` lacks: what a command's --doc-only would read."""
    return [name for name in names if not (folder / name).is_file()]


def writable_file(text: str) -> Path:
    """An output file option's argparse type, as writable_folder: the file's folder must take it."""
    path = given_path(text, "a file's path")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a directory; give a file's path")
    problem = folder_problem(path.parent)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{path}: its folder {path.parent} {problem[0]}; give a file in "
                                         f"{problem[1]}")
    return path
