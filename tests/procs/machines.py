"""Machines and handlers the subprocess workers of the effect tests run."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

from lifecycle import Effect, EffectCall, Engine, FollowUp, Retry, Store
from lifecycle.file_writes import atomic_write, verified_append

# three effects in a row, each a transition's: the shape of an HTCondor job exit
EXIT: dict[str, Any] = {
    "name": "exit3",
    "initial": "running",
    "final": ["done"],
    "states": ["running", "logging", "writing_ad", "mailing", "done"],
    "transitions": [
        {"trigger": "exited", "source": "running", "dest": "logging", "effects": ["userlog"]},
        {"trigger": "logged", "source": "logging", "dest": "writing_ad", "effects": ["ad"]},
        {"trigger": "ad_written", "source": "writing_ad", "dest": "mailing",
         "effects": ["mail"]},
        {"trigger": "mailed", "source": "mailing", "dest": "done"},
    ],
}

TICKER: dict[str, Any] = {
    "name": "ticker",
    "initial": "a",
    "states": ["a", "b"],
    "transitions": [
        {"trigger": "tick", "source": "a", "dest": "b", "effects": ["e0", "e1"]},
        {"trigger": "tick", "source": "b", "dest": "a", "effects": ["e0", "e1"]},
    ],
}

SLOW: dict[str, Any] = {
    "name": "slow",
    "initial": "a",
    "states": ["a", "b"],
    "transitions": [{"trigger": "go", "source": "a", "dest": "b", "effects": ["slow"]},
                    {"trigger": "back", "source": "b", "dest": "a"}],
}


class Crasher:
    """Kills its own process with SIGKILL at the named points, at random."""

    def __init__(self, seed: int, probability: float) -> None:
        self.rng = random.Random(seed)
        self.probability = probability

    def point(self, name: str) -> None:
        if self.rng.random() < self.probability:
            os.kill(os.getpid(), signal.SIGKILL)


def exit_engine(url: str, logs: Path, crasher: Crasher | None) -> Engine:
    def crash(name: str) -> None:
        if crasher is not None:
            crasher.point(name)

    class Inside:
        """The call, with a crash between saving the offset and writing the record."""

        def __init__(self, call: EffectCall) -> None:
            self.call = call
            self.progress = call.progress

        def save_progress(self, values: dict[str, Any]) -> None:
            self.call.save_progress(values)
            crash("inside")

    def append_step(call: EffectCall, what: str, follow: str) -> FollowUp:
        crash("before")
        record = f"{what} {call.key} {call.idempotency_key}\n".encode()
        verified_append(Inside(call), logs / f"{call.key}.log", record)  # type: ignore[arg-type]
        crash("after")
        return FollowUp(follow)

    def ad(call: EffectCall) -> FollowUp:
        crash("before")
        atomic_write(logs / f"{call.key}.ad", f"ClusterId = {call.key}\n".encode())
        crash("inside")
        record = f"ad {call.key} {call.idempotency_key}\n".encode()
        verified_append(Inside(call), logs / f"{call.key}.log", record)  # type: ignore[arg-type]
        crash("after")
        return FollowUp("ad_written")

    fast = Retry(base=0.01, cap=0.05)
    return Engine(Store(url), [EXIT], effects={
        "userlog": Effect(lambda c: append_step(c, "userlog", "logged"), fast),
        "ad": Effect(ad, fast),
        "mail": Effect(lambda c: append_step(c, "mail", "mailed"), fast),
    })


def ticker_engine(url: str, calls_table: str, worker: str) -> Engine:
    import psycopg

    libpq = url.replace("postgresql+psycopg://", "postgresql://")
    connection = psycopg.connect(libpq.split("?")[0], autocommit=True)
    schema = (url.split("search_path%3D")[1].split("&")[0] if "search_path%3D" in url
              else "public")

    def count(call: EffectCall) -> None:
        connection.execute(
            f'INSERT INTO "{schema}".{calls_table} (idempotency_key, effect_id, resource, '
            "worker) VALUES (%s, %s, %s, %s)",
            (call.idempotency_key, call.id, call.key, worker))

    return Engine(Store(url), [TICKER], effects={"e0": count, "e1": count})


def slow_engine(url: str, marker: Path) -> Engine:
    """A handler that writes ``MARKER.started`` when it begins, waits while ``MARKER.gate``
    exists (at most ten minutes), then writes ``MARKER``: a test decides when it ends."""
    def slow(call: EffectCall) -> None:
        # the handler has begun (a claimed effect not yet started is given back on SIGTERM)
        marker.with_suffix(".started").write_text(f"{call.idempotency_key}\n")
        deadline = time.monotonic() + 600
        while marker.with_suffix(".gate").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        marker.write_text(f"{call.idempotency_key}\n")

    return Engine(Store(url), [SLOW], effects={"slow": slow})
