"""TARDIS's site runs lifecycle's drones from its own COBalD configuration: COBalD's own
daemon (``python -m cobald.daemon``, in a subprocess) on a ``cobald.yml`` whose pipeline is
COBalD's ``LinearController`` and ``!LifecyclePoolFactory``, over a TARDIS configuration of
TARDIS's ``FakeSite`` and ``FakeBatchSystem``. The test sets the pool's utilisation (a file
the fake batch system reads) and waits for what the daemon writes in the database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lifecycle.adapters.tardis",
                    reason="cobald-tardis is not installed (make installs it)")

from waiting import until

from lifecycle import Engine, Store
from lifecycle.machines import drone

TESTS = Path(__file__).resolve().parent
WAIT = 120.0

TARDIS_YML = """\
Sites:
  - name: Fake
    adapter: FakeSite
    quota: 3
Fake:
  api_response_delay: !RandomGauss {mu: 0, sigma: 0}
  resource_boot_time: !RandomGauss {mu: 1, sigma: 0}
  MachineTypes: [m1]
  MachineMetaData:
    m1: {Cores: 1, Memory: 1, Disk: 1}
BatchSystem:
  adapter: FakeBatchSystem
  allocation: 1.0
  utilisation: {__type__: procs.file_value.FileValue, path: utilisation}
  machine_status: Available
"""

COBALD_YML = """\
pipeline:
  - __type__: cobald.controller.linear.LinearController
    low_utilisation: 0.5
    high_allocation: 0.5
    rate: 1
  - !LifecyclePoolFactory {configuration: tardis.yml, database: "sqlite:///drones.db",
                           interval: 1, heartbeat: 1}
"""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    (tmp_path / "tardis.yml").write_text(TARDIS_YML)
    (tmp_path / "cobald.yml").write_text(COBALD_YML)
    (tmp_path / "utilisation").write_text("1.0")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(TESTS), os.environ.get("PYTHONPATH")]))}
    env.pop("LIFECYCLE_DATABASE_URL", None)
    with (tmp_path / "daemon.log").open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "cobald.daemon", "cobald.yml"],
                                   cwd=tmp_path, env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
    try:
        yield process, tmp_path
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _states(engine: Engine | None, keys: list[str]) -> dict[str, str]:
    if engine is None:
        return {}
    return {key: engine.get(f"drone:{key}").state for key in keys}


def test_cobalds_daemon_runs_lifecycles_drones_through_tardis_adapters(
        daemon: tuple[subprocess.Popen[bytes], Path]) -> None:
    process, folder = daemon
    log = folder / "daemon.log"
    database = folder / "drones.db"
    opened: list[Engine] = []

    def engine() -> Engine | None:
        if not opened and database.exists() and "ServiceRunner adopts" in log.read_text():
            opened.append(Engine(Store(f"sqlite:///{database}"), [drone.SPEC],
                                 guards=drone.GUARDS, strict=False))
        return opened[0] if opened else None

    def available() -> list[Any]:
        found = engine()
        return [] if found is None else found.resources("drone", "available")

    def alive() -> bool:
        assert process.poll() is None, log.read_text()[-3000:]
        return True

    try:
        # utilisation and allocation 1.0: COBalD raises the demand up to the site's quota
        until(lambda: alive() and len(available()) == 3, "three drones available", WAIT)
        up = sorted(r.key for r in available())
        assert all(key.startswith("fake-m1-") for key in up)
        ready = opened[0]
        for key in up:
            history = ready.history(f"drone:{key}")
            assert [e.dest for e in history if e.kind != "update"][:5] == [
                "request", "booting", "integrate", "integrating", "available"]
            assert (history[0].actor or "").startswith("cobald: demand ")   # its decision
        # nobody uses the drones: COBalD lowers the demand, the pool releases them
        (folder / "utilisation").write_text("0.0")
        until(lambda: alive() and set(_states(ready, up).values()) == {"down"},
              "the three drones down", WAIT)
        for key in up:
            history = ready.history(f"drone:{key}")
            [release] = [e for e in history if e.kind == "update" and e.payload == {
                "demand": 0} and (e.actor or "").startswith("cobald:")]
            assert " < supply " in (release.actor or "")
            after = [e.dest for e in history if e.seq > release.seq and e.kind != "update"]
            assert after[:3] == ["drain", "draining", "disintegrate"] and after[-1] == "down"
        # SIGTERM: COBalD's services stop, the worker gives its claims back
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=WAIT) == 0, log.read_text()[-3000:]
        said = log.read_text()
        assert "SIGTERM: stopping COBalD's services" in said
        assert "lifecycle's drones stopped: closing the database" in said
        assert ready.verify() == []
        with ready.store.read() as db:
            held = db.exec_driver_sql(
                "SELECT count(*) FROM lifecycle_effects WHERE status = 'running'").scalar()
        assert held == 0
    finally:
        for found in opened:
            found.store.dispose()
