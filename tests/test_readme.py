"""Every example in README.md, ARCHITECTURE.md and docs/ runs as shown, so the pages cannot
drift from the code.

The convention the pages are written to:

- A shell example is a fenced ``console`` block. A line beginning with ``$ `` is a command;
  the lines after it, up to the next ``$ ``, are its output (stdout and stderr), compared
  line by line with trailing spaces ignored: a line ``...`` matches any number of lines, and
  ``...`` within a line any text. A command must exit 0 (show a failure as
  ``$ CMD; echo "exit $?"``). A command may continue over lines ending in ``\\``, and may
  write a file with a heredoc (``$ cat > slot.yaml <<'EOF'`` ... ``EOF``). A command ending
  in ``&`` runs in the background until the page's examples end.
- A Python example is a fenced ``python`` block. An expression statement directly followed
  by a comment ``# => EXPECTED`` is checked: its ``repr`` must match EXPECTED (``...`` is any
  text).
- A fenced ``yaml`` (or ``json``) block directly preceded by ``<!-- file: NAME -->`` is
  written to the file NAME before the blocks after it run.
- A block directly preceded by ``<!-- not run: REASON -->`` is skipped. Use it sparingly,
  for what cannot run here (a remote host, a real cluster). One preceded by
  ``<!-- needs: PROGRAM -->`` is skipped when PROGRAM (Graphviz's ``dot``) is not on PATH,
  unless ``LIFECYCLE_REQUIRE_RENDERERS=1``, as the diagram tests do. One preceded by
  ``<!-- needs: postgresql -->`` runs with ``POSTGRES`` set to the URL of an empty
  PostgreSQL database of the page's own (``postgresql://USER@HOST:PORT/NAME``, made on the
  server of ``LIFECYCLE_TEST_POSTGRES_URL`` and dropped afterwards); it is skipped when that
  server or ``psql`` is missing, unless ``LIFECYCLE_REQUIRE_POSTGRES=1``.
- The blocks of one page run in the order they appear, in one fresh temporary directory:
  the console blocks in one bash session (so ``export`` and files carry over) with the
  virtualenv's ``bin`` first on PATH, ``COLUMNS=80``, no ``LIFECYCLE_*`` variable set but
  ``LIFECYCLE_SMTP_URL``, which points at a mail server the checker runs on a free port
  for the page (tests/procs/mail_sink.py); the Python blocks in one namespace, in one
  Python process, in the same directory, so each sees the files and the database the
  blocks before it made. Two test runs on one machine run their pages in turn (a lock in
  the temporary directory), since an example may serve a fixed port.
- ``lifecycle`` in a page's shell is the session's fork server's (conftest.py's
  ``forkserver``, tests/zygote.py): a fork of a process that imported the program once,
  which runs it with the command's argv, environment, directory and stdio, and the
  virtualenv's ``bin`` first on the PATH it sees, as if it were the program itself (a
  new interpreter importing it all for each command cost most of the pages' time). The
  Python blocks' process (tests/procs/readme_python.py) starts in it too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from databases import REQUIRE_POSTGRES, postgres_problem
from procs.mail_sink import MailSink
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PAGES = [REPO / "README.md", REPO / "ARCHITECTURE.md", *sorted((REPO / "docs").glob("*.md"))]
DRIVER = Path(__file__).parent / "procs" / "readme_python.py"
REQUIRE = "LIFECYCLE_REQUIRE_RENDERERS"
POSTGRES = ("needs", "postgresql")
"""The directive of a block that runs on a PostgreSQL database of the page's own."""
TIMEOUT = 900.0
"""Seconds a command may take before the page is given up as hung (not a speed test)."""

FENCE = re.compile(r"^```(\S*)\s*$")
DIRECTIVE = re.compile(r"^<!--\s*(not run|file|needs):\s*(.*?)\s*-->$")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")


@dataclass
class Block:
    lang: str
    line: int
    """The page's line of the block's first line of content."""
    lines: list[str]
    directive: tuple[str, str] | None = None


@dataclass
class Command:
    line: int
    text: str
    expected: list[str] = field(default_factory=list)


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    current: Block | None = None
    previous = ""  # the last non-blank line outside a block
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        fence = FENCE.match(line)
        if current is not None:
            if fence and not fence[1]:
                found.append(current)
                current = None
                previous = line
            else:
                current.lines.append(line)
        elif fence:
            directive = DIRECTIVE.match(previous.strip())
            current = Block(fence[1], number + 1, [],
                            (directive[1], directive[2]) if directive else None)
        elif line.strip():
            previous = line
    assert current is None, f"{page.name}: a block opened at line {current.line - 1} " \
                            "is never closed"
    return found


def commands(block: Block) -> list[Command]:
    found: list[Command] = []
    lines = iter(enumerate(block.lines, block.line))
    for number, line in lines:
        if not line.startswith("$ "):
            assert found, f"line {number}: a console block must begin with a `$ ` command"
            found[-1].expected.append(line)
            continue
        text = line[2:]
        while text.endswith("\\"):
            text += "\n" + next(lines)[1]
        heredoc = HEREDOC.search(text)
        if heredoc:
            for _, body in lines:
                text += "\n" + body
                if body.strip() == heredoc[2]:
                    break
        found.append(Command(number, text))
    return found


def matches(expected: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` is what ``expected`` shows: a line ``...`` is any number of lines,
    ``...`` within a line any text."""
    def pattern(line: str) -> re.Pattern[str]:
        return re.compile(".*".join(re.escape(part) for part in line.split("...")))

    patterns = [None if line.strip() == "..." else pattern(line.rstrip()) for line in expected]
    reachable = {0}  # how many actual lines the expected lines so far can account for
    for wanted in patterns:
        if wanted is None:
            reachable = set(range(min(reachable), len(actual) + 1)) if reachable else set()
        else:
            reachable = {i + 1 for i in reachable
                         if i < len(actual) and wanted.fullmatch(actual[i])}
    return len(actual) in reachable


def trimmed(lines: list[str]) -> list[str]:
    lines = [line.rstrip() for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    return lines


class Shell:
    """One bash session for a page's console blocks."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"], cwd=cwd, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        self.output: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.put(line)
        self.output.put(None)

    def run(self, command: str) -> tuple[list[str], int]:
        marker = f"--- {uuid.uuid4().hex} exit "
        assert self.process.stdin is not None
        # the command's own input is nothing (a heredoc is its own); its exit status follows
        self.process.stdin.write(f"{{ {command}\n}} </dev/null\necho \"{marker}$?\"\n")
        self.process.stdin.flush()
        lines = []
        while True:
            try:
                line = self.output.get(timeout=TIMEOUT)
            except queue.Empty:
                raise AssertionError(f"{command!r} did not finish in {TIMEOUT:g} s") from None
            if line is None:
                raise AssertionError(f"the shell ended during {command!r}: {''.join(lines)}")
            if line.startswith(marker):
                return lines, int(line[len(marker):])
            lines.append(line.rstrip("\n"))

    def close(self) -> None:
        """End the session and whatever it left running in the background."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.communicate()


class Python:
    """One Python process, one namespace, for a page's Python blocks."""

    def __init__(self, cwd: Path, env: dict[str, str], interpreter: list[str]) -> None:
        self.process = subprocess.Popen(
            [*interpreter, str(DRIVER)], cwd=cwd, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)
        self.answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.answers.put(line)
        self.answers.put(None)

    def run(self, block: Block) -> str | None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"code": "\n".join(block.lines),
                                             "line": block.line}) + "\n")
        self.process.stdin.flush()
        try:
            answer = self.answers.get(timeout=TIMEOUT)
        except queue.Empty:
            return f"did not finish in {TIMEOUT:g} s"
        if answer is None:
            return "the Python process ended"
        error: str | None = json.loads(answer)["error"]
        return error

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def environment(smtp_url: str, postgres: str | None = None,
                shims: str | None = None) -> dict[str, str]:
    """The page's environment; ``shims``, a directory put before the virtualenv's on PATH,
    whose ``lifecycle`` runs the program in the session's fork server (conftest.py's
    ``forkserver``: what the program sees is as if it were the virtualenv's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFECYCLE_")}
    path = [*([shims] if shims else []), str(BIN), os.environ.get("PATH", "")]
    env.update(PATH=os.pathsep.join(path), COLUMNS="80",
               LIFECYCLE_SMTP_URL=smtp_url, PYTHONDONTWRITEBYTECODE="1")
    env.pop("VIRTUAL_ENV", None)
    env.pop("POSTGRES", None)
    if postgres is not None:
        env["POSTGRES"] = postgres
    return env


def runnable(page: Path, postgres: str | None = None) -> list[Block]:
    """The page's blocks that run here; those that need PostgreSQL only with its URL."""
    return [b for b in blocks(page) if b.directive is None or b.directive[0] == "file"
            or (b.directive == POSTGRES and postgres is not None)
            or (b.directive[0] == "needs" and b.directive != POSTGRES
                and (shutil.which(b.directive[1]) is not None
                     or os.environ.get(REQUIRE) == "1"))]


def page_database(page: Path, request: pytest.FixtureRequest) -> str | None:
    """The URL of an empty PostgreSQL database for the page's ``needs: postgresql`` blocks,
    as a user writes it (no driver, no connection options); None when the page has none of
    them, or when they cannot run here and need not (see the module's docstring)."""
    if not any(b.directive == POSTGRES for b in blocks(page)):
        return None
    psql = shutil.which("psql")
    if not REQUIRE_POSTGRES and (postgres_problem() is not None or psql is None):
        return None
    if psql is None:
        pytest.fail(f"LIFECYCLE_REQUIRE_POSTGRES=1 but psql, which {page.name} runs, is not "
                    "on PATH (apt-get install postgresql-client)")
    url = make_url(request.getfixturevalue("empty_postgres_url"))
    if "options" in url.query:  # the role may not create databases: only a schema of its own
        if REQUIRE_POSTGRES:
            pytest.fail(f"{page.name} needs a database of its own, and the role of "
                        "LIFECYCLE_TEST_POSTGRES_URL may not create one")
        return None
    return url.set(drivername="postgresql", query={}).render_as_string(hide_password=False)


LOCK = Path(tempfile.gettempdir()) / "lifecycle-readme-examples.lock"
"""Held while a page whose examples serve (a command in the background, which may listen on
a fixed port) runs: two such pages, of one test run or of two on one machine, take turns
instead of colliding. A page that serves nothing runs beside the others."""


def serves(page: Path) -> bool:
    """Whether one of the page's examples runs in the background (a server)."""
    return any(command.text.rstrip().endswith("&")
               for block in runnable(page, postgres="any") if block.lang == "console"
               for command in commands(block))


def run_page(page: Path, directory: Path, *, exclusive: bool = True,
             postgres: str | None = None, shims: str | None = None,
             interpreter: list[str] | None = None) -> Iterator[str]:
    """Run the page's examples; yield a description of each one that is not as shown.
    ``exclusive``: in turn with every other page (LOCK); a page that serves no fixed port
    need not wait for them. ``postgres``: the URL its ``needs: postgresql`` blocks run on
    (None: they do not run). ``shims``: see :func:`environment`. ``interpreter``: the
    command that runs the Python blocks' driver (the fork server's, where it ends when its
    stdin closes), ``python`` itself by default."""
    name = page.relative_to(REPO) if REPO in page.parents else page.name
    with LOCK.open("a") as lock, MailSink() as sink:
        if exclusive:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        env = environment(sink.url, postgres, shims)
        shell = Shell(directory, env)
        python: Python | None = None
        try:
            for block in runnable(page, postgres):
                if block.directive is not None and block.directive[0] == "file":
                    (directory / block.directive[1]).write_text("\n".join(block.lines) + "\n")
                elif block.lang == "console":
                    for command in commands(block):
                        output, status = shell.run(command.text)
                        where = f"{name}:{command.line}: $ {command.text}"
                        if status != 0:
                            yield f"{where}\nexit status {status}:\n" + "\n".join(output)
                        elif not matches(trimmed(command.expected), trimmed(output)):
                            yield (f"{where}\nexpected:\n" + "\n".join(command.expected)
                                   + "\nactual:\n" + "\n".join(trimmed(output)))
                elif block.lang == "python":
                    python = python or Python(directory, env, interpreter or [sys.executable])
                    error = python.run(block)
                    if error is not None:
                        yield f"{name}:{block.line}: python block:\n{error}"
        finally:
            shell.close()
            if python is not None:
                python.close()


def _name(page: Path) -> str:
    """A page's test id: its path in the repository (README.md, docs/tardis.md)."""
    return str(page.relative_to(REPO))


@pytest.mark.parametrize("page", [p for p in PAGES if any(
    b.lang in ("console", "python") for b in runnable(p, postgres="any"))], ids=_name)
def test_examples_run_as_shown(page: Path, tmp_path: Path, request: pytest.FixtureRequest,
                               forkserver: Any) -> None:
    failures = []
    for failure in run_page(page, tmp_path, exclusive=serves(page),
                            postgres=page_database(page, request), shims=forkserver.shims,
                            interpreter=forkserver.python()):
        failures.append(failure)
        if len(failures) == 3:  # later examples usually fail because of the first
            break
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_example_is_in_a_form_that_runs(page: Path) -> None:
    """No shell or Python example escapes the checker: shell examples are console blocks,
    and a block that is not run says why."""
    problems = []
    for block in blocks(page):
        where = f"{page.name}:{block.line - 1}"
        if block.lang in ("sh", "bash", "shell", "shell-session", "py", "pycon"):
            problems.append(f"{where}: a {block.lang!r} block; write `console` or `python`")
        if not block.lang and any(line.startswith("$ ") for line in block.lines):
            problems.append(f"{where}: commands in a block without a language; `console`")
        if block.directive and block.directive[0] == "not run" and \
                len(block.directive[1].split()) < 3:
            problems.append(f"{where}: `not run` needs a reason")
        if block.directive and block.directive[0] == "file" and \
                block.lang not in ("yaml", "json"):
            problems.append(f"{where}: `file:` is for yaml or json blocks")
        if block.lang == "console":
            try:
                commands(block)
            except (AssertionError, StopIteration) as exc:
                problems.append(f"{where}: {exc}")
    assert not problems, "\n".join(problems)


def test_the_checker_sees_a_wrong_output() -> None:
    assert matches(["created slot:s1 in ...", "..."], ["created slot:s1 in unclaimed (v 1)"])
    assert matches(["a", "...", "z"], ["a", "b", "c", "z"])
    assert matches(["a", "...", "z"], ["a", "z"])
    assert not matches(["a", "z"], ["a", "b", "z"])
    assert not matches(["created slot:s1 in claimed"], ["created slot:s1 in unclaimed"])
    assert not matches(["a"], ["a", "b"])
    assert not matches(["a", "b"], ["a"])
    assert matches([], [])


def test_the_checker_parses_commands_heredocs_and_continuations() -> None:
    block = Block("console", 10, [
        "$ cat > f.yaml <<'EOF'", "$ not a command", "EOF",
        "$ lifecycle create slot s1 \\", "    --data '{}'", "created ...",
        "$ echo done", "done"])
    found = commands(block)
    assert [c.line for c in found] == [10, 13, 16]
    assert found[0].text == "cat > f.yaml <<'EOF'\n$ not a command\nEOF"
    assert found[0].expected == []
    assert found[1].text == "lifecycle create slot s1 \\\n    --data '{}'"
    assert found[1].expected == ["created ..."]
    assert found[2].expected == ["done"]


def test_the_checker_runs_a_page_and_reports_what_differs(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "<!-- file: note.yaml -->", "```yaml", "a: 1", "```",
        "```console", "$ cat note.yaml", "a: 1", "$ export GREETING=hi", "```",
        "```console", "$ echo $GREETING", "hello", "$ false", "```",
        "```python", "x = open('note.yaml').read()", "x", "# => 'a: 2\\n'", "```",
        "<!-- not run: it would fail on purpose -->", "```console", "$ false", "```",
    ]) + "\n")
    work = tmp_path / "work"
    work.mkdir()
    assert not serves(page)
    failures = list(run_page(page, work, exclusive=False))  # it serves no port
    assert len(failures) == 3, failures
    assert "expected:\nhello\nactual:\nhi" in failures[0]
    assert "exit status 1" in failures[1]
    assert "expected: 'a: 2\\n'" in failures[2] and "actual:   'a: 1\\n'" in failures[2]


def test_the_checker_runs_postgresql_blocks_only_with_a_database(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "```console", "$ echo before", "before", "```",
        "<!-- needs: postgresql -->", "```console", '$ echo "db=$POSTGRES"',
        "db=postgresql://u@h:5432/d", "```",
    ]) + "\n")
    work = tmp_path / "work"
    work.mkdir()
    assert [b.line for b in runnable(page)] == [2]
    assert list(run_page(page, work, exclusive=False)) == []  # the second block is left out
    assert list(run_page(page, work, exclusive=False, postgres="postgresql://u@h:5432/d")) == []
    failures = list(run_page(page, work, exclusive=False, postgres="postgresql://u@h:5432/e"))
    assert len(failures) == 1 and "actual:\ndb=postgresql://u@h:5432/e" in failures[0], failures
