"""Command-line checks that run before Hydra, so every bad input ends the same way.

Hydra reports an unknown config option or a malformed override as a multi-line error with
exit status 1, and accepts any new key added with `+key=value`. Composing the command line
once ourselves first, and resolving the run it asks for (its first run, for a sweep),
turns those and every other bad input into the project's contract: one line on stderr
naming the problem and the fix, exit status 2, nothing written (not even Hydra's output
folder). docs/errors.md lists them.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_module
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_automatic_config_search_path
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, RangeSweep, ValueType
from omegaconf import DictConfig, OmegaConf

from odc_bench.cli.slurm import check_slurm_available, gpus_requested, job_parameters
from odc_bench.config.compose import COMPOSE_ERRORS, CONF_DIR, hydra_error_line, overrides_parser, refuse_odd_groups
from odc_bench.config.fields import require
from odc_bench.config.run import load
from odc_bench.errors import CombinationError, ConfigError
from odc_bench.files import folder_problem, interrupts_deferred, tmpdir_too_long
from odc_bench.forked import usable_cpus
from odc_bench.jobs.train import uses_mpi
from odc_bench.plan.spec import Planner, check_combination
from odc_bench.results.table import check_results_dir
from odc_bench.sim import check_hardware
from odc_bench.sizes import host_available_bytes, size_label

CONF_MODULE = "odc_bench.conf"
_STOCK_SUBMITIT = "hydra_plugins.hydra_submitit_launcher."


def combinations(overrides: Sequence[str]) -> Iterator[list[str]]:
    """The overrides with every sweep (a,b / range(...)) replaced by one of its values, in sweep order."""
    parsed = overrides_parser().parse_overrides(list(overrides))
    choices = [swept_values(o) if o.is_sweep_override() else [str(o.input_line)] for o in parsed]
    for combination in itertools.product(*choices):
        yield list(combination)


# What a run of a sweep takes at the least while the sweep lists them (its overrides in a list;
# tests/unit/test_sweeps.py checks that none takes less): a sweep of more runs than this host can
# list is refused before the listing grows until the kernel kills the command, which said nothing.
SWEEP_JOB_BYTES = 256


def require_listable(runs: int, what: str, fix: str = "sweep fewer values") -> None:
    """ConfigError, one line, when a sweep of `runs` runs is more than this host's memory can list."""
    need, have = runs * SWEEP_JOB_BYTES, host_available_bytes()
    require(need <= have, f"{what} {runs:,} runs, more than this host can list (at least {size_label(need)} of "
                          f"memory, where it has {size_label(have)} available); {fix}")


def _range_length(override: Override) -> int | None:
    """How many values a range(...) sweep lists, counted without listing them; None for another sweep
    (a list of values is as long as the command line that typed it) or a range Hydra refuses."""
    sweep = override.value()
    if not isinstance(sweep, RangeSweep) or sweep.start is None or sweep.stop is None or not sweep.step:
        return None
    start, stop, step = sweep.start, sweep.stop, sweep.step
    if isinstance(start, int) and isinstance(stop, int) and isinstance(step, int):
        return len(range(start, stop, step))
    return max(0, math.ceil((stop - start) / step))


def swept_values(override: Override) -> list[str]:
    """A swept key's overrides, one per value; ConfigError where a grid cannot list any (an
    interval, which only an optimising sweeper samples; a range with none in it) or more than
    this host can (require_listable)."""
    if override.value_type == ValueType.INTERVAL_SWEEP:
        raise ConfigError(f"{override.input_line!r} is an interval, which a grid sweep cannot list; give the values "
                          f"(a,b,c) or range(start,stop,step)")
    if (length := _range_length(override)) is not None:
        require_listable(length, f"{override.input_line!r} makes")
    values = [f"{override.get_key_element()}={v}" for v in override.sweep_string_iterator()]
    if not values:
        raise ConfigError(f"{override.input_line!r} gives no values, so the sweep would have no runs; give it at "
                          f"least one")
    return values


# Flags that ask Hydra for information rather than a run: only the command line is checked.
_INFO_FLAGS = {"--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help"}
_COMPLETION = ("--shell-completion", "-sc")

# Hydra's flags that take a value as the next argument (`--cfg job`, `-cn config`, ...).
_VALUED_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                 "--config-dir", "-cd", "--experimental-rerun", "--info", "-i"}


def overrides_of(argv: Sequence[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip and "=" not in arg:
            skip = False
            continue
        skip = arg in _VALUED_FLAGS
        if not arg.startswith("-"):
            out.append(arg)
    return out


def _flag_value(argv: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of Hydra's flag (`-cd DIR`, `--config-dir=DIR`), or None where it is not given."""
    for i, arg in enumerate(argv):
        key, eq, value = arg.partition("=")
        if key in names:
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


@contextlib.contextmanager
def _hydra(config_dir: str | None) -> Iterator[None]:
    """Hydra initialised with the package's configs, and --config-dir's folder where it is given,
    placed in the search path where Hydra's own command line puts it: the check composed from the
    package alone, so an option, a sweep or a primary config (-cn) of the user's folder was
    refused as unknown before Hydra could find it."""
    with initialize_config_module(CONF_MODULE, version_base="1.3"):
        if config_dir is not None:
            folder = Path(config_dir).expanduser().absolute()
            if not folder.is_dir():
                raise ConfigError(f"--config-dir {config_dir} is not a folder; give the folder of your own configs")
            path = create_automatic_config_search_path(None, f"{CONF_MODULE}.app", None)
            path.prepend(provider="command-line", path=f"file://{folder}", anchor=SearchPathQuery(provider="schema"))
            GlobalHydra.instance().clear()  # replaced until the block ends, which restores it
            Hydra.create_main_hydra2("app", path)
        yield


def _compose(config_name: str, overrides: list[str], return_hydra_config: bool = False) -> DictConfig:
    """Hydra's compose with Ctrl-C held: OmegaConf interrupted mid-merge raised another error
    instead, which the check took for bad input (cli/__init__.py holds it in Hydra's run too)."""
    with interrupts_deferred():
        return compose(config_name, overrides=overrides, return_hydra_config=return_hydra_config)


def _is_group(name: str) -> bool:
    """Whether `name` is a config group (Hydra's loader knows its repository; the public type does not say)."""
    loader: Any = GlobalHydra.instance().config_loader()
    return bool(loader.repository.group_exists(name))


def _refuse_added_keys(parsed: Sequence[Override], combination: list[str], config_name: str) -> None:
    """`+key=value` (and `++key=value`) may add any key; a key the config lacks is a typo
    that would otherwise ride along unused (and change the run's key)."""
    added = [o for o in parsed if (o.is_add() or o.is_force_add()) and not o.is_hydra_override()
             and not _is_group(o.key_or_group)]
    if not added:
        return
    base = _compose(config_name, overrides=[c for c, o in zip(combination, parsed, strict=True) if o not in added])
    for o in added:
        if OmegaConf.select(base, o.key_or_group, default=_ABSENT) is _ABSENT:
            raise ConfigError(f"unknown config key {o.key_or_group!r} (added by {o.input_line!r}); only keys the "
                              f"config has can be set: check the spelling (`python -m odc_bench --cfg job` "
                              f"prints every key)")


_ABSENT = object()


def refuse_shadowed_options(cfg: DictConfig) -> None:
    """ConfigError where the primary config or an option the run chose is in one of the user's
    config folders (--config-dir, hydra.searchpath) under the name of one of the package's:
    Hydra reads the package's first, so the user's file, edited or not, was never read."""
    runtime = OmegaConf.select(cfg, "hydra.runtime")
    if runtime is None:
        return
    folders = [Path(source.path) for source in runtime.config_sources
               if source.schema == "file" and Path(source.path).resolve() != CONF_DIR]
    primary = str(OmegaConf.select(cfg, "hydra.job.config_name", default="config"))
    for folder in folders:
        if (CONF_DIR / f"{primary}.yaml").is_file() and (mine := folder / f"{primary}.yaml").is_file():
            raise ConfigError(f"{mine} is never read: Hydra finds the package's primary config {primary} first; "
                              f"rename yours and choose it with -cn NAME")
    for group, option in runtime.choices.items():
        if option is None or group.startswith("hydra/") or not (CONF_DIR / group / f"{option}.yaml").is_file():
            continue
        for folder in folders:
            if (mine := folder / group / f"{option}.yaml").is_file():
                raise ConfigError(f"{mine} is never read: Hydra finds the package's {group}={option} first; rename "
                                  f"yours (and its name: field) and choose it by its new name")


def check_run(cfg: DictConfig, planner: Planner) -> None:
    """Everything about the composed run that would fail before or during it: the options it
    chose, its typed config, its plans (made with `planner`, which keeps them for the job), its
    results folder, and the SLURM job it would need."""
    refuse_shadowed_options(cfg)
    config = load(cfg)
    if config.task != "train":
        from odc_bench.jobs.primitives import plan_from_config  # the microbenchmark imports torch

        plan_from_config(config)
        if config.primitives is not None and config.primitives.transport == "mpi":
            from odc_bench.run.mpiexec import mpiexec_path  # the launcher imports torch

            mpiexec_path()
        return
    launcher = str(OmegaConf.select(cfg, "hydra.launcher._target_", default=""))
    if launcher.startswith(_STOCK_SUBMITIT):
        # The plugin calls the job in every task of a SLURM job (each would run the whole run) and
        # waits for its jobs without cancelling them when the command stops (its launch()); before,
        # a simulated sweep went through it and a real run was refused for want of on_interrupt.
        stock = "submitit_slurm" if launcher.endswith("SlurmLauncher") else "submitit_local"
        raise ConfigError(f"hydra/launcher={stock} is hydra-submitit-launcher's own, which runs the whole run in "
                          f"every task rather than a rank per task and leaves its jobs running when the command "
                          f"stops; use hydra/launcher=slurm (it takes submitit_slurm's keys), or the default "
                          f"launcher to run here")
    on_slurm = launcher.endswith("SlurmLauncher")
    spec = planner.resolve(config, remote_cuda=on_slurm and gpus_requested(cfg))
    check_results_dir(Path(config.results_dir))
    if config.simulated:
        check_hardware(spec)
    elif config.checkpoint.every and config.checkpoint.dir is not None:
        # Checked here, not at the first save: there the run failed in an OSError and wrote a failed row.
        folder = Path(config.checkpoint.dir).absolute()
        if (problem := folder_problem(folder)) is not None:
            raise ConfigError(f"checkpoint.dir {folder} {problem[0]}; set it to {problem[1]}, or to null (the "
                              f"results folder's checkpoints/)")
    spec.check_compile()  # a SLURM job's ranks run this Python and torch too
    if on_slurm:
        job_parameters(cfg, spec)
        check_slurm_available()
    else:  # ranks of this host: their memory and CPUs are this host's
        spec.check_devices()
        spec.check_fits()
        threads = config.threads_per_rank
        if not config.simulated and threads is not None and threads > (cpus := usable_cpus()):
            # More threads than CPUs is never faster, and past the OS's limit a rank failed to start them.
            raise ConfigError(f"threads_per_rank={threads} is more threads than the {cpus} CPUs this command may use; "
                              f"set threads_per_rank to at most {cpus}, or null (the CPUs split among the ranks)")
        if uses_mpi(spec):
            from odc_bench.run.mpiexec import mpiexec_path

            mpiexec_path()
        elif not config.simulated and (too_long := tmpdir_too_long()) is not None:
            raise ConfigError(too_long)


def check_completion(argv: Sequence[str]) -> None:
    """ConfigError unless `--shell-completion` has one of Hydra's subcommands, which Hydra then
    answers (nothing composed: `install=bash` is no config key; the precheck refused it as one,
    and without a subcommand Hydra failed in a traceback). Hydra's shell hooks complete a script
    by its own name, so the `odc-bench` command, not `python -m odc_bench`."""
    given = [a for a in argv if a.split("=", 1)[0] in ("install", "uninstall", "query")]
    if len(given) != 1:
        raise ConfigError("--shell-completion takes one of install=SHELL, uninstall=SHELL or query=SHELL (SHELL: bash, "
                          "zsh or fish), e.g. eval \"$(odc-bench --shell-completion install=bash)\"; the completion is "
                          "of the odc-bench command (Hydra's shell hooks do not complete python -m odc_bench)")


def precheck(argv: Sequence[str], planner: Planner) -> None:
    """Compose the command line's config (for a sweep, its first combination that can run) and
    check the run, planned with `planner`; ConfigError if anything is wrong."""
    if any(a in _COMPLETION for a in argv):
        check_completion(argv)
        return
    overrides = overrides_of(argv)
    multirun = any(a in ("-m", "--multirun") for a in argv) or any(
        o.startswith(("sweep=", "hydra.mode=")) for o in overrides)
    info_only = any(a.split("=", 1)[0] in _INFO_FLAGS for a in argv)
    config_name = _flag_value(argv, ("--config-name", "-cn")) or "config"
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        sweeps = [o.input_line for o in parsed if o.is_sweep_override() and not o.is_hydra_override()]
        if own := [o.input_line for o in parsed if o.is_sweep_override() and o.is_hydra_override()]:
            raise ConfigError(f"{own[0]!r} lists several values of a setting of Hydra's, which Hydra does not sweep; "
                              f"give it one value, and run the command once per value")
        if sweeps and not multirun:
            raise ConfigError(f"{sweeps[0]!r} lists several values; add --multirun to sweep over them, "
                              f"or quote the value to pass it as one string")
        with _hydra(_flag_value(argv, ("--config-dir", "-cd"))):
            cannot_run: CombinationError | None = None
            for combination in combinations(overrides):
                refuse_odd_groups(combination)
                cfg = _compose(config_name, overrides=combination, return_hydra_config=True)
                _refuse_added_keys(parsed, combination, config_name)
                if info_only:
                    return
                try:
                    check_combination(load(cfg))
                except CombinationError as e:
                    if not multirun:
                        raise
                    cannot_run = cannot_run or e  # the sweep skips it: check the next combination
                    continue
                break
            else:
                raise ConfigError(f"no combination of the sweep can run, e.g.: {cannot_run}")
    except COMPOSE_ERRORS as e:
        raise ConfigError(hydra_error_line(e)) from None
    if multirun and str(OmegaConf.select(cfg, "hydra.sweeper._target_", default="")).endswith(".BasicSweeper"):
        # Hydra's own checks none of the jobs this check does not see: a later one that cannot run
        # failed the sweep after the runs before it had written their rows.
        raise ConfigError("hydra/sweeper=basic is Hydra's own, which checks no run before the sweep starts and "
                          "stops at the first that cannot run; leave hydra/sweeper out: the default (grids) "
                          "sweeps the same values, checks every run first and skips those that cannot run")
    check_output_dir(cfg, multirun)
    check_run(cfg, planner)


def check_output_dir(cfg: DictConfig, multirun: bool) -> None:
    """ConfigError when Hydra could not make its output folder (a run's config and log, under
    the working folder by default): run from a read-only checkout, Hydra failed in its
    traceback before the job began."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    folder = Path(str(OmegaConf.select(cfg, key))).absolute()
    problem = folder_problem(folder)
    if problem is not None:
        raise ConfigError(f"Hydra's output folder {folder} {problem[0]}; run from a folder you can write, or set "
                          f"{key} to {problem[1]}")
