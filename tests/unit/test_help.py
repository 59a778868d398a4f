"""Discoverability: `python -m odc_bench --help` (or `help`) names every entry point, config group,
option, sweep, tool and launcher, and every console script the package declares runs its entry point."""

from __future__ import annotations

import importlib
import tomllib

import pytest

from odc_bench.cli.help import summary
from tests.helpers import REPO, odc_bench

SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.mark.parametrize("flag", ["--help", "-h", "help"])
def test_help_lists_entry_points_groups_options_sweeps_tools_and_launchers(flag, capsys):
    assert odc_bench(flag) == 0
    out = capsys.readouterr().out
    for module in ("odc_bench.whatif", "odc_bench.results", "paper_figures"):
        assert f"python -m {module}" in out
    for script in SCRIPTS:
        assert f"({script})" in out or f"the {script} script" in out, script
    conf = REPO / "odc_bench" / "conf"
    for group in ("model", "dataset", "engine", "balancer", "backend", "backend/hardware", "task"):
        line = next(ln for ln in out.splitlines() if ln.split() and ln.split()[0] == group)
        assert {o.strip(",") for o in line.split()[1:]} == {p.stem for p in (conf / group).glob("*.yaml")}
    sweeps = next(ln for ln in out.splitlines() if ln.split() and ln.split()[0] == "sweep")
    assert {o.strip(",") for o in sweeps.split()[1:]} == {p.stem for p in (REPO / "sweeps").glob("*.yaml")}
    flat = " ".join(out.split())
    for package in ("calibrate", "studies", "tools"):
        for command in (REPO / "odc_bench" / package).glob("*.py"):
            if command.stem != "__init__":
                assert f"python -m odc_bench.{package}.{command.stem}" in out
    assert "hydra/launcher=slurm" in out and "--hydra-help" in out
    assert "make gpu-check is the one command to run on a GPU machine" in flat


def test_help_describes_each_command_by_its_whole_first_paragraph(capsys):
    """A docstring's first line alone stopped mid-sentence ("... at most 6 minutes on")."""
    assert odc_bench("--help") == 0
    flat = " ".join(capsys.readouterr().out.split())
    for module in ("tools/gpu_check.py", "studies/sensitivity.py", "studies/pages.py"):
        paragraph = summary(REPO / "odc_bench" / module)
        assert "\n" not in paragraph and paragraph.endswith("."), paragraph
        assert paragraph in flat, module


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_console_script_names_a_callable_entry_point(script):
    module, _, name = SCRIPTS[script].partition(":")
    assert callable(getattr(importlib.import_module(module), name))
