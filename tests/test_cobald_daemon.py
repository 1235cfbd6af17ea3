"""TARDIS's site runs lifecycle's drones from its own COBalD configuration: COBalD's own
daemon (``python -m cobald.daemon``, in a subprocess) on a ``cobald.yml`` whose pipeline is
COBalD's ``LinearController`` and ``!LifecyclePoolFactory``, over a TARDIS configuration of
TARDIS's ``FakeSite`` and ``FakeBatchSystem``. The test sets the pool's utilisation (a file
the fake batch system reads) and waits for what the daemon writes in the database."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lifecycle.adapters.tardis",
                    reason="cobald-tardis is not installed (make installs it)")

from test_tardis import drone_effects
from waiting import until

from lifecycle import Engine, Store
from lifecycle.machines import drone
from lifecycle.outbox_admin import outbox_counts

TESTS = Path(__file__).resolve().parent
WAIT = 120.0

TARDIS_YML = """\
Sites:
  - name: Fake
    adapter: FakeSite
    quota: 3
Fake:
  api_response_delay: !RandomGauss {mu: 0, sigma: 0}
  resource_boot_time: !RandomGauss {mu: 0.25, sigma: 0}
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
    rate: 30
    interval: 0.1
  - __type__: cobald.decorator.standardiser.Standardiser
    maximum: {ceiling}
  - !LifecyclePoolFactory {{configuration: tardis.yml, database: "sqlite:///drones.db",
                            interval: 0.1, heartbeat: 0.1}}
"""


def start(forkserver: Any, folder: Path, tardis_yml: str, quota: int,
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """COBalD's daemon on ``folder``'s cobald.yml and the TARDIS configuration given: `python
    -m cobald.daemon`, started warm (tests/zygote.py; lifecycle, SQLAlchemy and psycopg
    imported once for the session), ended by the SIGTERM its client passes on."""
    (folder / "tardis.yml").write_text(tardis_yml)
    # the controller's demand stops at twice the site's quota: unbounded, it wound up while
    # the drones booted (to 39 for a quota of 3) and took as many rounds to come down before
    # any drone was released; twice the quota leaves the quota to the factory's own pools
    (folder / "cobald.yml").write_text(COBALD_YML.format(ceiling=2 * quota))
    (folder / "utilisation").write_text("1.0")
    env = {**(env or os.environ), "PYTHONPATH": os.pathsep.join(filter(None, [
        str(TESTS), os.environ.get("PYTHONPATH")]))}
    env.pop("LIFECYCLE_DATABASE_URL", None)
    with (folder / "daemon.log").open("wb") as log:
        return subprocess.Popen([*forkserver.python("-m", "cobald.daemon"), "cobald.yml"],
                                cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture
def daemon(tmp_path: Path, forkserver: Any) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    process = start(forkserver, tmp_path, TARDIS_YML, 3)
    try:
        yield process, tmp_path
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


class Reader:
    """The daemon's database, read from the test once the daemon made it."""

    def __init__(self, process: subprocess.Popen[bytes], folder: Path) -> None:
        self.process = process
        self.log = folder / "daemon.log"
        self.database = folder / "drones.db"
        self.opened: Engine | None = None

    def engine(self) -> Engine | None:
        if self.opened is None and self.database.exists() and \
                "ServiceRunner adopts" in self.log.read_text():
            self.opened = Engine(Store(f"sqlite:///{self.database}"), [drone.SPEC],
                                 guards=drone.GUARDS, strict=False)
        return self.opened

    def alive(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()[-3000:]
        return True

    def drones(self, state: str | None = None) -> list[Any]:
        found = self.engine()
        return [] if found is None else found.resources("drone", state)

    def stop(self) -> str:
        """SIGTERM; what the daemon logged, once it exited 0."""
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=WAIT) == 0, self.log.read_text()[-3000:]
        said = self.log.read_text()
        assert "lifecycle's drones stopped: closing the database" in said
        return said

    def close(self) -> None:
        if self.opened is not None:
            self.opened.store.dispose()


def _states(engine: Engine | None, keys: list[str]) -> dict[str, str]:
    if engine is None:
        return {}
    return {key: engine.get(f"drone:{key}").state for key in keys}


def test_cobalds_daemon_runs_lifecycles_drones_through_tardis_adapters(
        daemon: tuple[subprocess.Popen[bytes], Path]) -> None:
    process, folder = daemon
    read = Reader(process, folder)
    try:
        # utilisation and allocation 1.0: COBalD raises the demand up to the site's quota
        until(lambda: read.alive() and len(read.drones("available")) == 3,
              "three drones available", WAIT)
        up = sorted(r.key for r in read.drones("available"))
        assert len(read.drones()) == 3                  # the quota: no more were made
        assert all(key.startswith("fake-m1-") for key in up)
        ready = read.engine()
        assert ready is not None
        for key in up:
            history = ready.history(f"drone:{key}")
            assert [e.dest for e in history if e.kind != "update"][:5] == [
                "request", "booting", "integrate", "integrating", "available"]
            assert (history[0].actor or "").startswith("cobald: demand ")   # its decision
        # nobody uses the drones: COBalD lowers the demand, the pool releases them
        (folder / "utilisation").write_text("0.0")
        until(lambda: read.alive() and set(_states(ready, up).values()) == {"down"},
              "the three drones down", WAIT)
        for key in up:
            history = ready.history(f"drone:{key}")
            [release] = [e for e in history if e.kind == "update" and e.payload == {
                "demand": 0} and (e.actor or "").startswith("cobald:")]
            assert " < supply " in (release.actor or "")
            after = [e.dest for e in history if e.seq > release.seq and e.kind != "update"]
            # drained, then disintegrated: on a busy machine a status the site made before
            # the drain took (still Available) drains it again, as TARDIS does
            assert "disintegrate" in after and after[-1] == "down", after
            drained = after[:after.index("disintegrate")]
            assert drained[:2] == ["drain", "draining"], after
            assert set(drained) == {"drain", "draining"}, after
        # SIGTERM: COBalD's services stop, the worker gives its claims back
        said = read.stop()
        assert "SIGTERM: stopping COBalD's services" in said
        assert ready.verify() == []
        assert held_effects(ready) == 0
    finally:
        read.close()


def held_effects(engine: Engine) -> int:
    return outbox_counts(engine).get("running", 0)


def test_on_the_real_slurm_a_drone_whose_job_starts_before_its_removal_keeps_its_job(
        tmp_path: Path, cluster: Any, forkserver: Any) -> None:
    """The same pipeline on the real Slurm, the site's adapter TARDIS's Slurm one (which
    the factory fences): two drones' jobs are submitted held (pending: Booting); one is let
    run and becomes available; then nobody uses the drones, COBalD lets both go, and the
    pending one's job starts just before its fenced removal (the executor releases it at
    the removal's first command): it is kept, and the drone drained instead."""
    script = cluster.directory / "drone.sh"
    script.write_text("#!/bin/sh\nexec sleep 300\n")
    script.chmod(0o755)
    tardis_yml = f"""\
Sites:
  - {{name: Cluster, adapter: Slurm, quota: 2}}
Cluster:
  MachineTypes: [one]
  bulk_size: 50
  bulk_delay: 0.01
  executor: {{__type__: procs.starts_first.StartsFirst, marker: started}}
  MachineTypeConfiguration:
    one:
      Partition: debug
      Walltime: 60
      StartupCommand: {script}
      SubmitOptions: {{long: {{hold: null, chdir: "{cluster.directory}",
                                output: "{cluster.directory}/log/job-%j.out"}}}}
  MachineMetaData:
    one: {{Cores: 1, Memory: 0.1, Disk: 1}}
BatchSystem:
  adapter: FakeBatchSystem
  allocation: 1.0
  utilisation: {{__type__: procs.file_value.FileValue, path: utilisation}}
  machine_status: Available
"""
    process = start(forkserver, tmp_path, tardis_yml, 2, cluster.env)
    read = Reader(process, tmp_path)
    try:
        def deployed() -> list[Any]:
            return [d for d in read.drones("booting") if d.data.get("remote_id")]

        until(lambda: read.alive() and len(deployed()) == 2, "two drones deployed", WAIT)
        first, second = sorted(deployed(), key=lambda d: d.key)
        for d in (first, second):
            assert cluster.job_state(d.data["remote_id"]) == "PENDING"   # held: Booting
        cluster.run("scontrol", "release", first.data["remote_id"])
        until(lambda: read.alive() and first.key in {d.key for d in read.drones("available")},
              "the first drone available", WAIT)
        (tmp_path / "utilisation").write_text("0.0")
        engine = read.engine()
        assert engine is not None
        until(lambda: read.alive() and any(
            e.dest == "drain" for e in engine.history(f"drone:{second.key}")
            if e.source == "cleanup"), "the second drone drained after its cleanup", WAIT)
        job = second.data["remote_id"]
        # the drone may see its job Running before the executor's own squeue does and
        # writes the marker: wait for the marker, then check that it names this job
        until(lambda: (tmp_path / "started").exists(), "the executor's marker", WAIT)
        assert (tmp_path / "started").read_text() == job   # it started before the removal
        # (a heartbeat that saw it still pending meanwhile asks for one more terminate: the
        # same fence leaves the job alone again)
        def terminates(done: bool) -> list[dict[str, Any]]:
            return [p for name, p in drone_effects(engine, second.key, done=done)
                    if name == "terminate"]

        until(lambda: terminates(True) and len(terminates(True)) == len(terminates(False)),
              "every terminate asked for carried out", WAIT)
        done = terminates(True)
        assert all(t["acted"] is False for t in done), done
        assert f"job {job} is RUNNING, not PENDING: left alone" in done[0]["detail"]
        history = engine.history(f"drone:{second.key}")
        [cleanup] = [e for e in history if e.dest == "cleanup" and e.source == "booting"]
        assert cleanup.fence is not None     # the fresh Booting the removal rested on
        assert cleanup.fence["expect"]["resource_status"] == "Booting"
        read.stop()
        assert held_effects(engine) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        read.close()


