"""What every command shares: the consoles, errors as one line, the --db and --json
options, JSON arguments, times and counts as a person reads them."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console

from ..errors import LifecycleError

F = TypeVar("F", bound=Callable[..., Any])
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class OneLineErrors(click.Group):
    """Errors lifecycle raises on purpose are one line on stderr and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LifecycleError as exc:
            err.print(f"[bold red]error:[/] {escape(str(exc))}")
            sys.exit(1)


def escape(text: str) -> str:
    return text.replace("[", "\\[")


def db_option(f: F) -> F:
    return click.option(
        "--db", "db_url", metavar="URL",
        help="Database URL, or a SQLite file path. Default: $LIFECYCLE_DATABASE_URL, "
             "else ./lifecycle.db",
    )(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(f)


def json_arg(value: str | None, option: str) -> dict[str, Any]:
    if value is None:
        return {}
    def refuse(constant: str) -> Any:
        raise click.BadParameter(f"not JSON: {constant} is not a JSON number",
                                 param_hint=option)

    try:
        parsed = json.loads(value, parse_constant=refuse)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc.msg} at line {exc.lineno} column "
                                 f"{exc.colno}", param_hint=option) from None
    if not isinstance(parsed, dict):
        raise click.BadParameter(f"must be a JSON object, not {type(parsed).__name__}",
                                 param_hint=option)
    return parsed



def time_text(value: Any, clock_only: bool = False) -> str:
    if clock_only:
        return str(value.strftime("%H:%M:%S.%f")[:-3])
    return str(value.isoformat(timespec="milliseconds").replace("+00:00", "Z"))


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``1 resource``, ``2 resources``."""
    return f"{count:,} {noun if count == 1 else (many or noun + 's')}"
