"""The engine and the worker in both kinds, sync and asyncio, behind the sync calls the tests
make: a test written against ``Engine`` and ``Worker`` runs unchanged against ``AsyncEngine``
and ``AsyncWorker`` (each call runs the coroutine to its end on an event loop of the test's
own). The tests that take the ``kind`` fixture of their module run in both."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Any

from lifecycle import AsyncEngine, AsyncWorker, Engine, Worker

KINDS = ["sync", "async"]


class Blocking:
    """An :class:`AsyncEngine` seen through the :class:`Engine`'s sync calls."""

    def __init__(self, engine: Engine, database: str = "inline") -> None:
        self.aio = AsyncEngine.over(engine, database=database)  # type: ignore[arg-type]
        self.engine = engine
        self.runner = asyncio.Runner()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.aio, name, None)
        if value is None or not inspect.iscoroutinefunction(value):
            return getattr(self.engine, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.runner.run(value(*args, **kwargs))

        return call

    def close(self) -> None:
        self.runner.run(self.aio.aclose())
        self.runner.close()


class BlockingWorker:
    """An :class:`AsyncWorker` seen through the :class:`Worker`'s sync calls."""

    def __init__(self, engine: Blocking, **options: Any) -> None:
        self.aio = AsyncWorker(engine.aio, **options)
        self.runner = engine.runner

    def run_until_idle(self) -> Any:
        return self.runner.run(self.aio.run_until_idle())

    def run(self, **options: Any) -> Any:
        return self.runner.run(self.aio.run(**options))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.aio, name)


def engine_of(kind: str, *args: Any, **kwargs: Any) -> Any:
    """``Engine(*args, **kwargs)``, or the same engine driven as an ``AsyncEngine``."""
    engine = Engine(*args, **kwargs)
    return engine if kind == "sync" else Blocking(engine)


def worker_of(engine: Any, **options: Any) -> Any:
    """A ``Worker`` of ``engine``, or an ``AsyncWorker`` when ``engine`` is async."""
    return BlockingWorker(engine, **options) if isinstance(engine, Blocking) else Worker(
        engine, **options)


def closing(engine: Any) -> Callable[[], None]:
    return engine.close if isinstance(engine, Blocking) else (lambda: None)


DRIVERS = {"sync": Worker, "async": AsyncWorker}
"""The worker's two drivers of one core, by kind: the same arguments, the same outbox."""


def until_idle(worker: Worker | AsyncWorker) -> Any:
    """``worker.run_until_idle()``, on an event loop of its own for an ``AsyncWorker``."""
    if isinstance(worker, AsyncWorker):
        return asyncio.run(worker.run_until_idle())
    return worker.run_until_idle()


def running(worker: Worker | AsyncWorker) -> threading.Thread:
    """A started thread that runs ``worker.run()`` (on an event loop of that thread's own
    for an ``AsyncWorker``) until ``worker.stop()``."""
    if isinstance(worker, AsyncWorker):
        aio = worker
        thread = threading.Thread(target=lambda: asyncio.run(aio.run()))
    else:
        thread = threading.Thread(target=worker.run)
    thread.start()
    return thread
