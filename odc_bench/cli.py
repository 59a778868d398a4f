"""Command-line checks that run before Hydra, so every bad input ends the same way.

Hydra reports an unknown config option or a malformed override as a multi-line error with
exit status 1. Composing the command line once ourselves first turns those into the
project's contract: one line on stderr naming the problem and the fix, exit status 2,
nothing written.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence

from hydra import compose, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf.errors import OmegaConfBaseException

from odc_bench.app import fail_config, register_sweeps
from odc_bench.app import main as hydra_main
from odc_bench.config import ConfigError


def first_combination(overrides: Sequence[str]) -> list[str]:
    """The overrides with every sweep (a,b / range(...)) replaced by its first value."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    out = []
    for o in parsed:
        if o.is_hydra_override():
            continue
        if o.is_sweep_override():
            out.append(f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}")
        else:
            out.append(o.input_line)
    return out


def _one_line(error: Exception) -> str:
    unknown_key = re.match(r"Could not override '([^']+)'", str(error))
    if unknown_key:
        return (f"unknown config key {unknown_key.group(1)!r}; check its spelling "
                f"(`python -m odc_bench --cfg job` prints every key)")
    if isinstance(error, MissingConfigException) and error.options:
        group = (error.missing_cfg_file or "").rsplit("/", 1)
        if len(group) == 2:
            return (f"unknown {group[0]} option {group[1]!r}; choose one of {', '.join(sorted(error.options))}")
    first = str(error).strip().splitlines()
    text = " ".join(line.strip() for line in first[:2] if line.strip())
    return text or type(error).__name__


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


def precheck(argv: Sequence[str]) -> None:
    """Compose the command line's config (the first run of a sweep); ConfigError if it fails."""
    overrides = overrides_of(argv)
    multirun = any(a in ("-m", "--multirun") for a in argv) or any(
        o.startswith(("sweep=", "hydra.mode=")) for o in overrides)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        sweeps = [o.input_line for o in parsed if o.is_sweep_override() and not o.is_hydra_override()]
        if sweeps and not multirun:
            raise ConfigError(f"{sweeps[0]!r} lists several values; add --multirun to sweep over them, "
                              f"or quote the value to pass it as one string")
        combination = first_combination(overrides)
        with initialize_config_module("odc_bench.conf", version_base="1.3"):
            compose("config", overrides=combination)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_one_line(e)) from None


def main(argv: Sequence[str] | None = None) -> None:
    register_sweeps()
    try:
        precheck(sys.argv[1:] if argv is None else argv)
    except ConfigError as e:
        fail_config(e)
    hydra_main()
