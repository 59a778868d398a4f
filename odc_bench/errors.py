"""Every error the harness reports to its user, how bad input ends a command, and how a command
ends when what reads its output has gone or when Ctrl-C lands inside an import.

Bad input (ConfigError and its kinds) is one line naming the problem and the fix; a command
that meets it prints `odc_bench: error: <message>` and exits with status 2, having written
nothing. RunFailed is not bad input: a run that started and failed becomes a row.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import re
import signal
import sys
import textwrap
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn


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


# What a write gets from a full file system or quota: the end of the command (ends_cleanly), not a
# run's failure or bad input (files.no_room says it).
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})
# What flock gives where the file system holds no locks: Lustre mounted without -o flock
# (ENOSYS), NFS whose lock daemon does not answer (ENOLCK); and a file system without the operation
# (EOPNOTSUPP), taken the same way (which ones give it was not checked).
NO_LOCKS = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP})


# Signals that end a command by unwinding, as Ctrl-C does: SIGTERM (kill, scancel) and SIGHUP
# (the terminal or ssh session closed), whose default actions end the process on the spot,
# leaving its ranks' shared memory and the SLURM jobs it submitted. One the command was started
# ignoring stays ignored: `nohup` ignores SIGHUP so that a sweep outlives its terminal.
UNWINDING = (signal.SIGTERM, signal.SIGHUP)


class Stopped(SystemExit):
    """A command unwinding for one of UNWINDING: status 128 + the signal's number. The first
    command on its way out that says so (`say`) is the only one: a command may run another in
    its own process."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signal = signal.Signals(signum)
        self.said = False

    def say(self, line: str) -> None:
        if not self.said:
            with contextlib.suppress(OSError):  # a closed terminal's stderr fails: the line is for a log
                print(line, file=sys.stderr)
            self.said = True


def _raise_stopped(signum: int, frame: object) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def unwinding_on_signals() -> Iterator[None]:
    """Inside, UNWINDING's signals raise Stopped, so that ranks are stopped, their shared memory
    and temporaries removed, and SLURM jobs the command submitted cancelled on the way out; the
    handlers in place before come back after. Only the main thread sets handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _raise_stopped) for signum in UNWINDING
                if signal.getsignal(signum) != signal.SIG_IGN}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def said(error: BaseException | str) -> str:
    """An error's message on one line: a message that quotes another's (pandas' parser errors
    end in a newline, "... saw 2\n") broke the one line a refusal is, its ")" on a line alone."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return "".join(line if i == 0 or line[0] in ")]},.;:" else f" {line}" for i, line in enumerate(lines))


def fail(error: BaseException, prog: str = "odc_bench") -> NoReturn:
    """End the command for bad input: the one-line message on stderr, exit status 2."""
    print(f"{prog}: error: {said(error)}", file=sys.stderr)
    sys.exit(2)


def in_options(message: str, options: Sequence[tuple[str, str]]) -> str:
    """An error of the harness as a command that sets its keys from options says it: each
    (key, option) pair's key, and `key=value`, named by the option (`option value`)."""
    for key, option in options:
        message = re.sub(rf"(?<![\w.]){re.escape(key)}(?![\w])=", f"{option} ", message)
        message = re.sub(rf"(?<![\w.]){re.escape(key)}(?![\w])", option, message)
    return message


def given_path(text: str, what: str) -> Path:
    """A path option's text as a Path, a leading ~ the home folder; an empty or blank one refused
    (argparse's one line), which Path() took for the working folder: `--out ''` was refused as
    ". is a directory", and an input folder of '' read the working folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"an empty path; give {what}")
    return Path(text).expanduser()


def _user_path(text: str) -> Path:
    """A Path option's value: a leading ~ is the home folder; a path no file system can hold (a
    name over its NAME_MAX bytes) is refused here, where the command's first look at it was a
    traceback."""
    path = given_path(text, "a file or folder")
    try:
        path.stat()
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            raise argparse.ArgumentTypeError(f"{text[:40]}...: a name in it is longer than its file system "
                                             f"takes") from None
    return path


class _HelpWithDefaults(argparse.HelpFormatter):
    """An option's help ends with its default, where it has one to say (not None, not a flag's
    False) and the help does not say it already; lines break at spaces only, so that names such
    as run-longalign-x0-125-mb8 and paths stay whole."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False, break_long_words=False)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or "default" in text or any(action.default is v for v in (None, False)) \
                or action.default == argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)"


class CommandParser(argparse.ArgumentParser):
    """argparse's parser held to the bad-input contract: a wrong or missing argument is one line
    on stderr naming it and where the usage is, and exit status 2 (argparse's own prints the
    whole usage first). `prog` is the command as a user types it (command_name). Every argument
    says what it takes: one without help is a programming error, and `--help` shows defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpWithDefaults)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if not kwargs.get("help"):
            raise TypeError(f"{self.prog}: argument {args[0] if args else kwargs.get('dest')} has no help text")
        if kwargs.get("type") is Path:  # a leading ~ is the home folder, quoted or not, as the shell makes it
            kwargs["type"] = _user_path
        return super().add_argument(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {said(message)} (see {self.prog} --help)\n")


def _at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer of at least {least}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be an integer of at least {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    """A count option's argparse type (ranks, steps, repeats): an integer of at least 1."""
    return _at_least(text, 1)


def nonnegative_int(text: str) -> int:
    """A seed's or a staleness's argparse type: an integer of at least 0."""
    return _at_least(text, 0)


def positive_float(text: str) -> float:
    """A scale's or a ratio's argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {value:g}")
    return value


def ratio_at_least_one(text: str) -> float:
    """A packing ratio's argparse type: a finite number of at least 1, as the run's packing_ratio
    (below it the longest sample is over the limit, and a plan failed in a ValueError's traceback)."""
    value = positive_float(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a number of at least 1 (the limit over the longest sample, which "
                                         f"must fit), got {value:g}")
    return value


def command_name(module: str) -> str:
    """`python -m` and the module, for a command module's `__spec__.name` (a package's __main__
    runs as the package)."""
    return f"python -m {module.removesuffix('.__main__')}"


def interrupt_within(error: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C that `error` was raised from, if any. Python 3.11 wraps what a class attribute's
    __set_name__ raises in a RuntimeError, and dataclasses run one per field: a Ctrl-C landing
    while a lazy import defines such a class (torch's checkpoint module, as a run starts) comes
    out as "Error calling __set_name__", which Hydra would report as the job's failure."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        cause = cause.__cause__
    return None


@contextlib.contextmanager
def ends_cleanly(command: str | None = None, prog: str = "odc_bench") -> Iterator[None]:
    """A command whose reader leaves early (`| head`, a pager quit) ends with status 1 and no
    traceback. stdout is flushed inside, so that a small output's broken pipe is met here too
    rather than at the interpreter's exit; once met, stdout points at /dev/null, or that exit
    would fail on it again. Inside, a logging handler that meets the broken pipe (Hydra logs to
    stdout) raises it rather than printing its own traceback on stderr and going on. A Ctrl-C
    that an import wrapped in another error leaves as the Ctrl-C it was (interrupt_within).

    With `command` (the command as typed, command_name), Ctrl-C ends the command in one line,
    "<command>: interrupted", and status 130, as the main app's does, and SIGTERM and SIGHUP in
    "<command>: stopped by SIGTERM" and 128 + the signal (unwinding_on_signals): the side
    commands write their files atomically, so what they wrote is whole and what they were
    writing is not there. Without it both go on to the caller (the main app says what its
    stopped run left).

    A full file system or quota (NO_ROOM) ends the command in one line, "<command or prog>:
    error: cannot write ...", and status 1: every write after it would fail the same way, and
    the file being written is not there (files.atomic_path). So does a file system without locks
    (NO_LOCKS, files.locked), met where no check came first."""
    handle_error = logging.Handler.handleError

    def raise_broken_pipe(handler: logging.Handler, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, BrokenPipeError):
            raise error
        handle_error(handler, record)

    logging.Handler.handleError = raise_broken_pipe  # type: ignore[method-assign, assignment]
    # What stdout cannot encode (a path's é on a latin-1 or ASCII terminal, a file name's bytes
    # that are not UTF-8) is written escaped, as stderr's are: it ended the command in a
    # UnicodeEncodeError.
    with contextlib.suppress(AttributeError, ValueError):  # a replaced stdout (pytest's capture)
        sys.stdout.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    try:
        try:
            with unwinding_on_signals() if command is not None else contextlib.nullcontext():
                yield
            sys.stdout.flush()
        except Exception as e:
            if (ctrl_c := interrupt_within(e)) is not None:
                raise ctrl_c from None
            raise
    except Stopped as e:
        if command is None:
            raise
        e.say(f"{command}: stopped by {e.signal.name}")
        raise
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except OSError as e:
        if e.errno not in NO_ROOM | NO_LOCKS:
            raise
        where = f": {e.filename}" if e.filename else ""
        print(f"{command or prog}: error: {e.strerror}{where}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        if command is None:
            raise
        print(f"{command}: interrupted", file=sys.stderr)
        exec("")  # clears CPython's mark of an unhandled Ctrl-C (see odc_bench.cli.interrupted)
        sys.exit(130)
    finally:
        logging.Handler.handleError = handle_error  # type: ignore[method-assign]
