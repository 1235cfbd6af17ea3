"""Processes racing on one database, for tests/test_concurrency.py:
``python race.py KIND URL PROCESSES FIRES SEED``, started warm through the session's fork
server (tests/zygote.py).

It forks PROCESSES children (KIND ``fire``: each fires FIRES times at random at the shared
toggles; ``register``: each builds its Engine with a spec the database has not seen yet),
releases them together once every one has opened its own Store, and prints one JSON line:
``{"reports": {INDEX: REPORT}, "errors": [...]}``. Each child is an OS process of its own
with connections of its own: this process opens none before it forks (it only compiles the
store's statements, connecting to nothing, for every child to inherit), so nothing of a
database crosses a fork; forking from a process that imported everything once costs
milliseconds where a new interpreter costs a third of a second of CPU."""

from __future__ import annotations

import json
import logging
import os
import random
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

# tests/ on the path, as pytest puts it there (see run_worker.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lifecycle import Engine, GuardContext, Store
from lifecycle.errors import ResourceExists

TOGGLE_SPEC: dict[str, Any] = {
    "name": "toggle",
    "states": ["a", "b"],
    "initial": "a",
    "transitions": [
        {"trigger": "flip", "source": "a", "dest": "b"},
        {"trigger": "flip", "source": "b", "dest": "a"},
        # refused from b (no such transition) and from a when the payload says ok=False
        {"trigger": "set_b", "source": "a", "dest": "b", "guards": ["ok"]},
    ],
}
OTHER = {"a": "b", "b": "a"}
RESOURCES = 20
START_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 300.0


def _ok(context: GuardContext) -> bool:
    return bool(context.payload.get("ok", True))


GUARDS = {"ok": _ok}


def keys() -> list[str]:
    return [f"r{i:02d}" for i in range(RESOURCES)]


class _RetryCounter(logging.Handler):
    """Counts the engine's "version moved while firing; deciding again" messages: how often a
    worker really lost a compare-and-swap race (only for the diagnostics)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "moved during" in record.getMessage():
            self.count += 1


def _fire(url: str, index: int, fires: int, seed: int, ready: Any) -> dict[str, Any]:
    """One racer: its own Store and Engine, ``fires`` random fires once released.

    On SQLite a process that just committed usually takes the write lock again before the
    others wake from their busy wait, so the workers would run in long turns; a pause of up
    to a millisecond after each fire makes them interleave."""
    counter = _RetryCounter()
    engine_log = logging.getLogger("lifecycle.engine")
    engine_log.setLevel(logging.DEBUG)
    engine_log.addHandler(counter)
    store = Store(url)
    engine = Engine(store, [TOGGLE_SPEC], guards=GUARDS)
    rng = random.Random(seed)
    names = keys()
    fired: list[tuple[str, int, str, str | None, str, dict[str, Any] | None]] = []
    refused = 0
    anomalies: list[str] = []
    pause = 0.001 if store.dialect == "sqlite" else 0.0
    ready()
    began = time.perf_counter()
    # all at once: exactly one creates the resource, the others are told it exists
    try:
        engine.create("toggle", "contended", {"by": index})
        created = True
    except ResourceExists:
        created = False
    for i in range(fires):
        key = rng.choice(names)
        roll = rng.random()
        payload: dict[str, Any] | None
        if roll < 0.6:
            trigger, payload = "flip", None
        elif roll < 0.8:
            trigger, payload = "flip", {"by": index, "n": i}
        else:
            trigger, payload = "set_b", {"ok": rng.random() < 0.7, "by": index, "n": i}
        # half of the fires name the machine, half use the plain key
        name = f"toggle:{key}" if i % 2 else key
        result = engine.fire(name, trigger, payload, actor=f"worker-{index}")
        if result.fired:
            fired.append((key, result.version, result.source, result.dest, trigger, payload))
            if result.dest != OTHER[result.source] or (payload and not payload.get("ok", 1)):
                anomalies.append(f"fire {i} {trigger} {payload} fired: {result}")
        else:
            refused += 1
            # flip has an edge from both states and no guard: never refused, whatever
            # raced it; set_b with ok=True is refused only when the resource is in b
            if (not result.reason or trigger == "flip"
                    or (payload and payload.get("ok") and result.source != "b")):
                anomalies.append(f"fire {i} {trigger} {payload} refused: {result}")
        if pause:
            time.sleep(rng.random() * pause)
    elapsed = time.perf_counter() - began
    store.dispose()
    return {"fired": fired, "refused": refused, "retries": counter.count,
            "seconds": elapsed, "anomalies": anomalies, "created": created}


def _register(url: str, index: int, _fires: int, _seed: int, ready: Any) -> dict[str, Any]:
    """One process starting up: it opens the store, then, at the same instant as the
    others, builds its Engine with a spec the database has not seen yet."""
    store = Store(url)
    ready()
    engine = Engine(store, [TOGGLE_SPEC], guards=GUARDS)
    engine.create("toggle", f"w{index}")
    store.dispose()
    return {}


KINDS = {"fire": _fire, "register": _register}


def _child(kind: str, url: str, index: int, fires: int, seed: int, reports: Path,
           ready_w: int, go_r: int) -> None:
    """A forked racer: its report (or traceback) in ``reports``/INDEX.json, then it leaves."""
    code = 1
    try:
        def ready() -> None:
            """Say so, then wait until every racer has said so."""
            os.write(ready_w, b".")
            os.close(ready_w)
            os.read(go_r, 1)  # (the end of the file: the runner closed its end)
            os.close(go_r)

        report = ["ok", KINDS[kind](url, index, fires, seed, ready)]
        code = 0
    except BaseException as exc:
        first = (str(exc).splitlines() or [""])[0]
        report = ["error", f"{type(exc).__module__}.{type(exc).__name__}: {first}\n"
                           f"{traceback.format_exc()}"]
    try:
        (reports / f"{index}.json").write_text(json.dumps(report))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def race(kind: str, url: str, processes: int, fires: int, seed: int) -> dict[str, Any]:
    """Fork the racers, release them together once all are ready, and collect one report
    (or traceback) from each."""
    Store(url, check=False).dispose()  # the statements compiled (connecting to nothing) once
    reports = Path(tempfile.mkdtemp(prefix="lifecycle-race-"))
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    children: dict[int, int] = {}
    errors: list[str] = []
    try:
        for index in range(processes):
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                os.close(ready_r)
                os.close(go_w)
                _child(kind, url, index, fires, seed * 1000 + index, reports, ready_w, go_r)
            children[pid] = index
        os.close(ready_w)
        os.close(go_r)
        # every racer has opened its store (and a ready one waits) before the first goes;
        # one that failed first closes its end unsaid, and the rest go on without it
        said = 0
        deadline = time.monotonic() + START_TIMEOUT_S
        while said < processes:
            readable, _, _ = select.select([ready_r], [], [], deadline - time.monotonic())
            if not readable:
                errors.append(f"only {said} of {processes} racers got ready within "
                              f"{START_TIMEOUT_S:.0f} s")
                break
            chunk = os.read(ready_r, processes)
            if not chunk:
                break
            said += len(chunk)
        began = time.perf_counter()
        os.close(go_w)  # go
        go_w = -1
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while children and time.monotonic() < deadline:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                time.sleep(0.01)
                continue
            index = children.pop(pid)
            if status != 0:
                errors.append(f"racer {index} ended with status {status}")
        seconds = time.perf_counter() - began
        for pid, index in children.items():
            errors.append(f"racer {index} (pid {pid}) did not end in time; killed")
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        found: dict[int, Any] = {}
        for index in range(processes):
            path = reports / f"{index}.json"
            if not path.exists():
                errors.append(f"no report from racer {index}")
                continue
            status, body = json.loads(path.read_text())
            if status == "ok":
                found[index] = body
            else:
                errors.append(f"racer {index} raised:\n{body}")
        return {"reports": found, "errors": errors, "seconds": seconds}
    finally:
        os.close(ready_r)
        if go_w >= 0:
            os.close(go_w)
        shutil.rmtree(reports, ignore_errors=True)


def main() -> None:
    kind, url, processes, fires, seed = sys.argv[1:]
    print(json.dumps(race(kind, url, int(processes), int(fires), int(seed))), flush=True)


if __name__ == "__main__":
    main()
