"""Runs the Python examples of one page for tests/test_readme.py, in one namespace, in the
current directory: reads one JSON message per line on stdin (``{"code", "line"}``, a block
and the page's line it starts on), runs it, and answers one JSON line on stdout
(``{"error": null}``, or what went wrong).

A block runs statement by statement. An expression statement directly followed by a comment
``# => EXPECTED`` is checked: the expression's ``repr`` must match EXPECTED, in which
``...`` stands for any text. What a block prints is not compared (show it with ``# =>``)."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import sys
import traceback
from typing import Any

PAGE = "<page>"


def matches(expected: str, actual: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, actual, re.DOTALL) is not None


def expectation(lines: list[str], node: ast.stmt) -> str | None:
    """The ``# => ...`` comment on the line after the statement, if any."""
    after = node.end_lineno or node.lineno
    if after < len(lines):
        text = lines[after].strip()
        if text.startswith("# => "):
            return text[len("# => "):]
    return None


def run(code: str, first: int, namespace: dict[str, Any]) -> str | None:
    lines = code.splitlines()
    tree = ast.parse(code, PAGE)
    for node in tree.body:
        wanted = expectation(lines, node)
        ast.increment_lineno(node, first - 1)  # tracebacks name the page's lines
        if wanted is not None and isinstance(node, ast.Expr):
            value = eval(compile(ast.Expression(node.value), PAGE, "eval"), namespace)
            if not matches(wanted, repr(value)):
                return (f"line {node.lineno}: {ast.unparse(node)}\n  expected: {wanted}\n"
                        f"  actual:   {value!r}")
        else:
            exec(compile(ast.Module([node], []), PAGE, "exec"), namespace)
    return None


def main() -> None:
    sys.path[0] = ""  # as for `python` typed in the page's directory: its modules import
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    # answers on a descriptor of their own: whatever the examples (or threads they leave
    # running) print goes to stderr, never between two answers
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    for message in sys.stdin:
        block = json.loads(message)
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                error = run(block["code"], block["line"], namespace)
        except BaseException:
            error = traceback.format_exc(limit=-3)
        answers.write(json.dumps({"error": error, "printed": printed.getvalue()}) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
