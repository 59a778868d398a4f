"""The command line's config, composed by Hydra: the group files (odc_bench/conf) and the
sweep files (sweeps/NAME.yaml, offered as `sweep=NAME`)."""

from __future__ import annotations

import functools
import os
import re
import shlex
from collections.abc import Collection, Sequence
from pathlib import Path

import yaml
from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverrideParseException, OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from odc_bench.config.hub import hub_hint
from odc_bench.config.run import RunConfig, load
from odc_bench.errors import ConfigError
from odc_bench.provenance import REPO_ROOT

SWEEPS_DIR = Path(os.environ.get("ODC_SWEEPS_DIR", REPO_ROOT / "sweeps"))
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
_ABSENT = object()


def register_sweeps(only: Collection[str] | None = None) -> dict[str, str]:
    """Expose each sweeps/NAME.yaml as the config option `sweep=NAME` (package _global_), or with
    `only` those NAMEs alone; return the files that cannot be read as a config, by NAME, each with
    why in one line. Those are not offered: one broken file must not stop the sweeps beside it.

    A file already in Hydra's store unchanged (its path, size and time, kept as the node's
    provider) is not read again: every composition registers them, and reading them all is
    a good part of composing one run. With `only`, the store keeps no other sweep: Hydra
    deep-copies its whole store at every composition, so each sweep held there slowed every
    composition of a process that had chosen one (each job of a multirun, most tests)."""
    store = ConfigStore.instance()
    stored = store.repo.setdefault("sweep", {})
    paths = sorted(SWEEPS_DIR.glob("*.yaml"))
    if only is not None:
        paths = [path for path in paths if path.stem in only]
        for other in [key for key in stored if key.removesuffix(".yaml") not in only]:
            del stored[other]
    unreadable = {}
    for path in paths:
        st = path.stat()
        stamp = f"{path}:{st.st_size}:{st.st_mtime_ns}"
        node = stored.get(f"{path.stem}.yaml")
        if node is not None and node.provider == stamp:
            continue
        try:
            config = OmegaConf.load(path)
        except (yaml.YAMLError, OmegaConfBaseException, UnicodeDecodeError) as e:
            unreadable[path.stem] = f"{path} cannot be read as a config ({_yaml_problem(e)}); fix the file"
            continue
        if not isinstance(config, DictConfig):
            unreadable[path.stem] = (f"{path} holds a list at its top, not the settings of a sweep "
                                     f"(hydra.sweeper.params and the rest, by name); fix the file")
            continue
        store.store(group="sweep", name=path.stem, node=config, package="_global_", provider=stamp)
    return unreadable


def _yaml_problem(error: Exception) -> str:
    """A YAML error in one line: what is wrong and where."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).strip().splitlines()[0]
    return f"{problem}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def register_chosen_sweep(*command_lines: Sequence[str]) -> None:
    """The sweep files, where a command line chooses one (the only time they are read);
    ConfigError when the file one chooses cannot be read."""
    for overrides in command_lines:
        _check_sweeps_dir(overrides)
    chosen = {name for overrides in command_lines if (name := _chosen_sweep(overrides)) is not None}
    if not chosen:
        return
    # A name of no file (a typo, a glob, a list) leaves them all to Hydra, whose error lists them.
    named = {path.stem for path in SWEEPS_DIR.glob("*.yaml")}
    unreadable = register_sweeps(chosen if chosen <= named else None)
    if broken := sorted(chosen & unreadable.keys()):
        raise ConfigError(unreadable[broken[0]])


def _chosen_sweep(overrides: Sequence[str]) -> str | None:
    chosen = [o.split("=", 1)[1] for o in overrides if o.lstrip("+~").split("=", 1)[0] == "sweep" and "=" in o]
    return chosen[-1] if chosen else None


def _check_sweeps_dir(overrides: Sequence[str]) -> None:
    if (chosen := _chosen_sweep(overrides)) is None:
        return
    if chosen.startswith((".", "~", "/")) or chosen.endswith((".yaml", ".yml")):
        # Hydra looked the path up as an option name: "unknown sweep/. option 'mine.yaml'".
        path = Path(chosen).expanduser()
        where = (f"run it as ODC_SWEEPS_DIR={path.resolve().parent} python -m odc_bench sweep={path.stem}"
                 if path.is_file() else "no such file; give a sweep file's name without .yaml")
        raise ConfigError(f"sweep={chosen}: a sweep is chosen by its file's name, not its path: {where} "
                          f"(ODC_SWEEPS_DIR: a folder of sweep files; docs/sweeps.md)")
    own = any(o.startswith(("-cd", "--config-dir", "hydra.searchpath")) for o in overrides)  # may hold sweep/
    if not own and not any(SWEEPS_DIR.glob("*.yaml")):
        # The sweep files live beside the package, in the repository: an installed wheel has none,
        # and Hydra then said "unknown config key 'sweep'".
        if os.environ.get("ODC_SWEEPS_DIR"):
            raise ConfigError(f"sweep={chosen}: there are no sweep files in ODC_SWEEPS_DIR={SWEEPS_DIR}; set it to a "
                              f"folder of sweep files (NAME.yaml, as the repository's sweeps/ holds them), or unset it "
                              f"for the repository's")
        raise ConfigError(f"sweep={chosen}: there are no sweep files in {SWEEPS_DIR} (the repository's sweeps/ "
                          f"folder, which an installed odc-bench does not carry); run from a checkout of the "
                          f"repository, or set ODC_SWEEPS_DIR to a folder of sweep files")


def compose_config(overrides: Sequence[str] = (), hydra: bool = False) -> DictConfig:
    """The config `python -m odc_bench OVERRIDES` runs (one run: sweeps are not expanded);
    with `hydra`, Hydra's own section too."""
    register_chosen_sweep(overrides)
    with initialize_config_module("odc_bench.conf", version_base="1.3"):
        refuse_odd_groups(overrides)
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def compose_run(overrides: Sequence[str] = ()) -> RunConfig:
    """The typed config of the run `python -m odc_bench OVERRIDES` asks for."""
    return compose_runs([overrides])[0]


def compose_runs(runs: Sequence[Sequence[str]]) -> list[RunConfig]:
    """compose_run of each command line, under one Hydra initialisation (its config search path
    is set up once for all of them)."""
    register_chosen_sweep(*runs)
    with initialize_config_module("odc_bench.conf", version_base="1.3"):
        for overrides in runs:  # the calibration tools' and the what-if's command lines too
            refuse_odd_groups(overrides)
        return [load(compose("config", overrides=list(overrides))) for overrides in runs]


def overrides_parser() -> OverridesParser:
    """Hydra's parser of overrides, with the initialised Hydra's config loader where there is one: a
    glob over a config group's options (`balancer=glob(*)`, `engine=glob(*,exclude=sim_*)`) lists
    them through it, and failed without it in "ConfigLoader is not set"."""
    hydra = GlobalHydra.instance()
    return OverridesParser.create(config_loader=hydra.config_loader() if hydra.is_initialized() else None)


def refuse_odd_groups(overrides: Sequence[str]) -> None:
    """ConfigError, one line, for a config group set to what names no option of it: null
    (`model=null`, `hydra/launcher=null`), a number or a boolean (`task=0`, `dataset=true`), each of
    which Hydra's composition ends in a traceback, or a list of several options (`balancer=[a,b]`),
    which Hydra merges into one config and which failed on a key of one in the other's. The
    initialised Hydra says which keys are groups and their options."""
    loader = GlobalHydra.instance().config_loader()
    for override in overrides_parser().parse_overrides(list(overrides)):
        if override.is_delete() or override.is_sweep_override():
            continue
        key, value = override.key_or_group, override.value()
        # Looking a key up as a group costs milliseconds (Hydra searches its path): only those that may be one.
        if isinstance(value, str) or not (key in _package_groups() or key.startswith("hydra/")):
            continue
        if not (options := loader.get_group_options(key)):
            continue
        if isinstance(value, list) and len(value) > 1 and all(isinstance(v, str) for v in value):
            raise ConfigError(f"{override.input_line} chooses several {key} options at once, which Hydra merges "
                              f"into one; choose one, or sweep them: --multirun {key}={','.join(value)}")
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
            continue
        typed = str(override.input_line).partition("=")[2]
        if value is None:
            read_as = ""
        elif isinstance(value, list | dict):
            read_as = f" (Hydra reads {typed} as a {'list' if isinstance(value, list) else 'mapping'})"
        else:
            read_as = (f" (Hydra reads {typed} as a {'boolean' if isinstance(value, bool) else 'number'}; quote it, "
                       f"{key}='{typed}', where an option or folder has that name)")
        raise ConfigError(f"{override.input_line} names no {key} option{read_as}; choose one of {', '.join(options)}, "
                          f"or leave {key} out for its default")


def hydra_quote(value: str) -> str:
    """A string as Hydra's override grammar reads it back unchanged: as it is where the grammar
    takes it so (a plain path), else single-quoted, with a quote, and the backslashes before a
    quote or the end, escaped (a non-ASCII letter, a quote, a comma or bracket, or a value the
    grammar would read as a number, a boolean or null)."""
    try:
        if OverridesParser.create().parse_override(f"k={value}").value() == value:
            return value
    except HydraException:
        pass
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value) + "'"


def string_override(key: str, value: object) -> str:
    """`key=value` for a string setting (a path, a field name) that any value reaches intact."""
    return f"{key}={hydra_quote(str(value))}"


def _quoted(override: str) -> str | None:
    """The override with its value in Hydra's quotes, as one shell word; None where that would not
    help (no key=value, or a value holding both kinds of quote)."""
    key, eq, value = override.partition("=")
    if not eq or not re.fullmatch(r"[+~]{0,2}[\w.@/-]+", key) or ('"' in value and "'" in value):
        return None
    return shlex.quote(f'{key}="{value}"' if '"' not in value else f"{key}='{value}'")


# What composing a run raises for bad input, each said in one line by hydra_error_line: Hydra's
# and OmegaConf's errors, and YAML's where a group option's file (a profile or model config of
# the user's own, on the search path) is not YAML that Hydra can read.
COMPOSE_ERRORS = (HydraException, OmegaConfBaseException, yaml.YAMLError)


def hydra_error_line(error: Exception) -> str:
    """Hydra's or OmegaConf's error about a command line, in one line saying what to do."""
    if isinstance(error, yaml.YAMLError):
        mark = getattr(error, "problem_mark", None)
        where = mark.name if mark is not None and mark.name and not mark.name.startswith("<") else "a config file"
        return f"{where} cannot be read as a config ({_yaml_problem(error)}); fix the file"
    unknown_key = re.match(r"Could not override '([^']+)'", str(error))
    if unknown_key:
        key = unknown_key.group(1)
        group, owners = options_with_key(key)
        if owners:
            return (f"config key {key!r} belongs to {', '.join(f'{group}={o}' for o in owners)}, not to the "
                    f"{group} chosen; choose {'one of those' if len(owners) > 1 else f'{group}={owners[0]}'} "
                    f"or leave {key} out")
        return (f"unknown config key {key!r}; check its spelling "
                f"(`python -m odc_bench --cfg job` prints every key)")
    if isinstance(error, OverrideParseException) and (quoted := _quoted(error.override)):
        reason = error.message.strip().splitlines()[0].split(" See https://")[0]
        if reason.startswith("LexerNoViableAltException"):
            reason = "a character it reads only inside quotes, such as a quote or a non-ASCII letter"
        return f"{error.override!r}: Hydra cannot read it ({reason}); if the value is one string, quote it: {quoted}"
    if isinstance(error, MissingConfigException) and error.options:
        group, value = _group_and_option(error.missing_cfg_file or "")
        if group == "model" and "/" in value:
            return no_model_line(value)
        if value.startswith((".", "~", "/")) or value.endswith((".yaml", ".yml")):
            # Hydra looked the path up as an option's name: "unknown backend/hardware/. option 'mine.yaml'".
            return (f"{group}={value}: an option of {group} is chosen by its name, not its path: put the file in "
                    f"DIR/{group}/NAME.yaml and add --config-dir DIR, then {group}=NAME (docs/configuration.md)")
        if group:
            return f"unknown {group} option {value!r}; choose one of {', '.join(sorted(error.options))}"
    first = str(error).strip().splitlines()
    text = " ".join(line.strip() for line in first[:2] if line.strip())
    # "Error merging override hydra.launcher.nodes=1.5" says what but not why; OmegaConf's cause does.
    cause = str(error.__cause__ or "").strip().splitlines()
    return f"{text} ({cause[0].strip()})" if text and cause and cause[0].strip() not in text else \
        text or type(error).__name__


@functools.cache
def _package_groups() -> frozenset[str]:
    """The package's config groups (odc_bench/conf's folders, and `sweep`)."""
    return frozenset({p.relative_to(CONF_DIR).as_posix() for p in CONF_DIR.rglob("*") if p.is_dir()} | {"sweep"})


def _group_and_option(missing: str) -> tuple[str, str]:
    """The config group and the option asked of it in the file Hydra missed (`backend/hardware/h1`:
    backend/hardware and h1; `model/small/mine`: model and small/mine, an option in a subfolder of
    a user's config folder); ("", missing) where no group of the package's starts it."""
    group = max((g for g in _package_groups() if missing.startswith(f"{g}/")), key=len, default="")
    return group, missing[len(group) + 1:] if group else missing


def no_model_line(value: str) -> str:
    """The one line for a model= value that is neither a config option nor a model's config."""
    options = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
    return (f"model={value}: no model config, and no Hugging Face model folder (holding a config.json) or "
            f"config.json there; give one of {', '.join(options)}, or your model's folder or "
            f"config.json{hub_hint(value, 'model', 'model={}')}")


def options_with_key(key: str) -> tuple[str, list[str]]:
    """For a key GROUP.REST (engine.staleness): the group and those of its options
    (odc_bench/conf/GROUP/*.yaml) that have REST, so a key set on the wrong option is named as such."""
    group, _, rest = key.partition(".")
    folder = CONF_DIR / group
    if not rest or not folder.is_dir():
        return group, []
    return group, sorted(path.stem for path in folder.glob("*.yaml")
                         if OmegaConf.select(OmegaConf.load(path), rest, default=_ABSENT) is not _ABSENT)
