"""The suite's own check that a test leaves no process running (conftest.py) sees a child
the test started, whichever way it reads the process table, and not one that has exited."""

from __future__ import annotations

import os
import subprocess
import sys

import conftest
import pytest

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("listing", ["children", "scan"])
def test_a_running_child_is_seen_and_an_exited_one_is_not(
        listing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if listing == "scan":  # as on a kernel without /proc/PID/task/TID/children
        real_open = open

        def no_children_file(path: object, *args: object, **kwargs: object) -> object:
            if str(path).endswith("/children"):
                raise FileNotFoundError(path)
            return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

        monkeypatch.setattr("builtins.open", no_children_file)
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"up\n"  # its command line is its own from now on
        seen = conftest._children()
        assert child.pid in seen, seen
        assert "sys.stdin.read()" in seen[child.pid]
        assert os.getpid() not in seen
    finally:
        child.communicate(b"")
    assert child.pid not in conftest._children()


def test_a_failed_tests_processes_are_killed_at_once() -> None:
    """A test that failed does not leave what it started running into the next tests (its
    failure is reported as it was, not as a leak)."""
    import signal

    check = conftest.pytest_runtest_call(None)  # type: ignore[arg-type]
    next(check)  # the test begins
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with pytest.raises(ValueError, match="the test's own failure"):
            check.throw(ValueError("the test's own failure"))
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()
