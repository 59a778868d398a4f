"""The set-up `make demo` and `make test` do, where it went wrong for new users: a python3
older than pyproject's requires-python (Ubuntu 22.04's 3.10) is refused in one line before
anything is installed, where pip installed torch and then refused the project, leaving a .venv
that failed the same way on every later make (this machine's Python stands in for the old one:
the floor is raised above it on make's command line); a .venv moved with its clone, or one
without pip, is refused in one line, and one make's python3 left half made is removed."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make(*args: str) -> subprocess.CompletedProcess:
    """make in the repository as a user's shell runs it: not as the sub-make of `make test`, whose
    level and flags would reach it (its lines then say make[1])."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    return subprocess.run(["make", "-s", "-C", str(REPO), *args], capture_output=True, text=True, timeout=60, env=env)


def make_setup(venv: Path, *settings: str) -> subprocess.CompletedProcess:
    return make("setup", f"VENV={venv}", f"PYTHON={sys.executable}", *settings)


def test_the_floor_is_pyprojects_requires_python():
    floor = re.search(r'^requires-python = ">=([\d.]+)"$', (REPO / "pyproject.toml").read_text(encoding="utf-8"),
                      flags=re.MULTILINE)
    assert floor is not None
    done = make("-p", "-n", "setup")
    assert f"PY_FLOOR := {floor[1]}" in done.stdout.splitlines()


def test_an_older_python_is_refused_in_one_line_before_a_venv_is_made(tmp_path):
    done = make_setup(tmp_path / "venv", "PY_FLOOR=99.0")
    assert done.returncode == 2
    said = [line for line in done.stderr.splitlines() if not line.startswith("make: ***")]
    version = sys.version.split()[0]
    assert said == [f"make: {sys.executable} is Python {version}; odc-bench needs Python 99.0 or newer: install a "
                    f"newer one and run make again with PYTHON set to it (PYTHON=python99.0)"], done.stderr
    assert not (tmp_path / "venv").exists()


def test_a_venv_of_an_older_python_is_refused_and_left_as_it_was(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    done = make_setup(venv, "PY_FLOOR=99.0")
    assert done.returncode == 2
    said = [line for line in done.stderr.splitlines() if not line.startswith("make: ***")]
    assert len(said) == 1 and said[0].startswith(f"make: {venv}/bin/python is Python "), done.stderr
    assert said[0].endswith(f"remove {venv} (rm -rf {venv}) and run make again with PYTHON set to a newer one "
                            f"(PYTHON=python99.0)")
    assert sorted(p.name for p in venv.rglob("*")) == ["bin", "python"], "nothing installed into it"


def test_a_venv_made_for_another_folder_is_refused_in_one_line_and_make_clean_is_not(tmp_path):
    """A venv cannot move with its clone (its scripts name the interpreter by the path it was
    made at): after a move, `make test` failed in "lint-imports: No such file or directory"."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed-stamp").write_text("/where/the clone was/.venv\n", encoding="utf-8")

    def in_venv(*args: str) -> subprocess.CompletedProcess:
        return make(*args, f"VENV={venv}")

    done = in_venv("lint")
    assert done.returncode == 2
    said = (f"{venv} was made at /where/the clone was/.venv and cannot move with the clone: remove it (rm -rf {venv}) "
            f"and run make again.  Stop.\n")
    assert re.fullmatch(rf"Makefile:\d+: \*\*\* {re.escape(said)}", done.stderr), done.stderr
    assert in_venv("-n", "clean").returncode == 0
    (venv / ".installed-stamp").write_text(f"{venv.resolve()}\n", encoding="utf-8")
    assert in_venv("-n", "lint").returncode == 0, "where it was made"


def test_a_venv_that_fails_half_made_is_removed_and_one_without_pip_is_refused(tmp_path):
    """Debian's python3 without python3-venv makes a venv without pip, then fails: that .venv
    failed every later make in "No module named pip", even once python3-venv was installed."""
    if os.statvfs(tmp_path).f_flag & os.ST_NOEXEC:
        pytest.skip("the stand-in python3 is a script in the temporary folder, which is mounted noexec here")
    venv = tmp_path / "venv"
    fails = tmp_path / "python3"  # a Python whose venv module fails as Debian's does, half way
    python = shlex.quote(sys.executable)
    fails.write_text(f'#!/bin/sh\nif [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && ln -s {python} '
                     f'"$3/bin/python"; echo "ensurepip is not available" >&2; exit 1; fi\nexec {python} "$@"\n',
                     encoding="utf-8")
    fails.chmod(0o755)
    done = make_setup(venv, f"PYTHON={fails}")
    assert done.returncode == 2 and "ensurepip is not available" in done.stderr, done.stderr
    assert not venv.exists(), "the half-made venv removed"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    done = make_setup(venv)
    assert done.returncode == 2
    said = [line for line in done.stderr.splitlines() if not line.startswith("make: ***")]
    assert said == [f"make: {venv} has no pip, which make installs with (a venv made without it, as uv venv makes "
                    f"them): add it ({venv}/bin/python -m ensurepip), or remove {venv} (rm -rf {venv}) and run make "
                    f"again"], done.stderr
    assert (venv / "bin" / "python").exists(), "a venv make did not make is left as it is"
