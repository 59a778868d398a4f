"""Writing files so that nothing is ever half-written: a temporary beside the target, renamed over it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


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
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        # mkstemp makes the file private; give it the mode a plain open() would (results are shared)
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask())
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path`'s lock file (path + .lock) for writers that read-modify-write it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(path.suffix + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
    existing = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        lines = mountinfo.read_text().splitlines()
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
