"""The drone's own last word: ``lifecycle hook prepare-job``, HTCondor's HOOK_PREPARE_JOB for a
drone's startd, asks a live ``lifecycle serve`` whether the drone may start a payload:
allowed once integrated, made to wait while the drone is on its way up, refused once it is
being removed or gone, and refused (or, as asked, allowed) when the server does not answer."""

from __future__ import annotations

import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from databases import Templates
from waiting import until

from lifecycle import Engine, SimulatedClock, Store
from lifecycle.machines import drone

WAIT = 120.0


@pytest.fixture(scope="module")
def lifecycle_cmd(forkserver: Any) -> list[str]:
    """`python -m lifecycle`, started warm (tests/zygote.py): each command here ends by
    itself, or by the SIGTERM its client passes on."""
    return forkserver.python("-m", "lifecycle")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def served(templates: Templates, tmp_path_factory: pytest.TempPathFactory,
           lifecycle_cmd: list[str]) -> Iterator[tuple[str, Engine]]:
    """A live `lifecycle serve` of a database, and an engine that writes in it: one for the
    module (a server's start is most of a test's time), each test with drones of its own."""
    sqlite_url = templates.sqlite(tmp_path_factory.mktemp("served") / "lifecycle.db")
    server = subprocess.Popen([*lifecycle_cmd, "serve", "--port", "0", "--db", sqlite_url],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    engine = Engine(Store(sqlite_url), [drone.SPEC], guards=drone.GUARDS, strict=False,
                    clock=SimulatedClock("2026-01-01T00:00:00Z"))
    try:
        assert server.stdout is not None
        base = server.stdout.readline().strip().rsplit(" ", 1)[1].rstrip("/")

        def answers() -> bool:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            try:
                with urllib.request.urlopen(f"{base}/metrics", timeout=10):
                    return True
            except OSError:
                return False

        until(answers, "lifecycle serve to answer", WAIT)
        yield base, engine
    finally:
        engine.store.dispose()
        server.terminate()
        server.wait(timeout=WAIT)


def hook(lifecycle_cmd: list[str], url: str, key: str, *options: str
         ) -> subprocess.Popen[str]:
    return subprocess.Popen([*lifecycle_cmd, "hook", "prepare-job", "--url", url, "--drone", key,
                             "--every", "0.05", *options], stdin=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def verdict(lifecycle_cmd: list[str], url: str, key: str, *options: str) -> tuple[int, str]:
    process = hook(lifecycle_cmd, url, key, *options)
    _, said = process.communicate(timeout=WAIT)
    return process.returncode, said


def test_an_integrated_drone_may_start_payload_one_removed_or_gone_may_not(
        served: tuple[str, Engine], lifecycle_cmd: list[str]) -> None:
    base, engine = served
    for key, state in [("up", "available"), ("joined", "integrating"),
                       ("leaving", "draining"), ("removed", "cleanup"),
                       ("stopping", "shutdown"), ("gone", "down")]:
        engine.create("drone", key, state=state)
    assert verdict(lifecycle_cmd, base, "up")[0] == 0
    assert verdict(lifecycle_cmd, base, "joined")[0] == 0
    assert verdict(lifecycle_cmd, base, "leaving")[0] == 0      # a graceful drain lets it finish
    code, said = verdict(lifecycle_cmd, base, "removed")
    assert code == 1 and "the drone is in cleanup" in said
    assert verdict(lifecycle_cmd, base, "stopping")[0] == 1
    assert verdict(lifecycle_cmd, base, "gone")[0] == 1
    code, said = verdict(lifecycle_cmd, base, "never-made")
    assert code == 1 and "knows no such drone" in said


def test_a_booting_drone_makes_the_payload_wait_until_it_is_integrated(
        served: tuple[str, Engine], lifecycle_cmd: list[str]) -> None:
    base, engine = served
    engine.create("drone", "rising", state="booting")
    process = hook(lifecycle_cmd, base, "rising", "--wait", str(WAIT))
    assert process.stderr is not None
    first = process.stderr.readline()
    assert "the drone is in booting" in first and "asking again" in first
    assert process.poll() is None                # it waits: no verdict yet
    engine.observe("drone:rising", {"resource_status": "Running",
                                    "machine_status": "NotAvailable"})
    assert engine.step("drone:rising").dest == "integrate"
    assert engine.fire("drone:rising", "integrated").dest == "integrating"
    _, rest = process.communicate(timeout=WAIT)
    assert process.returncode == 0, rest
    assert "the drone is in integrating: integrated" in rest


def test_a_drone_still_booting_at_the_bound_is_refused(served: tuple[str, Engine],
                                                       lifecycle_cmd: list[str]) -> None:
    base, engine = served
    engine.create("drone", "slow", state="booting")
    code, said = verdict(lifecycle_cmd, base, "slow", "--wait", "0.2")
    assert code == 1 and "refused after 0.2 s" in said


@pytest.mark.parametrize("unreachable,code", [("refuse", 1), ("allow", 0)])
def test_a_server_that_does_not_answer_costs_the_timeout_then_the_chosen_verdict(
        unreachable: str, code: int, lifecycle_cmd: list[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:   # listens, never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        found, said = verdict(lifecycle_cmd, url, "d1", "--timeout", "0.2", "--wait", "0.3",
                              "--if-unreachable", unreachable)
    assert found == code, said
    assert "no answer from" in said and "within 0.2 s" in said and "timed out" in said
