"""``lifecycle simulate drone-race``: a pool of short-lived drones under fluctuating demand,
with status delays like the incident's, run on TARDIS as it is (``drone_tardis``) and on the
``drone`` machine.

The world: a site whose jobs boot after a random delay and whose status view lags reality by
a few seconds; a pool whose drones take payload soon after their job runs; a status cache
refreshed for all drones in one call every ``status_interval`` seconds; each drone stepping
on its own heartbeat; a controller that raises and lowers demand and releases drones by the
release policy. Counted: payloads killed (a terminate or stop that hit a drone running
payload), drones removed while running, and the probe calls the guard cost.

A run touches only the drones it created (its keys start with its ``prefix``), so runs can
share a database (``lifecycle demo`` runs on ./lifecycle.db, again and again).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..adapters.sites import (
    AVAILABLE,
    BOOTING,
    DELETED,
    DRAINED,
    DRAINING,
    NOT_AVAILABLE,
    RUNNING,
    Drone,
    Terminated,
)
from ..clock import SimulatedClock
from ..engine import Engine
from ..errors import raise_first
from ..machines import drone as drone_machine
from ..store import Store
from .loop import EventLoop, Progress
from .simulation import Option, Simulation
from .worker import InlineWorker

START = "2026-01-01T00:00:00Z"


@dataclass
class Job:
    """A drone's job at the site, and the payload it runs."""

    name: str
    submitted: float
    starts: float
    state: str = BOOTING                      # the truth: Booting, Running, Deleted
    history: list[tuple[float, str]] = field(default_factory=list)
    in_pool: bool = True
    """The drone's startd joins the pool by itself once the job runs; disintegrate removes it."""
    gate_open: bool = False
    draining: bool = False
    payload_since: float | None = None
    payload_until: float | None = None

    def state_since(self) -> float:
        """When the job entered its current state."""
        return self.history[-1][0] if self.history else self.submitted

    def state_at(self, when: float) -> str:
        state = BOOTING
        for at, value in self.history:
            if at <= when:
                state = value
        return state


class SimulatedPool:
    """The site and the pool of the simulation, driven by the event loop."""

    def __init__(self, loop: EventLoop, options: dict[str, Any]) -> None:
        self.loop = loop
        self.options = options
        self.jobs: dict[str, Job] = {}
        self.killed_payloads = 0
        self.removed_running = 0
        self.fenced_saves = 0
        self.victims: list[str] = []
        self.saved: list[str] = []

    @property
    def drone_minimum_lifetime(self) -> float | None:
        """The site's setting (TARDIS's ``drone_minimum_lifetime``)."""
        value = self.options.get("minimum_lifetime")
        return None if value is None else float(value)

    # -- the site ---------------------------------------------------------------------

    def deploy(self, drone: Drone) -> str:
        now = self.loop.elapsed
        low, high = self.options["boot_time"]
        job = Job(drone.name, now, now + self.loop.rng.uniform(low, high))
        job.history.append((now, BOOTING))
        self.jobs[drone.name] = job
        self.loop.at(job.starts, lambda: self._start(job))
        return f"job-{drone.name}"

    def _start(self, job: Job) -> None:
        if job.state != BOOTING:
            return
        job.state = RUNNING
        job.history.append((self.loop.elapsed, RUNNING))
        if not self.options["start_gate"]:
            self._offer_payload(job)

    def _offer_payload(self, job: Job) -> None:
        """The pool matches payload to the drone's machine a little after it appears."""
        low, high = self.options["payload_delay"]
        self.loop.after(self.loop.rng.uniform(low, high), lambda: self._payload(job))

    def _payload(self, job: Job) -> None:
        if job.state != RUNNING or job.draining or job.payload_since is not None:
            return
        until = self.options.get("payload_until")
        if until is not None and self.loop.elapsed >= until:
            return  # the pool's queue is empty: no more payload to match
        job.payload_since = self.loop.elapsed
        job.payload_until = job.payload_since + self.loop.rng.expovariate(
            1 / self.options["payload_length"])

    def _payload_running(self, job: Job) -> bool:
        return (job.payload_since is not None and job.payload_until is not None
                and job.payload_until > self.loop.elapsed)

    def status(self, drones: Sequence[Drone]) -> dict[str, str]:
        """The site's view lags reality by a random delay."""
        lag = self.loop.rng.uniform(0, self.options["site_lag"])
        when = self.loop.elapsed - lag
        out = {}
        for drone in drones:
            job = self.jobs.get(drone.name)
            out[drone.name] = DELETED if job is None else job.state_at(when)
        return out

    def stop(self, drone: Drone) -> None:
        job = self.jobs.get(drone.name)
        if job is not None and job.state == RUNNING:
            self._remove(job, terminate=False)

    def terminate(self, drone: Drone, expect: str | None) -> Terminated:
        job = self.jobs.get(drone.name)
        if job is None or job.state == DELETED:
            return Terminated(True, "already gone")
        if expect is not None and job.state != expect:
            self.fenced_saves += 1
            self.saved.append(job.name)
            return Terminated(False, f"left alone: the job is {self._truth(job)}, not "
                                     f"{expect}")
        truth = self._truth(job)
        killed = self._remove(job, terminate=True)
        return Terminated(True, f"removed the job while it was {truth}"
                                + (": its payload was killed" if killed else ""))

    def _truth(self, job: Job) -> str:
        """The job's state as the site knows it now, as the site would report it."""
        if job.state != RUNNING:
            return job.state
        since = self.loop.elapsed - job.state_since()
        text = f"{RUNNING} (for {since:.0f} s"
        if self._payload_running(job):
            assert job.payload_since is not None
            text += f", payload running for {self.loop.elapsed - job.payload_since:.1f} s"
        return text + ")"

    def _remove(self, job: Job, *, terminate: bool) -> bool:
        """Remove the job; whether that killed its payload."""
        killed = False
        if job.state == RUNNING:
            if terminate:
                self.removed_running += 1
            if self._payload_running(job):
                killed = True
                self.killed_payloads += 1
                self.victims.append(job.name)
        job.state = DELETED
        job.history.append((self.loop.elapsed, DELETED))
        return killed

    # -- the pool ---------------------------------------------------------------------

    def integrate(self, drone: Drone, *, open_gate: bool) -> None:
        job = self.jobs.get(drone.name)
        if job is not None and open_gate and not job.gate_open:
            job.gate_open = True
            self._offer_payload(job)

    def drain(self, drone: Drone) -> None:
        job = self.jobs.get(drone.name)
        if job is not None:
            job.draining = True

    def disintegrate(self, drone: Drone) -> None:
        job = self.jobs.get(drone.name)
        if job is not None:
            job.in_pool = False

    def allocation(self, drones: Sequence[Drone]) -> dict[str, float]:
        """A one-core drone: all of it is allocated while it runs payload."""
        return {d.name: 1.0 if (job := self.jobs.get(d.name)) is not None
                and job.state == RUNNING and self._payload_running(job) else 0.0
                for d in drones}

    def utilisation(self, drones: Sequence[Drone]) -> dict[str, float]:
        return self.allocation(drones)

    def payload_running(self, name: str) -> bool:
        job = self.jobs.get(name)
        return job is not None and job.state == RUNNING and self._payload_running(job)

    def machine_status(self, drones: Sequence[Drone]) -> dict[str, str]:
        out = {}
        for drone in drones:
            job = self.jobs.get(drone.name)
            if job is None or job.state != RUNNING or not job.in_pool:
                out[drone.name] = NOT_AVAILABLE
            elif job.draining:
                out[drone.name] = DRAINING if self._payload_running(job) else DRAINED
            else:
                out[drone.name] = AVAILABLE
        return out


class CountingProbe:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0
        self.keys: list[str] = []

    def __call__(self, request: Any) -> Any:
        self.calls += 1
        self.keys.append(request.key)
        return self.inner(request)


def run_variant(*, seed: int, race_guard: bool, options: dict[str, Any], store: Store,
                prefix: str = "", progress: Progress | None = None) -> dict[str, Any]:
    """One run of the pool on one variant of the machine, in ``store``; its counts."""
    clock = SimulatedClock(START)
    loop = EventLoop(clock, seed)
    world = SimulatedPool(loop, options)
    spec = drone_machine.drone_spec(race_guard=race_guard, start_gate=options["start_gate"],
                                    max_age=options["max_age"])
    probe = CountingProbe(drone_machine.probe(world, world))
    engine = Engine(store, [spec], guards=drone_machine.GUARDS,
                    effects=drone_machine.effects(world, world), probes={"site": probe},
                    clock=clock)
    worker = InlineWorker(engine, seed=seed)
    machine = spec.name
    duration = options["hours"] * 3600.0
    heartbeat = options["heartbeat"]
    counter = [0]
    live: dict[str, Any] = {}
    mine: set[str] = set()
    """This run's drones: the only ones it reads or changes."""

    def settle() -> None:
        worker.run_until_idle()

    def new_drone() -> None:
        counter[0] += 1
        name = f"{prefix}d{counter[0]:05d}"
        engine.create(machine, name, actor="cobald")
        live[name] = True
        mine.add(name)
        settle()
        loop.after(loop.rng.uniform(0, heartbeat), lambda: beat(name))

    def beat(name: str) -> None:
        result = engine.step(f"{machine}:{name}", actor="tardis", on_stale="return")
        if result.effects:
            settle()
        if (result.dest or result.source) == "down":
            live.pop(name, None)
            return
        loop.after(heartbeat, lambda: beat(name))

    def refresh_statuses() -> None:
        names = [n for n in live]
        if not names:
            return
        drones = [Drone(n) for n in names]
        site = world.status(drones)
        pool = world.machine_status(drones)
        # the cache's one call for all drones, recorded in one transaction (as the status
        # cache's own refresh does), not one per drone
        raise_first(engine.observe_many(
            [(f"{machine}:{name}", {"resource_status": site[name],
                                    "machine_status": pool[name]}) for name in names],
            source="status-cache"))

    def control() -> None:
        low, high = options["demand"]
        target = round(options["drones"] * loop.rng.uniform(low, high))
        # the pool: drones on their way up or up, still wanted (draining ones are leaving)
        # (read by state: the drones gone down, most of those ever made, are not read)
        wanted = sorted((r for state in drone_machine.POOL_STATES
                         for r in engine.resources(machine, state)
                         if r.key in mine and r.data.get("demand", 1) == 1),
                        key=lambda r: r.key)
        if target > len(wanted):
            for _ in range(target - len(wanted)):
                new_drone()
        elif target < len(wanted):
            used = world.utilisation([Drone(r.key) for r in wanted])
            for resource in drone_machine.release_order(
                    wanted, options["policy"], utilisation=used, rng=loop.rng)[
                    : len(wanted) - target]:
                engine.update(f"{machine}:{resource.key}", {"demand": 0}, actor="cobald")

    loop.every(options["status_interval"], refresh_statuses, until=duration)
    loop.every(options["demand_interval"], control, until=duration)
    loop.run(duration, progress)
    drone_seconds = sum(
        min(duration, (job.history[-1][0] if job.state == DELETED else duration))
        - job.submitted for job in world.jobs.values())
    return {
        "machine": machine,
        "example": next(iter(world.victims or world.saved or probe.keys), None),
        "drones": counter[0],
        "payloads_killed": world.killed_payloads,
        "removed_while_running": world.removed_running,
        "probe_calls": probe.calls,
        "fenced_terminates_refused": world.fenced_saves,
        "drone_hours": round(drone_seconds / 3600, 3),
    }


DEFAULTS: dict[str, Any] = {
    "drones": 300, "hours": 6.0, "heartbeat": 60.0, "status_interval": 60.0,
    "site_lag": 10.0, "boot_time": (30.0, 300.0), "payload_delay": (3.0, 30.0),
    "payload_length": 1800.0, "minimum_lifetime": 1800.0, "demand": (0.3, 1.0),
    "demand_interval": 60.0, "max_age": 30.0, "start_gate": False,
    "policy": "newest_first",
}


def simulate(*, seed: int = 1, progress: Progress | None = None, store: Store | None = None,
             prefix: str = "", **changes: Any) -> dict[str, Any]:
    """Both variants, on ``store`` (default: a temporary database of their own)."""
    options = {**DEFAULTS, **{k: v for k, v in changes.items() if v is not None}}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lifecycle-drone-race-") as directory:
        own = store is None
        runs = []
        for i, race_guard in enumerate((False, True)):
            def step_progress(done: float, total: float, i: int = i) -> None:
                if progress is not None:
                    progress(i * total + done, 2 * total)

            target = store or Store.new_sqlite(Path(directory) / f"run{i}.db")
            runs.append(run_variant(seed=seed, race_guard=race_guard, options=options,
                                    store=target, prefix=prefix, progress=step_progress))
            if own:
                target.dispose()
    before, after = runs
    elapsed = time.perf_counter() - started
    report = {
        "simulation": "drone-race",
        "seed": seed,
        "options": {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()},
        "before": before,
        "after": after,
        "timing": {"seconds": round(elapsed, 2), "drone_hours_per_second": round(
            (before["drone_hours"] + after["drone_hours"]) / max(elapsed, 1e-9), 1)},
    }
    hints: list[str] = []
    report["hints"] = hints
    if before["example"]:
        hints.append(f"lifecycle history drone_tardis:{before['example']}   a drone whose "
                     "payload TARDIS killed: the status its removal rested on, how old it "
                     "was, and what the site said when it removed the job")
    if after["example"]:
        hints.append(f"lifecycle history drone:{after['example']}   " + (
            "the same drone on lifecycle's machine" if after["example"] == before["example"]
            else "a drone on lifecycle's machine") + ": the fresh status it asked for, and "
            "the fence (or a fresh Running) that kept its job")
    report["measures"] = [
        {"what": "drones whose running payload was killed",
         "before": before["payloads_killed"], "after": after["payloads_killed"]},
        {"what": "drones removed while running", "before": before["removed_while_running"],
         "after": after["removed_while_running"]},
        {"what": "probe calls (the guard's cost)", "before": before["probe_calls"],
         "after": after["probe_calls"]},
    ]
    return report


SIMULATION = Simulation(
    name="drone-race",
    summary="TARDIS drones under fluctuating demand: payloads killed by the boot race",
    run=simulate,
    options={
        "drones": Option(int, DEFAULTS["drones"], "the pool's largest size", ">=1"),
        "hours": Option(float, DEFAULTS["hours"], "simulated hours", ">0"),
        "site_lag": Option(float, DEFAULTS["site_lag"],
                           "seconds the site's status lags reality", ">=0"),
        "status_interval": Option(float, DEFAULTS["status_interval"],
                                  "seconds between status refreshes (the cache's age)", ">0"),
        "max_age": Option(float, DEFAULTS["max_age"], "the risky edges' max_age, seconds", ">0"),
        "start_gate": Option(bool, DEFAULTS["start_gate"],
                             "drones take payload only once integrated"),
        "policy": Option(str, DEFAULTS["policy"], "which drones to release: newest_first "
                         "(a proposal in the incident's discussion, the default here), "
                         "established_first, or cobald (COBalD's FactoryPool: lowest supply x "
                         "utilisation first, ties in no order)",
                         choices=drone_machine.RELEASE_POLICIES),
    },
    demo={"drones": 40, "hours": 1.0},
)
