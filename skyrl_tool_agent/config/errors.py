"""User-facing errors and the CLI guard that turns them into one `error: ...` line and exit status 2.

Library code raises `UserInputError` (or `ConfigError`) for mistakes the user can fix; entry points
wrap themselves in `cli_main_guard()` so those never print a traceback.
"""

from __future__ import annotations

import sys
from contextlib import ContextDecorator
from types import TracebackType

#: Exit status for user errors, as argparse uses for bad command lines.
USER_ERROR_EXIT = 2
#: Exit status after Ctrl-C (128 + SIGINT), the shell convention.
INTERRUPTED_EXIT = 130


def one_line(text: str) -> str:
    """Collapse whitespace runs (including newlines) so a message prints as exactly one line."""
    return " ".join(str(text).split())


class UserInputError(Exception):
    """A mistake in what the user supplied (a path, a value); its str is one line saying what and where."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class ConfigError(UserInputError):
    """An invalid config: str names the file (or the `--set` override) and the field, on one line,
    e.g. ``configs/training_config.yaml: unknown key 'learning_rat' (did you mean 'learning_rate'?)``."""


class cli_main_guard(ContextDecorator):  # noqa: N801 - reads as a function at call sites
    """Context manager / decorator for entry points: a `UserInputError` (or a type in `also`) is
    ``error: <one line>`` on stderr and exit status 2; Ctrl-C is ``interrupted`` and 130. Anything
    else propagates with its traceback (a bug).
    """

    def __init__(self, also: tuple[type[BaseException], ...] = ()) -> None:
        self.also = tuple(also)

    def __enter__(self) -> cli_main_guard:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if exc is None:
            return False
        if isinstance(exc, (UserInputError, *self.also)):
            # One write, newline included: ranks sharing a launcher's stderr (unbuffered under
            # PYTHONUNBUFFERED) would otherwise interleave their lines' text and newlines.
            sys.stderr.write(f"error: {one_line(str(exc))}\n")
            sys.stderr.flush()
            raise SystemExit(USER_ERROR_EXIT) from None
        if isinstance(exc, KeyboardInterrupt):
            print("interrupted", file=sys.stderr, flush=True)
            raise SystemExit(INTERRUPTED_EXIT) from None
        return False


def require_extra(module: str, extra: str, feature: str) -> None:
    """A one-line UserInputError when `module` (an optional dependency) is not installed: names the
    feature that needs it and the pip extra that brings it."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise UserInputError(f"{feature} needs {module}, which is not installed: "
                             f"pip install 'skyrl-tool-agent[{extra}]' (or pip install -e '.[{extra}]' in a checkout)")
