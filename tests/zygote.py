"""A warm fork server for the ``lifecycle`` commands and the Python programs the tests run as
separate processes.

A ``lifecycle`` command spends nearly all of its CPU importing (SQLAlchemy, pydantic, rich,
lifecycle itself) before its few milliseconds of work. The server (``python zygote.py serve
SOCKET``, one per test session and xdist worker, :class:`Server`) imports those modules
once, and for each command forks a child that runs the program as the real console script
would, or as ``python -m MODULE ARG...`` or ``python SCRIPT ARG...`` would with the
session's interpreter (:meth:`Server.python`: a test's worker scripts, ``python -m
lifecycle``, the pages' Python driver): with the command's argv, working directory,
environment, umask, ignored signals and signal mask, and its own stdin, stdout and stderr,
the very file descriptors of the caller (passed over the Unix socket), so that isatty, pipes
and redirections are the real program's. The client (``python -I -S zygote.py client ...``,
which a page's shell finds as ``lifecycle`` first on its PATH, or :meth:`Server.run` in a
test's own process) waits for the child's exit status and exits with it; a signal the client
gets (SIGTERM, SIGINT, SIGHUP, SIGQUIT, ...) is passed on to the child, and a child whose
client dies without a word (SIGKILL) is killed, a moment later: so a test that kills or
stops a command with SIGKILL or SIGSTOP, or signals it by a pid of its own, starts it for
real. So ``lifecycle worker &`` in a page's shell, and the page's kill of its process group,
behave as with the real program; the client dies of the signal its command died of (a shell
shows 128+N). The session's end (the server's stdin closing) kills what still runs in it.
tests/test_zygote.py compares the two.

The child starts as a fresh program would:

- The server executes nothing but imports (:data:`PRELOAD`): no cache of lifecycle's is
  filled, no console made, no thread started, no file left open; what it imported is frozen
  out of the collector's sight (``gc.freeze``), or each child's first full collection would
  walk and copy all of it. What a module reads from the environment when it is imported is
  read again in the child: :mod:`lifecycle.cli.console` (whose rich consoles read
  ``COLUMNS``, ``TERM``, ``NO_COLOR``... when made) and the command modules that import
  it are never preloaded (the server checks), the machines' index reads
  ``XDG_CACHE_HOME`` when it is used, entry points (of a machine package a page installs)
  are read when a command asks for them, after ``importlib.invalidate_caches()``; the time
  zone is read again (``time.tzset``).
- ``sys.argv``, ``sys.orig_argv``, ``sys.path[0]`` (the program's or script's real
  directory; for ``-m`` the working directory), the rest of ``sys.path`` (the request's
  ``PYTHONPATH`` first, as ``site`` leaves it: absolute, an empty entry the working
  directory, no duplicates), ``__main__`` (the console script or the script, run from its
  file with ``__file__`` absolute, as the interpreter runs one; for ``-m`` what
  ``runpy._run_module_as_main``, the interpreter's own entry, makes of it), stdio (made as
  CPython makes them: line-buffered on a terminal and for stderr),
  ``sys.dont_write_bytecode`` and ``sys.pycache_prefix`` are the real program's; the child
  exits through the interpreter's own exit (threads waited for, every atexit handler run,
  the exception printed, stdout and stderr flushed), as the program would, but for the
  modules' teardown (:func:`_exit_fast`: it would copy every page the child shares with the
  server, 45 ms a command): the files and SQLite connections the program left open are
  closed as their deallocation would close them, and the child leaves with the program's
  status.
- Where that cannot be had, the client runs the real program instead (:func:`_mismatch`):
  an environment that changes how the interpreter itself starts (any other ``PYTHON*``
  variable, the locale's ``LC_ALL``/``LC_CTYPE``/``LANG``) than the server's, a setting a
  preloaded module reads when imported (:data:`IMPORTED_PREFIXES`: job_exit's), a
  ``PYTHONPATH`` that holds a module of the name of one the server imported, or a program
  that is none of the three forms (an interpreter option, ``-c``, another interpreter or
  another name of this one, a script that is not a ``.py`` file).

What differs, and no test here reads: the child's parent is the server (``os.getppid()``),
its process group and session are the server's, its hash seed is the server's (so a set's
order is the same in every command), its command line in ``ps`` is the server's, a
traceback it does not catch shows this module's frames below the console script's, and
modules it would import only for some commands are loaded already. A package a page
installs over one the server imported would not be seen (no page installs one). Objects
other than files and SQLite connections that the program leaves alive at its exit are not
finalized (their ``__del__`` does not run; the kernel closes their descriptors).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator

HEADER = struct.Struct("!I")
STDIO = ("stdin", "stdout", "stderr")
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")
"""The signals a client passes on to its child (those it would otherwise die of)."""
STARTUP_VARIABLES = ("LC_ALL", "LC_CTYPE", "LANG")
"""Besides PYTHON*: what decides how the interpreter starts (its stdio's encoding)."""
IMPORTED_PREFIXES = ("LIFECYCLE_JOB_EXIT_",)
"""Variables a preloaded module reads when it is imported: job_exit's machine (its
``BUILTIN``) is made with its settings then. A request that sets them otherwise than the
server runs for real."""
APPLIED_VARIABLES = ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "PYTHONPATH")
"""The PYTHON* variables the child applies itself (the tests' and the pages' differ; the
tests put tests/ on PYTHONPATH for their plugins; the server itself runs without one)."""
PRELOAD = (
    # the program and what its commands import, but for the command modules (cli.resources,
    # cli.machines, ...), which make lifecycle.cli.console's consoles when imported
    "lifecycle.cli", "lifecycle.cli.common", "lifecycle.cli.plain", "lifecycle.cli.context",
    "lifecycle.cli.layout", "rich.console", "rich.table", "rich.text", "rich.markup",
    "lifecycle.bare_read", "lifecycle.engine", "lifecycle.store", "lifecycle.store.migrate",
    "lifecycle.queries", "lifecycle.worker", "lifecycle.demo", "lifecycle.sim.simulation",
    "lifecycle.scenario", "lifecycle.story", "lifecycle.render", "lifecycle.verify",
    "lifecycle.outbox_admin", "lifecycle.machines.builtin", "lifecycle.check.explore",
    "lifecycle.user_documents", "alembic", "sqlalchemy.dialects.sqlite",
    "sqlalchemy.dialects.postgresql", "psycopg", "sqlite3",
    # lifecycle's own machines, their commands and world models, which the commands load
    # through entry points: those are read in the child (a page may install a package)
    "lifecycle.machines.batch_job", "lifecycle.machines.drone", "lifecycle.machines.job_exit",
    "lifecycle.machines.slurm_dispatch", "lifecycle.machines.startd",
    "lifecycle.machines.drone_commands", "lifecycle.machines.job_exit_commands",
    "lifecycle.check.worlds.drone", "lifecycle.check.worlds.job_exit",
    "lifecycle.check.worlds.slurm_dispatch", "lifecycle.check.worlds.startd",
)
NOT_PRELOADED = ("lifecycle.cli.console",)
"""Modules whose import reads the environment (rich consoles made at import)."""


Message = dict[str, Any]
"""A request, an answer or a signal's line between client and server, as JSON."""


def _startup(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items()
            if (name.startswith("PYTHON") and name not in APPLIED_VARIABLES)
            or name in STARTUP_VARIABLES or name.startswith(IMPORTED_PREFIXES)}


def _form(argv: list[str], cwd: str, program: str) -> tuple[str, str] | None:
    """What ``argv`` runs, where a fork can run it: ``("program", PATH)`` for the console
    script, ``("module", NAME)`` for ``python -m NAME ARG...`` and ``("script", PATH)`` for
    ``python PATH ARG...`` with this server's interpreter (the very path: another, or a
    venv's other name, may be another installation); None for anything else (an interpreter
    option, another interpreter, a script that is not a ``.py`` file, a missing one)."""
    if os.path.realpath(os.path.join(cwd, argv[0])) == os.path.realpath(program):
        return "program", argv[0]
    if argv[0] != sys.executable or len(argv) < 2:
        return None
    if argv[1] == "-m":
        if len(argv) > 2 and argv[2] and not argv[2].startswith("-"):
            return "module", argv[2]
        return None
    if (not argv[1].startswith("-") and argv[1].endswith(".py")
            and os.path.isfile(os.path.join(cwd, argv[1]))):
        return "script", argv[1]
    return None


def _python_path(env: dict[str, str], cwd: str) -> list[str]:
    """The directories ``PYTHONPATH`` puts on a new interpreter's path, as its ``site`` makes
    them: absolute, an empty entry the working directory."""
    value = env.get("PYTHONPATH")
    if not value:
        return []
    return [os.path.abspath(os.path.join(cwd, entry)) for entry in value.split(os.pathsep)]


def _shadowed(directories: list[str]) -> list[str]:
    """What those directories hold under the name of a top-level module the server imported
    (which a new interpreter would have imported from there instead)."""
    loaded = {name for name in sys.modules if "." not in name}
    found = []
    for directory in directories:
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        found += [os.path.join(directory, name) for name in names
                  if name.split(".", 1)[0] in loaded and name != "__pycache__"]
    return found


def _mismatch(request: Message, program: str) -> str | None:
    """Why the request cannot be served by a fork of this server (None: it can)."""
    cwd = request.get("cwd", os.getcwd())
    if _form(request["argv"], cwd, program) is None:
        return f"neither the console script {program} nor {sys.executable} -m MODULE or SCRIPT"
    shadowed = _shadowed(_python_path(request["env"], cwd))
    if shadowed:
        return f"PYTHONPATH holds modules the server imported: {', '.join(shadowed)}"
    ours, theirs = _startup(dict(os.environ)), _startup(request["env"])
    if ours != theirs:
        differ = sorted(name for name in {*ours, *theirs} if ours.get(name) != theirs.get(name))
        return f"the start-up or import-time variables differ: {', '.join(differ)}"
    return None


# -- the client side ---------------------------------------------------------------------------


def _request(argv: list[str], cwd: str, env: dict[str, str]) -> Message:
    mask = os.umask(0)
    os.umask(mask)
    ignored = [int(s) for s in signal.valid_signals()
               if s not in (signal.SIGKILL, signal.SIGSTOP)
               and signal.getsignal(s) is signal.SIG_IGN]
    blocked = [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])]
    return {"argv": argv, "cwd": cwd, "env": env, "umask": mask, "ignored": ignored,
            "blocked": blocked}


def _send(connection: socket.socket, request: Message, fds: list[int | None]) -> None:
    request = {**request, "fds": [fd is not None for fd in fds]}
    payload = json.dumps(request).encode()
    message = HEADER.pack(len(payload)) + payload
    sent = socket.send_fds(connection, [message[:4096]], [fd for fd in fds if fd is not None])
    if sent < len(message):  # (not an empty send: the command may have ended and the server
        connection.sendall(message[sent:])  # closed the connection, and it would fail)


def _lines(connection: socket.socket) -> Iterator[Message]:
    buffer = b""
    while True:
        chunk = connection.recv(4096)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield json.loads(line)


def _open_fd(fd: int) -> int | None:
    try:
        os.fstat(fd)
    except OSError:
        return None
    return fd


def client(argv: list[str]) -> None:
    """``client SOCKET PROGRAM SHIMS ARG...``: run PROGRAM ARG... in a fork of the server at
    SOCKET (or PROGRAM itself where the fork would not be faithful), with this process's
    stdio, cwd and environment, less the directory SHIMS on PATH (where the page's
    ``lifecycle`` that runs this is); exit as it exits."""
    address, program, shims, *args = argv
    stdio = [_open_fd(fd) for fd in (0, 1, 2)]  # before a socket takes a closed one's number
    env = dict(os.environ)
    if shims:
        path = [p for p in env.get("PATH", "").split(os.pathsep)
                if os.path.realpath(p or ".") != os.path.realpath(shims)]
        env["PATH"] = os.pathsep.join(path)
    # all of them, those ignored here too: the child has them ignored as well (the request
    # says so), unless it handles them itself, as `lifecycle worker` handles SIGINT
    forwarded = [getattr(signal, name) for name in FORWARDED]
    request = _request([program, *args], os.getcwd(), env)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(address)

    sent, pending = [], []  # (a signal's line must not cut into the request)

    def forward(number: int, frame: object) -> None:
        if sent:
            connection.sendall(json.dumps({"signal": number}).encode() + b"\n")
        else:
            pending.append(number)

    for number in forwarded:  # from the start: the server passes them on once it forked
        signal.signal(number, forward)
    _send(connection, request, stdio)
    sent.append(True)
    while pending:
        forward(pending.pop(0), None)
    for answer in _lines(connection):
        if "fallback" in answer:
            connection.close()
            for number in forwarded:
                signal.signal(number, signal.SIG_IGN if number in request["ignored"]
                              else signal.SIG_DFL)
            os.execve(program, [program, *args], env)
        if "status" in answer:
            _exit_as(answer["status"])
    sys.stderr.write("lifecycle (the tests' fork server): the server went away\n")
    os._exit(125)


def _exit_as(status: int) -> None:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number not in (signal.SIGQUIT, signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS):
            if number != signal.SIGKILL:  # die of it, as the program did
                signal.signal(number, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [number])
            os.kill(os.getpid(), number)
        os._exit(128 + number)
    os._exit(os.waitstatus_to_exitcode(status))


# -- the server --------------------------------------------------------------------------------


def _receive(connection: socket.socket) -> tuple[Message, list[int]]:
    data, fds, _, _ = socket.recv_fds(connection, HEADER.size, 3)
    # (no more than asked for: what follows the request is the client's)
    (size,) = HEADER.unpack(_filled(connection, data, HEADER.size))
    return json.loads(_filled(connection, b"", size)), fds


def _filled(connection: socket.socket, data: bytes, size: int) -> bytes:
    """``data`` and what the connection sends after it, up to ``size`` bytes in all."""
    while len(data) < size:
        more = connection.recv(size - len(data))
        if not more:
            raise EOFError
        data += more
    return data


def serve(address: str, program: str) -> tuple[Message, list[int]] | None:
    """Serve until stdin closes (the tests' session ended). In a child, return its request
    and its stdio's descriptors, with everything of the server's closed."""
    import atexit
    import importlib
    import selectors

    atexit.register(_exit_fast)  # before the preloads register theirs: it runs after them
    for name in PRELOAD:
        importlib.import_module(name)
    loaded = [name for name in NOT_PRELOADED if name in sys.modules]
    assert not loaded, f"preloading imported {loaded}, which read the environment"
    import gc

    # what the server imported is out of the collector's sight: a child's collections would
    # otherwise walk (and so copy, page by page) the whole of it, at a cost like importing
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    children: dict[socket.socket, Message] = {}  # connection -> child
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        for key, _ in selector.select():
            if key.data == "stdin":
                if os.read(sys.stdin.fileno(), 4096):
                    continue
                for child in children.values():
                    if child.get("pid") and "status" not in child:
                        os.kill(child["pid"], signal.SIGKILL)
                        os.waitpid(child["pid"], 0)
                return None
            if key.data == "accept":
                connection, _ = listener.accept()
                try:
                    request, fds = _receive(connection)
                except (OSError, EOFError, ValueError):
                    connection.close()
                    continue
                reason = _mismatch(request, program)
                if reason is not None:
                    for fd in fds:
                        os.close(fd)
                    _answer(connection, {"fallback": reason})
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    for other in children.values():
                        other["connection"].close()
                        os.close(other["pidfd"])
                    connection.close()
                    selector.close()
                    listener.close()
                    return request, fds
                for fd in fds:
                    os.close(fd)
                child = {"pid": pid, "pidfd": os.pidfd_open(pid), "connection": connection,
                         "buffer": b""}
                children[connection] = child
                selector.register(connection, selectors.EVENT_READ, ("client", child))
                selector.register(child["pidfd"], selectors.EVENT_READ, ("exit", child))
                continue
            kind, child = key.data
            if kind == "client":
                try:
                    data = child["connection"].recv(4096)
                except OSError:
                    data = b""
                if not data:  # the client died: so does its child, as the program would
                    selector.unregister(child["connection"])
                    child["gone"] = True
                    os.kill(child["pid"], signal.SIGKILL)
                    continue
                *lines, child["buffer"] = (child["buffer"] + data).split(b"\n")
                for line in lines:
                    os.kill(child["pid"], json.loads(line)["signal"])
            else:
                _, status = os.waitpid(child["pid"], 0)
                selector.unregister(child["pidfd"])
                os.close(child["pidfd"])
                connection = child["connection"]
                if not child.get("gone"):
                    selector.unregister(connection)
                    _answer(connection, {"status": status})
                connection.close()
                del children[connection]


EXIT_STATUS: list[int] = []
"""A child's exit status once its program ended (as the interpreter would exit with it)."""


def _exit_fast() -> None:
    """A child's last atexit handler: after its program ended, its threads were waited for
    and every other handler ran, what a new interpreter's exit does next that a caller can
    see is done (stdout and stderr flushed; the files and SQLite databases it left open
    flushed and closed, as their objects' deallocation would), and the child leaves at once
    with the program's status. Tearing down its modules, as the interpreter would, would
    write to (and so copy) every page it shares with the server: 45 ms of CPU a command.
    Where the flush fails, or the program ended by KeyboardInterrupt (the interpreter then
    dies of SIGINT), the interpreter's own exit goes on instead."""
    if not EXIT_STATUS:
        return
    import gc
    import io
    import sqlite3

    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except Exception:  # (the interpreter says so and exits with 120)
        return
    # the child's own objects: what the server made is frozen (gc.freeze), and holds no file
    left = [obj for generation in range(3) for obj in gc.get_objects(generation)
            if isinstance(obj, (io.IOBase, sqlite3.Connection))]
    order = (io.TextIOBase, io.BufferedIOBase, io.IOBase, sqlite3.Connection)  # outer first
    for kind in order:
        for obj in left:
            if isinstance(obj, kind) and obj not in (sys.stdin, sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    obj.close()
    os._exit(EXIT_STATUS[0])


def _answer(connection: socket.socket, answer: Message) -> None:
    with contextlib.suppress(OSError):  # (the client is gone)
        connection.sendall(json.dumps(answer).encode() + b"\n")


def _stdio(fd: int, name: str, model: object) -> object:
    """A standard stream on ``fd`` as CPython makes it at start-up (``model``, the server's
    own, gives the encoding and error handlers: the start-up variables are the same)."""
    import io

    write = fd != 0
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    # stdin is buffered even under -u (TextIOWrapper reads with read1)
    raw = open(fd, "wb" if write else "rb",  # noqa: SIM115
                  buffering=0 if unbuffered and write else -1, closefd=False)
    line_buffering = not unbuffered and (fd == 2 or raw.isatty())
    stream = io.TextIOWrapper(raw, encoding=getattr(model, "encoding", None),  # type: ignore[arg-type]
                              errors=getattr(model, "errors", None), newline="\n",
                              line_buffering=line_buffering, write_through=unbuffered)
    getattr(raw, "raw", raw).name = f"<{name}>"
    stream.mode = "w" if write else "r"  # type: ignore[misc]
    return stream


def child(request: Message, fds: list[int], program: str) -> None:
    """Become the program of ``request``: the stdio, process state and interpreter state a
    fresh start would give, then the console script, the module or the script itself."""
    import importlib
    import time
    import types

    given = iter(fds)
    for fd, present in enumerate(request["fds"]):
        if present:
            source = next(given)
            if source != fd:
                os.dup2(source, fd)
        else:
            os.close(fd)
    for source in fds:
        if source > 2:
            os.close(source)
    for number in signal.valid_signals():
        if number in (signal.SIGKILL, signal.SIGSTOP):
            continue
        if number in request["ignored"] or number in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(number, signal.SIG_IGN)  # (as CPython ignores SIGPIPE and SIGXFSZ)
        elif number == signal.SIGINT:
            signal.signal(number, signal.default_int_handler)
        else:
            signal.signal(number, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, request["blocked"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    time.tzset()
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    sys.pycache_prefix = os.environ.get("PYTHONPYCACHEPREFIX") or None
    argv = list(request["argv"])
    form = _form(argv, request["cwd"], program)
    assert form is not None  # (the server forked for it)
    kind, target = form
    if kind == "program":  # a script's shebang: the interpreter, then the script's path
        sys.argv, sys.orig_argv = argv, [sys.executable, *argv]
        path: str | None = target
    elif kind == "script":  # python SCRIPT ARG...: its path as given, __file__ made absolute
        sys.argv, sys.orig_argv = argv[1:], argv
        path = os.path.join(os.getcwd(), target)
    else:  # python -m NAME ARG...: "-m" until runpy finds the module's file
        sys.argv, sys.orig_argv = ["-m", *argv[3:]], argv
        path = None
    # the script's real directory, or for -m the working directory; PYTHONPATH's before the
    # rest, less those already there (as site leaves them)
    search = [*_python_path(request["env"], request["cwd"]), *sys.path[1:]]
    sys.path[1:] = [entry for i, entry in enumerate(search) if entry not in search[:i]]
    sys.path[0] = os.getcwd() if path is None else os.path.dirname(os.path.realpath(path))
    importlib.invalidate_caches()
    for fd, name in enumerate(STDIO):
        model = getattr(sys, f"__{name}__")
        stream = _stdio(fd, name, model) if request["fds"][fd] else None
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    if path is None:
        import runpy

        # what the interpreter itself calls for -m (argv[0], __spec__, __package__...)
        runpy._run_module_as_main(target, alter_argv=True)  # type: ignore[attr-defined]
        return
    import importlib.machinery

    main.__file__ = path  # as the interpreter runs a file (the console script is one too)
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    with open(path, "rb") as file:
        code = compile(file.read(), path, "exec")
    exec(code, main.__dict__)


# -- the tests' side ---------------------------------------------------------------------------


class Server:
    """The fork server of this test session (each xdist worker's own), for ``program`` (the
    virtualenv's console script): started by :meth:`start`, ended by :meth:`close`, which
    kills what still runs in it."""

    def __init__(self, program: str) -> None:
        import tempfile

        self.program = program
        self.directory = tempfile.mkdtemp(prefix="lifecycle-zygote-")
        self.address = os.path.join(self.directory, "socket")
        if len(self.address.encode()) > 100:  # a Unix socket's path is short
            self.directory = tempfile.mkdtemp(prefix="lc-zygote-", dir="/tmp")
            self.address = os.path.join(self.directory, "socket")
        self.shims = os.path.join(self.directory, "bin")
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> Server:
        import shlex
        import subprocess

        env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
        self.process = subprocess.Popen(  # (a child puts its own PYTHONPATH on its path)
            [sys.executable, __file__, "serve", self.address, self.program],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.process.stdout is not None
        ready = self.process.stdout.readline()  # (no deadline: an exit ends it too)
        assert ready == "ready\n", f"the fork server did not start: {ready!r}"
        os.mkdir(self.shims)
        shim = os.path.join(self.shims, os.path.basename(self.program))
        with open(shim, "w") as file:
            file.write("#!/bin/sh\nexec " + shlex.join(self.client_command(
                self.program, self.shims)) + ' "$@"\n')
        os.chmod(shim, 0o755)
        return self

    def client_command(self, program: str, shims: str = "") -> list[str]:
        """The command line that runs ``program`` (and then the arguments after it) in a
        fork of the server: for a ``subprocess.Popen`` of the program."""
        return [sys.executable, "-I", "-S", __file__, "client", self.address, program, shims]

    def python(self, *args: str) -> list[str]:
        """The command line that runs ``python ARGS...`` (``-m MODULE ...`` or ``SCRIPT
        ...``) with this interpreter, in a fork of the server where it can (the client runs
        the real interpreter where it cannot): for a ``subprocess.Popen`` whose command ends
        by itself or by a signal its client passes on, never for one a test kills, stops or
        signals by a pid of its own (the client's pid is not the command's, and a command
        outlives a killed client for a moment)."""
        return [*self.client_command(sys.executable), *args]

    def close(self) -> None:
        import shutil

        if self.process is not None:
            assert self.process.stdin is not None
            self.process.stdin.close()  # it kills what still runs, then exits
            self.process.wait()
            self.process.stdout.close()  # type: ignore[union-attr]
            self.process = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def run(self, argv: list[str], *, cwd: str, env: dict[str, str],
            timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """As ``subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
        stdin=DEVNULL)`` with ``argv[0]`` the console script, in a fork of the server."""
        import selectors
        import subprocess
        import time

        request = _request(argv, cwd, env)
        null = os.open(os.devnull, os.O_RDONLY)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(self.address)
            _send(connection, request, [null, out_w, err_w])
            for fd in (null, out_w, err_w):
                os.close(fd)
            null = out_w = err_w = -1
            outputs = {out_r: bytearray(), err_r: bytearray()}
            status: int | None = None
            answers = _lines(connection)
            deadline = None if timeout is None else time.monotonic() + timeout
            with selectors.DefaultSelector() as selector:
                selector.register(out_r, selectors.EVENT_READ)
                selector.register(err_r, selectors.EVENT_READ)
                selector.register(connection, selectors.EVENT_READ)
                while status is None or len(selector.get_map()) > 1:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise subprocess.TimeoutExpired(argv, timeout)  # type: ignore[arg-type]
                    for key, _ in selector.select(left):
                        if key.fileobj is connection:
                            answer = next(answers, None)
                            assert answer is not None, "the fork server went away"
                            if "fallback" in answer:  # (the server judges: it knows what
                                status = -1           # it imported) the real program runs
                                selector.unregister(connection)
                            elif "status" in answer:
                                status = answer["status"]
                                selector.unregister(connection)
                            continue
                        chunk = os.read(key.fd, 65536)  # type: ignore[arg-type]
                        if chunk:
                            outputs[key.fd] += chunk  # type: ignore[index]
                        else:
                            selector.unregister(key.fd)
        finally:
            connection.close()  # (a child still running is killed)
            for fd in (null, out_w, err_w, out_r, err_r):
                if fd >= 0:
                    os.close(fd)
        if status == -1:
            return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL, timeout=timeout, check=False)
        return subprocess.CompletedProcess(
            argv, os.waitstatus_to_exitcode(status),
            outputs[out_r].decode(errors="replace"), outputs[err_r].decode(errors="replace"))


if __name__ == "__main__":
    if sys.argv[1] == "client":
        client(sys.argv[2:])
    else:
        _, _, _address, _program = sys.argv
        _served = serve(_address, _program)
        if _served is not None:
            try:
                child(*_served, _program)
            except SystemExit as _exit:  # (the interpreter prints a code that is no number)
                _code = _exit.code
                EXIT_STATUS.append(0 if _code is None else _code if isinstance(_code, int)
                                   else 1)
                raise
            except KeyboardInterrupt:
                raise
            except BaseException:  # (the interpreter prints its traceback)
                EXIT_STATUS.append(1)
                raise
            else:
                EXIT_STATUS.append(0)
