"""docs/tutorial.md cannot rot: every command in its console blocks runs here, in a scratch folder
holding a copy of examples/, and prints the output the page shows (timings aside). The README's
what-if excerpt is checked against the same run.

After a change that moves the numbers, `ODC_UPDATE_TUTORIAL=1 pytest tests/unit/test_tutorial.py`
writes the new outputs into the page; read them before committing (the prose around them may
need the same care).
"""

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

TUTORIAL = REPO / "docs" / "tutorial.md"
README = REPO / "README.md"
BLOCK = re.compile(r"```console\n(.*?)```", re.DOTALL)


def blocks(text: str) -> list[list[tuple[str, list[str]]]]:
    """Each console block as its commands, each with the output lines shown under it."""
    out = []
    for body in BLOCK.findall(text):
        steps: list[tuple[str, list[str]]] = []
        for line in body.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif steps:
                steps[-1][1].append(line)
        out.append(steps)
    return out


def normal(lines: list[str]) -> list[str]:
    """Lines as compared: trailing spaces and blank lines at the end dropped, timings masked."""
    lines = [re.sub(r"\(\d+(\.\d+)? s\)", "(N s)", ln.rstrip()) for ln in lines]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    # UTF-8 whatever the locale, as the page shows it (a Latin-1 terminal gets ASCII boxes); the
    # interpreter quoted, for a clone under a folder with a space.
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="140", HYDRA_FULL_ERROR="0", PYTHONUNBUFFERED="1",
               PYTHONIOENCODING="utf-8")
    env.pop("TERM", None)
    return subprocess.run(["bash", "-c", command.replace(".venv/bin/python", shlex.quote(sys.executable))], cwd=cwd,
                          env=env, capture_output=True, encoding="utf-8", timeout=600)


@pytest.mark.slow
def test_the_tutorial_prints_what_it_shows_and_the_readme_excerpt_is_in_it(tmp_path):
    shutil.copytree(REPO / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("*.npy"))
    text = TUTORIAL.read_text(encoding="utf-8")
    actual: dict[str, list[str]] = {}
    for steps in blocks(text):
        for command, shown in steps:
            done = run(command, tmp_path)
            printed = normal((done.stdout + done.stderr).splitlines())
            actual[command] = printed
            if os.environ.get("ODC_UPDATE_TUTORIAL"):
                assert done.returncode in (0, 2), (command, done.stderr[-2000:])
            else:
                failing = any(": error: " in line for line in shown)  # bad input shown: exit status 2
                assert done.returncode == (2 if failing else 0), (command, done.stderr[-2000:])
                assert printed == normal(shown), f"{command}\n--- the page shows ---\n" + "\n".join(shown) + \
                    "\n--- it prints ---\n" + "\n".join(printed)
    if os.environ.get("ODC_UPDATE_TUTORIAL"):
        def fill(match: re.Match) -> str:
            lines = []
            for command, _ in blocks(match.group(0))[0]:
                lines += [f"$ {command}", *actual[command]]
            return "```console\n" + "\n".join(lines) + "\n```"
        TUTORIAL.write_text(BLOCK.sub(fill, text), encoding="utf-8")
    (readme,) = [steps for steps in blocks(README.read_text(encoding="utf-8")) if steps]
    for command, excerpt in readme:
        assert command in actual, "the README's what-if command is the tutorial's"
        missing = [line for line in normal(excerpt) if line and line != "..." and line not in actual[command]]
        assert not missing, missing
