"""Discoverability: `python -m odc_bench --help` (or `help`) names every entry point, config group,
option, sweep, tool and launcher, and every console script the package declares runs its entry point."""

from __future__ import annotations

import importlib
import re
import runpy
import tomllib
import warnings

import pytest

from odc_bench.cli.help import runnable, summary
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
            listed = re.search(rf"python -m odc_bench\.{package}\.{command.stem}(\s|$)", out) is not None
            assert listed == runnable(command), f"{command}: listed exactly when `python -m` runs it"
    assert "odc_bench.studies.pages" not in out, "the studies' page helper ran nothing under python -m"
    assert "hydra/launcher=slurm" in out and "--hydra-help" in out
    assert "make gpu-check is the one command to run on a GPU machine" in flat


def test_help_describes_each_command_by_its_whole_first_paragraph(capsys):
    """A docstring's first line alone stopped mid-sentence ("... at most 6 minutes on")."""
    assert odc_bench("--help") == 0
    flat = " ".join(capsys.readouterr().out.split())
    for module in ("tools/gpu_check.py", "studies/sensitivity.py", "tools/sim_bench.py"):
        paragraph = summary(REPO / "odc_bench" / module)
        assert "\n" not in paragraph and paragraph.endswith("."), paragraph
        assert paragraph in flat, module


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_console_script_names_a_callable_entry_point(script):
    module, _, name = SCRIPTS[script].partition(":")
    assert callable(getattr(importlib.import_module(module), name))


COMMANDS = sorted({"odc_bench.whatif", "odc_bench.results", "paper_figures", *(
    f"odc_bench.{p.parent.name}.{p.stem}" for package in ("calibrate", "studies", "tools")
    for p in (REPO / "odc_bench" / package).glob("*.py") if runnable(p))})


@pytest.mark.parametrize("module", COMMANDS)
def test_every_command_prints_its_help_and_exits_0(module, monkeypatch, capsys):
    """gpu_check and cost_model took --help for an unknown argument (exit status 2), and every
    option must have help text (CommandParser refuses one without): building the parser is enough
    to find one missing. Run as `python -m` runs it, its __main__ block included."""
    monkeypatch.setattr("sys.argv", [module, "--help"])
    with warnings.catch_warnings(), pytest.raises(SystemExit) as stop:
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is imported already
        runpy.run_module(module, run_name="__main__")
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m {module}"), out[:200]


def test_shell_completion_installs_and_completes_the_odc_bench_command(tmp_path, monkeypatch, capsys):
    """`odc-bench --shell-completion install=bash` was refused as an unknown config key (install),
    so Hydra's completion could not be set up; a query completes a group's options."""
    monkeypatch.chdir(tmp_path)
    assert odc_bench("--shell-completion", "install=bash") == 0
    assert "complete -o nospace -o default -F hydra_bash_completion" in capsys.readouterr().out
    monkeypatch.setenv("COMP_LINE", "odc-bench engine=")
    assert odc_bench("-sc", "query=bash") == 0
    assert set(capsys.readouterr().out.split()) == {"engine=collective", "engine=odc"}
    assert not list(tmp_path.iterdir()), "nothing written"
