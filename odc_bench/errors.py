"""Every error the harness reports to its user, and how bad input ends a command.

Bad input (ConfigError and its kinds) is one line naming the problem and the fix; a command
that meets it prints `odc_bench: error: <message>` and exits with status 2, having written
nothing. RunFailed is not bad input: a run that started and failed becomes a row.
"""

from __future__ import annotations

import sys
from typing import NoReturn


class ConfigError(ValueError):
    """Bad input: the message is one line naming the problem and the fix."""


class CombinationError(ConfigError):
    """Settings each valid on its own that cannot run together (collective FSDP with a balancer
    that gives ranks different microbatch counts): a sweep skips such a combination. `keys` are
    the config keys whose values clash."""

    def __init__(self, message: str, keys: tuple[str, ...]) -> None:
        super().__init__(message)
        self.keys = keys


class DataError(ConfigError):
    """Unusable real data (a file, a dataset folder, a tokenizer)."""


class TableError(ConfigError):
    """A results table this code must not read or append to."""


class PairingError(ConfigError):
    """Runs that cannot be paired as asked."""


class RunFailed(RuntimeError):
    """A rank failed or the run outlived its deadline; the message names the rank."""


def fail(error: BaseException, prog: str = "odc_bench") -> NoReturn:
    """End the command for bad input: the one-line message on stderr, exit status 2."""
    print(f"{prog}: error: {error}", file=sys.stderr)
    sys.exit(2)
