"""The tests' fork server (tests/zygote.py) starts the ``lifecycle`` program, ``python -m
MODULE`` and ``python SCRIPT`` as a new process would: what the program sees of its process
(argv, path, stdio and how each is buffered, environment, working directory, umask, signals,
descriptors, time zone) and what it prints are the real program's, whatever the caller's
stdio; signals reach it; a client that dies takes its command with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import zygote

pytestmark = pytest.mark.integration  # it starts processes

PROGRAM = str(Path(sys.executable).with_name("lifecycle"))
PROBE = '''
import json, os, re, signal, sys, threading, time

def stream(s):
    return None if s is None else {
        "encoding": s.encoding, "errors": s.errors, "line_buffering": s.line_buffering,
        "write_through": s.write_through, "isatty": s.isatty(), "name": s.name,
        "mode": s.mode, "buffer": type(s.buffer).__name__, "fileno": s.fileno()}

with open("state.json", "w") as file:
    json.dump({
        "argv": sys.argv, "orig_argv": sys.orig_argv, "path": sys.path,
        "executable": sys.executable,
        "stdio": [stream(s) for s in (sys.__stdin__, sys.__stdout__, sys.__stderr__)],
        "env": dict(os.environ), "cwd": os.getcwd(), "umask": os.umask(0o22),
        "signals": {str(int(n)): repr(signal.getsignal(n)) for n in signal.valid_signals()
                    if n not in (signal.SIGKILL, signal.SIGSTOP)},
        "blocked": sorted(int(n) for n in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "bytecode": [sys.dont_write_bytecode, sys.pycache_prefix],
        "time zone": [time.tzname, time.timezone], "threads": threading.active_count(),
        "descriptors": sorted(os.listdir("/proc/self/fd")),
        "console made": "lifecycle.cli.console" in sys.modules,
        "main": {name: re.sub(" at 0x[0-9a-f]+", "", repr(getattr(sys.modules["__main__"], name,
                                                                 "(none)")))
                 for name in ("__name__", "__file__", "__package__", "__spec__", "__cached__",
                              "__loader__", "__doc__")},
    }, file)

if __name__ == "__main__":  # run itself (python -m probe, python probe.py): it exits as told
    print("probe", sys.argv[1:], flush=True)
    print("to stderr", file=sys.stderr)
    sys.exit(int(sys.argv[1]))
'''
FORMS = {
    # how the test starts what it runs: the console script (which loads the probe as a
    # plugin), python -m MODULE and python SCRIPT (the probe itself, given a relative path)
    "program": [PROGRAM],
    "-m lifecycle": [sys.executable, "-m", "lifecycle"],
    "-m MODULE": [sys.executable, "-m", "probe", "3", "an argument", "-m"],
    "SCRIPT": [sys.executable, "./sub/../probe.py", "4", "-c", "x"],
}
SETUPS = {
    # (a shell's set-up before it runs the program, the program's stdio, environment);
    # `lifecycle describe startd` (a table as wide as the terminal) then runs too where the
    # width or the terminal is not the others' (as the console script: `-m lifecycle` differs
    # from it only in how __main__ is run, before any console is made, and its `machines`
    # there compares the stdio and environment the consoles are made from)
    "pipes": ("", "pipe", {}),
    "a terminal": ("", "terminal", {"TERM": "xterm-256color"}),
    "SIGINT ignored, umask, time zone, width": ("trap '' INT; umask 077", "pipe",
                                                {"TZ": "Pacific/Auckland", "COLUMNS": "151"}),
    "no stdin, bytecode written": ("exec <&-", "pipe", {"PYTHONDONTWRITEBYTECODE": ""}),
    # a path of the test's own: relative, empty (the working directory) and missing entries
    "PYTHONPATH": ("", "pipe", {"PYTHONPATH": os.pathsep.join(["sub", "", "/nonexistent"])}),
    # an interpreter set to start otherwise than the server: the client runs the program
    "PYTHONWARNINGS": ("", "pipe", {"PYTHONWARNINGS": "error::ResourceWarning"}),
}


def started(command: list[str], setup: str, stdio: str, env: dict[str, str],
            cwd: Path) -> tuple[int, str, str]:
    """Run ``command`` after ``setup`` in sh; its exit status, stdout and stderr."""
    if stdio == "terminal":
        primary, secondary = os.openpty()
        stdout: Any = secondary
    else:
        stdout = subprocess.PIPE
    process = subprocess.Popen(["sh", "-c", f'{setup or ":"}; exec "$@"', "sh", *command],
                               cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                               stderr=subprocess.PIPE)
    if stdio == "terminal":
        os.close(secondary)
        output = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the terminal's last holder closed it
                break
            if not chunk:
                break
            output += chunk
        os.close(primary)
        error = process.stderr.read()  # type: ignore[union-attr]
        process.stderr.close()  # type: ignore[union-attr]
        process.wait()
        return process.returncode, output.decode().replace("\r\n", "\n"), error.decode()
    out, err = process.communicate(timeout=120)
    return process.returncode, out.decode(), err.decode()


CELLS = [(setup, form) for setup in SETUPS for form in FORMS
         if (setup, form) != ("PYTHONWARNINGS", "-m lifecycle")]
"""Each set-up in each form, but for `-m lifecycle` where the client runs the real program:
its fall-back (an exec of the interpreter with the arguments it was given) is `-m MODULE`'s."""


@pytest.mark.parametrize(("setup", "form"), CELLS, ids=[f"{s}-{f}" for s, f in CELLS])
def test_the_fork_is_the_program_as_it_starts(setup: str, form: str, forkserver: Any,
                                               tmp_path: Path) -> None:
    shell, stdio, variables = SETUPS[setup]
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "sub").mkdir()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LIFECYCLE_")},
           "COLUMNS": "70", **variables, "LIFECYCLE_PLUGINS": "probe"}
    command = FORMS[form]
    lifecycle = form in ("program", "-m lifecycle")
    commands = [["machines"]] if lifecycle else [[]]
    if form == "program" and (stdio == "terminal" or "COLUMNS" in variables):
        commands.append(["describe", "startd"])
    seen = {}
    for how, program in (("real", command),
                         ("fork", [*forkserver.client_command(command[0]), *command[1:]])):
        ran = [started([*program, *args], shell, stdio, env, tmp_path) for args in commands]
        state = json.loads((tmp_path / "state.json").read_text())
        (tmp_path / "state.json").unlink()
        seen[how] = (ran, state)
    (real_ran, real), (fork_ran, fork) = seen["real"], seen["fork"]
    assert fork_ran == real_ran  # what it printed, exit statuses
    if lifecycle:
        assert real_ran[0][0] == 1 and "no lifecycle schema" in real_ran[0][2]
        assert ("lifecycle/__main__.py" in real["main"]["__file__"]) == (form != "program")
    else:
        assert real_ran[0][0] == int(command[2 if form == "SCRIPT" else 3])
        assert real_ran[0][1].startswith("probe ["), real_ran
        assert real["main"]["__name__"] == "'__main__'"
    if len(commands) > 1:
        assert "startd" in real_ran[1][1] and "spec version" in real_ran[1][1], real_ran[1]
    for name in real:
        assert fork[name] == real[name], name
    if stdio == "terminal":
        assert real["stdio"][1]["isatty"]
    fallback = zygote._mismatch({"argv": command, "env": env, "cwd": str(tmp_path)}, PROGRAM)
    assert (fallback is not None) == ("PYTHONWARNINGS" in variables), fallback


def test_what_a_fork_cannot_be_runs_for_real(tmp_path: Path) -> None:
    """An interpreter option, another interpreter (or another name of this one), a module or
    script not given as a fork would run it: the client runs the real command."""
    (tmp_path / "probe.py").write_text(PROBE)
    python = sys.executable
    served = [[PROGRAM, "machines"], [python, "-m", "lifecycle", "machines"],
              [python, "probe.py", "1"], [python, str(tmp_path / "probe.py")]]
    real = [[python, "-u", "probe.py"], [python, "-c", "pass"], [python, "-m"],
            [python, "-m", "-c"], [python, "-mlifecycle"], [python], [python, "missing.py"],
            [python, "-", "probe.py"], [str(Path(python).with_name("python3.0")), "probe.py"],
            [os.path.realpath(python), "probe.py"], ["python", "probe.py"]]
    for argv in served + real:
        found = zygote._mismatch({"argv": argv, "env": dict(os.environ), "cwd": str(tmp_path)},
                                 PROGRAM)
        assert (found is None) == (argv in served), (argv, found)
    # a setting a preloaded module reads when imported (job_exit's): for real
    found = zygote._mismatch({"argv": served[1], "cwd": str(tmp_path), "env": {
        **os.environ, "LIFECYCLE_JOB_EXIT_RETRY_DELAY": "7"}}, PROGRAM)
    assert found is not None and "LIFECYCLE_JOB_EXIT_RETRY_DELAY" in found
    # a PYTHONPATH that holds a module the server imported (which a new interpreter would
    # import from there): for real too; one that holds none is served
    (tmp_path / "shadow" / "lifecycle").mkdir(parents=True)
    for path, served_here in (("shadow", False), (".", True), ("", True)):
        found = zygote._mismatch({"argv": served[1], "env": {**os.environ, "PYTHONPATH": path},
                                  "cwd": str(tmp_path)}, PROGRAM)
        assert (found is None) == served_here, (path, found)


def test_a_signal_reaches_the_command_and_its_status_comes_back(forkserver: Any,
                                                                tmp_path: Path) -> None:
    """`lifecycle worker` in a shell's background stops gracefully on SIGINT (which the
    shell has it ignore, and the worker handles itself) and on SIGTERM; a client killed
    outright takes the worker with it; the client dies of what its command died of."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFECYCLE_")}
    db = f"sqlite:///{tmp_path / 'w.db'}"
    assert forkserver.run([PROGRAM, "db", "upgrade", "--db", db], cwd=str(tmp_path),
                          env=env).returncode == 0
    for name in ("INT", "TERM"):
        done = subprocess.run(
            ["bash", "-c", f'"$@" & until [ -s log ]; do sleep 0.05; done; kill -{name} $!; '
                           'wait $!; echo "exit $?"', "bash",
             *forkserver.client_command(PROGRAM), "worker", "--db", db],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=(tmp_path / "log").open("w"),
            text=True, timeout=120)
        log = (tmp_path / "log").read_text()
        assert done.stdout.endswith("exit 0\n"), (done.stdout, log)
        assert f"SIG{name}, graceful shutdown" in log, log
        (tmp_path / "log").unlink()
    # a command that dies of a signal: its client dies of it too
    client = subprocess.Popen([*forkserver.client_command(PROGRAM), "worker", "--db", db],
                              cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    assert client.stderr is not None
    assert "started" in client.stderr.readline()  # its handlers are in place
    worker = _child_of_server(forkserver, client.pid)
    os.kill(worker, signal.SIGKILL)
    assert client.wait(timeout=60) == -signal.SIGKILL
    client.stderr.close()
    # a client killed outright: its worker goes too
    client = subprocess.Popen([*forkserver.client_command(PROGRAM), "worker", "--db", db],
                              cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    assert client.stderr is not None
    assert "started" in client.stderr.readline()
    worker = _child_of_server(forkserver, client.pid)
    client.kill()
    client.wait(timeout=60)
    client.stderr.close()
    deadline = time.monotonic() + 60  # against a hang only: the server kills it at once
    while Path(f"/proc/{worker}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{worker}").exists()


def _child_of_server(forkserver: Any, client: int) -> int:
    """The pid of the server's one child: the command the client ``client`` started."""
    server = forkserver.process.pid
    children = [int(pid) for pid in os.listdir("/proc") if pid.isdigit()
                and _parent(int(pid)) == server]
    assert len(children) == 1, children
    return children[0]


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def test_a_request_sent_whole_is_not_sent_again_to_a_server_that_has_closed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A short request goes out in its first send; its command may then run and end, and the
    server close the connection, before the client goes on: the client must not send again
    (an empty send to a closed socket fails with a broken pipe, as it did under load)."""
    import socket

    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    real_send_fds = socket.send_fds

    def then_the_server_closes(*args: Any) -> int:
        sent = real_send_fds(*args)
        server.recv(65536)
        server.close()
        return sent

    monkeypatch.setattr(socket, "send_fds", then_the_server_closes)
    try:
        zygote._send(client, {"argv": ["lifecycle", "history", "vm-1"]}, [None, 1, 2])
    finally:
        client.close()
