"""What every command shares: the consoles, errors as one line and the exit statuses, the
--db and --json options, JSON arguments, times and counts as a person reads them.

Exit statuses (README, "The command line"): 0 done; 1 an error lifecycle reports (one line
on stderr: a refused input, a missing resource, a database that cannot be used) or a check
that found problems (``verify``, ``replay``, ``diagrams --check``, ``db current``); 2 bad
arguments (click's usage errors); 3 a refused ``fire`` or ``step``; 4 an unexpected failure
(a bug, or a plugin's code raising), also one line unless ``LIFECYCLE_TRACEBACK=1``. A
command that committed exits 0 whatever happens while it prints: printing never raises.

Everything a command prints that comes from data (keys, actors, data, payloads, errors) is
text. The consoles read markup of lifecycle's own styles only (``[bold]``, ``[red]``, ...,
closed by ``[/]``), a tag only where it is opened and closed; any other bracket, an
unclosed tag, a ``[/]`` with nothing to close, prints as it is, and a backslash before a
tag (what :func:`escape` puts before one in data) makes it text. Nothing printed can raise
a markup error. Data that holds a whole pair of those tags (``[red]x[/]``) is still read as
markup where a command interpolates it without :func:`escape`: pass data through
:func:`escape`, or print it as a :class:`~rich.text.Text`. No URL's password is printed.
"""

from __future__ import annotations

import io
import math
import os
import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click

from .. import redact
from ..errors import LifecycleError, SpecError
from .plain import TAG, is_tag, lost_output, parse, silence, unstyled

if TYPE_CHECKING:
    from .console import SafeConsole

    out: SafeConsole
    err: SafeConsole

F = TypeVar("F", bound=Callable[..., Any])

PLUGINS_VARIABLE = "LIFECYCLE_PLUGINS"


def plugin_names() -> list[str]:
    """The modules named in $LIFECYCLE_PLUGINS (comma-separated)."""
    return [n.strip() for n in os.environ.get(PLUGINS_VARIABLE, "").split(",") if n.strip()]


EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_INTERNAL = 4
TRACEBACK_VARIABLE = "LIFECYCLE_TRACEBACK"

class _Forgiving(io.TextIOBase):
    """sys.stdout or sys.stderr for the length of a command: no URL's password gets through
    (what a handler's error or a log line says included), what cannot be encoded is written
    with backslash escapes, and a closed pipe swallows the rest."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.closed_pipe = False

    def write(self, text: str) -> int:
        if self.closed_pipe:
            return len(text)
        shown = redact.text(text)
        try:
            self.stream.write(shown)
        except UnicodeEncodeError:
            encoding = getattr(self.stream, "encoding", None) or "ascii"
            self._write(shown.encode(encoding, "backslashreplace").decode(encoding))
        except (BrokenPipeError, ValueError):  # ValueError: the stream was closed
            self.closed_pipe = True
            silence(self.stream)
        except OSError as exc:  # a full disk: said once on stderr; the outcome stands
            self.closed_pipe = True
            if self.stream is not sys.__stderr__:
                print(f"warning: output lost: {exc.strerror or exc}", file=sys.__stderr__)
        return len(text)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
        except (OSError, ValueError, UnicodeError):
            self.closed_pipe = True

    def flush(self) -> None:
        try:
            self.stream.flush()
        except (OSError, ValueError):
            self.closed_pipe = True

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", None) or "utf-8"


LONGEST_SECONDS = 10 * 365 * 86400.0
"""The largest value of a number option without a maximum of its own (ten years of seconds,
as a spec's timeouts): a clock can add it."""


class Finite(click.FloatRange):
    """A float option's type: finite (``nan`` and ``inf`` are refused at start, not at the
    first use), within its range, and at most :data:`LONGEST_SECONDS` when it has no
    maximum."""

    name = "float range"

    def __init__(self, low: float | None = None, high: float | None = None, *,
                 min_open: bool = False, max_open: bool = False) -> None:
        super().__init__(low, LONGEST_SECONDS if high is None else high, min_open=min_open,
                         max_open=max_open)

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)  # the range lets NaN through
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def finite_options(command: click.Command) -> None:
    """Every float option of ``command`` (and its subcommands) made :class:`Finite`."""
    for param in command.params:
        kind = param.type
        if isinstance(kind, click.FloatRange) and not isinstance(kind, Finite):
            param.type = Finite(kind.min, kind.max, min_open=kind.min_open,
                                max_open=kind.max_open)
        elif isinstance(kind, click.types.FloatParamType) and not isinstance(kind, Finite):
            param.type = Finite()
    for sub in getattr(command, "commands", {}).values():
        finite_options(sub)


class OneLineErrors(click.Group):
    """Errors are one line on stderr with the command line's remedy, and the documented exit
    statuses; no traceback reaches a user (``LIFECYCLE_TRACEBACK=1`` shows it for an
    unexpected failure). Float options are finite (:class:`Finite`)."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        finite_options(cmd)
        super().add_command(cmd, name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Every argument is text: a byte that is not UTF-8 (Python's lone surrogate for
        it) or a NUL is a usage error, whatever the argument is for."""
        for position, argument in enumerate(args, start=1):
            if argument.isascii() and "\x00" not in argument:
                continue  # (UTF-8 text: what every command line but a hostile one holds)
            from ..storable import string_problem

            problem = string_problem(argument)
            if problem is not None:
                raise click.UsageError(f"argument {position} ({argument!r}) {problem}; "
                                       "arguments are UTF-8 text", ctx)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Forgiving(sys.stdout), _Forgiving(sys.stderr)
        try:
            return super().invoke(ctx)
        except LifecycleError as exc:
            message = exc.for_command_line()
            # one line (a spec's problems excepted: one line each, under their heading)
            report(message if isinstance(exc, SpecError) else " ".join(message.split()))
            sys.exit(EXIT_ERROR)
        except OSError as exc:  # a file a command was asked to read or write
            report(f"{exc.strerror}: {exc.filename}" if exc.strerror and exc.filename
                   else str(exc))
            sys.exit(EXIT_ERROR)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit,
                KeyboardInterrupt):
            raise
        except Exception as exc:
            import traceback  # (a failure's cost, not every command's)

            if os.environ.get(TRACEBACK_VARIABLE) == "1":
                traceback.print_exc()
            where = traceback.extract_tb(exc.__traceback__)[-1]
            said = " ".join(str(exc).split())
            said = said if len(said) <= 300 else said[:300] + "..."
            report(f"unexpected {type(exc).__name__}: {said} (at "
                   f"{os.path.basename(where.filename)}"
                   f":{where.lineno}; a bug, or a plugin's code: {TRACEBACK_VARIABLE}=1 shows "
                   "the traceback)")
            sys.exit(EXIT_INTERNAL)
        finally:
            sys.stdout, sys.stderr = streams


def report(message: str) -> None:
    """An error, on stderr: ``error: MESSAGE``, the message as text, secrets hidden."""
    from rich.text import Text

    from .console import err

    err.print(Text.assemble(("error:", "bold red"), " ", redact.text(message)))


def plain_line(line: str, stream: IO[str]) -> str | None:
    """What ``out.print(line)`` writes to ``stream``, without rich: None where rich must
    print it (a terminal, or anything :func:`.plain.unstyled` is unsure of, or text rich
    would change: a tab it expands, a character that is not printable text), else the
    line's text as rich prints it unstyled, with its newline."""
    shown = redact.text(line)
    plain = parse(shown)[0] if "[" in shown else shown
    if not plain.replace("\n", "").isprintable() or not unstyled(stream):
        return None
    return plain + "\n"


def say(line: str, *, stderr: bool = False) -> None:
    """``out.print(line)`` (``err`` with ``stderr``): written here where rich would print
    it unstyled (:func:`plain_line`), so that a command that prints a line or two on a
    pipe or to a file imports no rich."""
    stream = sys.stderr if stderr else sys.stdout
    written = None if f"{__package__}.console" in sys.modules else plain_line(line, stream)
    if written is None:
        from . import console

        (console.err if stderr else console.out).print(line)
        return
    try:
        stream.write(written)
        stream.flush()
    except (OSError, UnicodeError, ValueError) as exc:
        lost_output(exc)


def escape(text: str) -> str:
    """Data inside a string that holds markup, so that it prints as it is: a backslash
    before each of lifecycle's tags in it (and its own backslashes there doubled)."""
    return TAG.sub(lambda found: found.group(1) * 2 + "\\" + found.group()[len(
        found.group(1)):] if is_tag(found) else found.group(), text)


def db_option(f: F) -> F:
    return click.option(
        "--db", "db_url", metavar="URL",
        help="Database URL, or a SQLite file path. Default: $LIFECYCLE_DATABASE_URL, "
             "else ./lifecycle.db",
    )(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(f)


def json_arg(value: str | None, option: str) -> dict[str, Any]:
    """A JSON object given on the command line, read as spec files are (duplicate keys,
    non-finite numbers, over-long integers and deep nesting refused); what the store cannot
    keep is refused by the engine."""
    if value is None:
        return {}
    from ..user_documents import DocumentError, load_json

    try:
        parsed = load_json(value, option)
    except DocumentError as exc:
        what = exc.what.removeprefix("invalid JSON: ").replace(
            "is not a finite number", "is not a JSON number")  # NaN, Infinity
        raise click.BadParameter(f"not JSON: {what}"
                                 + (f" (at {exc.where.removeprefix(option + ':')})"
                                    if exc.where != option else ""),
                                 param_hint=option) from None
    if not isinstance(parsed, dict):
        raise click.BadParameter(f"must be a JSON object, not {type(parsed).__name__}",
                                 param_hint=option)
    return parsed


def __getattr__(name: str) -> Any:
    """The consoles (``out``, ``err``) and :func:`markup`, from :mod:`.console` when first
    asked for: rich is imported by a command that prints, not by ``lifecycle --help``."""
    if name in ("out", "err", "markup", "SafeConsole"):
        from . import console

        return getattr(console, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
