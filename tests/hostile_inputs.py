"""What the hostile-input tests share: the command run in-process as a user runs it, the
exit statuses the README documents, and a dump of every lifecycle table to compare before
and after a refusal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from click.testing import CliRunner
from sqlalchemy import inspect, select

from lifecycle import Store
from lifecycle.cli import main
from lifecycle.store import metadata

DOCUMENTED_EXITS = {0, 1, 2, 3}
"""0 done, 1 an error (one line), 2 bad arguments, 3 a refused fire or step. (4, an
unexpected failure, is documented too, but no input may cause it.)"""


@dataclass(frozen=True)
class Ran:
    code: int
    stdout: str
    stderr: str
    exception: BaseException | None

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def error_line(self) -> str:
        """The error a refusal printed (click's usage errors end with an ``Error:`` line)."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else ""


TOGGLE: dict[str, Any] = {
    "name": "toggle", "initial": "off", "states": ["off", "on"],
    "transitions": [{"trigger": "flip", "source": "off", "dest": "on"},
                    {"trigger": "flip", "source": "on", "dest": "off"}]}
RISKY: dict[str, Any] = {
    "name": "risky", "initial": "up", "states": ["up", "gone"],
    "transitions": [{"trigger": "remove", "source": "up", "dest": "gone",
                     "fresh": {"max_age": 30, "probe": "site"}},
                    {"trigger": "back", "source": "gone", "dest": "up"}]}
"""Two small machines the hostile-input tests drive: a plain one, and one with a risky edge."""

MARKUP = ['<script>alert("key")</script>', '"><img src=x onerror=alert(1)>', "a&amp;b<br>",
          "[red]x[/]", "../../etc/passwd", "a/b?c=d&e=f#g", "%2e%2e%2F", "ключ 🙂 '\"",
          "{{ 7*7 }}{% raw %}", "line\nbreak\ttab"]
"""Keys and values that mean something to a browser, a template, a URL or a terminal: shown
anywhere, each must read as itself."""


def cli(*args: str, db: str | None = None, env: dict[str, str] | None = None) -> Ran:
    """``lifecycle ARGS`` in this process, on ``db`` (as --db); exceptions are not caught by
    the runner's caller: one that escapes the command is in ``exception``."""
    runner = CliRunner()
    result = runner.invoke(main, [*args, *(["--db", db] if db is not None else [])],
                           env=env, catch_exceptions=True)
    exception = result.exception
    if isinstance(exception, SystemExit):
        exception = None
    return Ran(result.exit_code, result.stdout, result.stderr, exception)


def assert_clean(ran: Ran, *codes: int) -> None:
    """No exception escaped, no traceback was printed, the exit status is documented (and
    one of ``codes`` when given), an error is one line."""
    assert ran.exception is None, f"{type(ran.exception).__name__}: {ran.exception}"
    assert "Traceback" not in ran.output, ran.output
    assert ran.code in DOCUMENTED_EXITS, f"exit {ran.code}: {ran.output}"
    if codes:
        assert ran.code in codes, f"exit {ran.code} not in {codes}: {ran.output}"
    if ran.code == 1 and ran.stderr.startswith("error:"):
        assert "unexpected" not in ran.stderr.split("\n")[0], ran.stderr


def dump(target: str | Store) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """Every row of every lifecycle table of a database (a URL, or a store), in a stable
    order."""
    if isinstance(target, str):
        with Store(target, check=False) as store:
            return dump(store)
    with target.read() as connection:
        tables = []
        names = set(inspect(connection).get_table_names())
        for table in metadata.sorted_tables:
            if table.name in names:
                rows = connection.execute(select(table)).all()
                tables.append((table.name, sorted(tuple(map(repr, row)) for row in rows)))
        return tables
