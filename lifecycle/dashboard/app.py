"""The dashboard's web application (Starlette): pages rendered on the server from Jinja2
templates that escape everything, each also answering ``?format=json``; ``/metrics`` for
Prometheus.

Every handler is a plain function, which Starlette runs in its thread pool: a page's
statements never hold up the event loop, so the server answers while workers write."""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import render, story
from ..clock import Clock, SystemClock
from ..errors import LifecycleError
from ..logs import logger
from ..machines.drone import payload_verdict
from ..storable import text_problem
from ..store.readonly import Connection, ReadOnlyDatabase, Unavailable
from ..store.statements import dashboard as reads
from .metrics import LifecycleCollector

log = logger(__name__)

TEMPLATES = Path(__file__).parent / "templates"
LONGEST_ARGUMENT = 1000
REFUSALS_HOURS = 1.0
LIVE_POLL_MS = 2000
DIAGRAMS_KEPT = 64
SECURITY_HEADERS = {
    # the pages' own inline script and style, nothing from elsewhere; diagrams are images
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
                               "style-src 'unsafe-inline'; img-src 'self'; connect-src 'self'; "
                               "base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class Problem(Exception):
    """A request the dashboard answers with an error page (not found, a bad argument)."""

    def __init__(self, status: int, reason: str, remedy: str = "") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.remedy = remedy


def _as_json(value: Any) -> str:
    """A stored value as JSON text (the template escapes it)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _when(value: str | None) -> str:
    """An ISO time as a person reads it: ``2026-01-01 00:01:00.000``."""
    if not value:
        return ""
    moment = dt.datetime.fromisoformat(value).astimezone(dt.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


@functools.cache
def environment() -> Environment:
    """The templates' environment, one per process: each template is compiled once, not
    again for each application made (a test's, an embedding program's); rendering from one
    environment in several threads is safe."""
    env = Environment(loader=FileSystemLoader(TEMPLATES),
                      autoescape=select_autoescape(default=True, default_for_string=True))
    env.filters["as_json"] = _as_json
    env.filters["as_text"] = story.document_text
    env.filters["when"] = _when
    return env


class Diagrams:
    """Each machine's diagram with the resources counted on its states: SVG drawn by
    Graphviz's ``dot`` when it is installed, else the Mermaid text. The newest
    :data:`DIAGRAMS_KEPT` drawings are kept (by spec version and counts): a page read again
    while nothing moved draws nothing."""

    def __init__(self) -> None:
        self._drawn: OrderedDict[tuple[str, str, tuple[tuple[str, int], ...]],
                                 tuple[str, str]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, machine: str, version: str, spec: Any,
            counts: dict[str, int]) -> tuple[str, str]:
        """(format, text): ``svg`` or ``mermaid``."""
        key = (machine, version, tuple(sorted(counts.items())))
        with self._lock:
            found = self._drawn.get(key)
            if found is not None:
                self._drawn.move_to_end(key)
                return found
        diagram = render.Diagram.from_spec(spec, counts)
        try:
            found = ("svg", render.svg(diagram, timeout=20.0)) if render.dot_program() \
                else ("mermaid", render.mermaid(diagram))
        except LifecycleError as exc:  # dot failed: the text still shows the machine
            log.warning("diagram of %s: %s", machine, exc)
            found = ("mermaid", render.mermaid(diagram))
        with self._lock:
            self._drawn[key] = found
            while len(self._drawn) > DIAGRAMS_KEPT:
                self._drawn.popitem(last=False)
        return found


def _argument(request: Request, name: str) -> str | None:
    value = request.query_params.get(name)
    if value is None or value == "":
        return None
    problem = text_problem(value, LONGEST_ARGUMENT)
    if problem is not None:
        raise Problem(400, f"the argument {name} {problem}")
    return value


def _path_name(request: Request) -> str:
    name = str(request.path_params["name"])
    problem = text_problem(name, LONGEST_ARGUMENT)
    if problem is not None:
        raise Problem(400, f"the machine's name {problem}")
    return name


class Dashboard:
    """The pages, over one read-only database."""

    def __init__(self, db: ReadOnlyDatabase, clock: Clock | None = None) -> None:
        self.db = db
        self.clock = clock or SystemClock()
        self.specs = reads.Specs()
        self.diagrams = Diagrams()
        self.env = environment()
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = LifecycleCollector(db, self.clock, self.specs)
        self.registry.register(self.collector)

    # -- answering ---------------------------------------------------------------------

    def answer(self, request: Request, template: str,
               compute: Callable[[Connection], dict[str, Any]]) -> Response:
        """The page ``template`` with what ``compute`` read, or its JSON; an error page
        (or JSON ``{"error": ...}``) for a database that cannot be shown or a bad request."""
        wanted = request.query_params.get("format", "html")
        as_json = wanted == "json"
        try:
            if wanted not in ("html", "json"):
                raise Problem(400, f"unknown format {wanted!r}", "use format=json or none")
            with self.db.read() as db:
                page = compute(db)
        except Unavailable as exc:
            return self.error(request, 503, exc.reason, exc.remedy, as_json)
        except Problem as exc:
            return self.error(request, exc.status, exc.reason, exc.remedy, as_json)
        if as_json:
            return JSONResponse(page)
        return self.html(template, page, request)

    def html(self, template: str, page: dict[str, Any], request: Request,
             status: int = 200) -> HTMLResponse:
        text = self.env.get_template(template).render(
            page=page, path=request.url.path, database=self.db.display_url,
            live_poll_ms=LIVE_POLL_MS, diagrams_as_svg=render.dot_program() is not None)
        return HTMLResponse(text, status_code=status)

    def error(self, request: Request, status: int, reason: str, remedy: str,
              as_json: bool) -> Response:
        if as_json:
            return JSONResponse({"error": reason, "remedy": remedy}, status_code=status)
        return self.html("error.html", {"status": status, "reason": reason, "remedy": remedy},
                         request, status)

    # -- pages ---------------------------------------------------------------------------

    def machines(self, request: Request) -> Response:
        def compute(db: Connection) -> dict[str, Any]:
            return {"machines": reads.machine_rows(db, self.specs)}
        return self.answer(request, "machines.html", compute)

    def machine(self, request: Request) -> Response:
        name = _path_name(request)
        limit = request.query_params.get("limit", str(reads.PAGE))
        if not limit.isdigit() or not 1 <= int(limit) <= 1000:
            return self.error(request, 400, f"limit {limit!r} is not a number from 1 to 1000",
                              "", request.query_params.get("format") == "json")
        asked = reads.Listing(name, _argument(request, "state"), _argument(request, "q"),
                              _argument(request, "after"), _argument(request, "before"),
                              int(limit))

        def compute(db: Connection) -> dict[str, Any]:
            found = reads.machine_rows(db, self.specs, name)
            if not found:
                raise Problem(404, f"no machine {name!r} in this database")
            states = [s["state"] for s in found[0]["states"]]
            listing = replace(asked, inside=reads.inside(asked.state, states)) \
                if asked.state else asked
            return {**found[0], "listing": reads.resource_page(db, listing)}
        return self.answer(request, "machine.html", compute)

    def resource(self, request: Request) -> Response:
        name = _path_name(request)
        key = _argument(request, "key")

        def compute(db: Connection) -> dict[str, Any]:
            if key is None:
                raise Problem(400, "which resource? add ?key=KEY")
            found = reads.resource_detail(db, name, key)
            if found is None:
                raise Problem(404, f"no resource {key!r} of machine {name!r}")
            telling = story.tell(found.entries, found.observations, found.effects)
            return {**found.page, "story": {
                "day": telling.day.isoformat() if telling.day else None,
                "rows": [{**row.to_json(), "time": telling.time(row.at)}
                         for row in telling.rows]}}
        return self.answer(request, "resource.html", compute)

    def payload(self, request: Request) -> Response:
        """May drone KEY of this machine start a payload (``lifecycle hook prepare-job``
        asks): ``{"verdict": "yes" | "wait" | "no", "reason", "state"}``, JSON only."""
        name = _path_name(request)
        key = _argument(request, "key")
        if key is None:
            return self.error(request, 400, "which drone? add ?key=KEY", "", True)
        try:
            with self.db.read() as db:
                state = reads.state_of(db, name, key)
        except Unavailable as exc:
            return self.error(request, 503, exc.reason, exc.remedy, True)
        verdict, reason = payload_verdict(state)
        return JSONResponse({"machine": name, "key": key, "state": state,
                             "verdict": verdict, "reason": reason})

    def effects(self, request: Request) -> Response:
        def compute(db: Connection) -> dict[str, Any]:
            return {"now": reads.iso(self.clock.now()),
                    "overdue_after_seconds": reads.OVERDUE_AFTER.total_seconds(),
                    **reads.trouble(db, self.clock.now())}
        return self.answer(request, "effects.html", compute)

    def refusals(self, request: Request) -> Response:
        hours_text = request.query_params.get("hours", str(REFUSALS_HOURS))
        try:
            hours = float(hours_text)
            if not 0 < hours <= 24 * 366 * 10:
                raise ValueError(hours_text)
        except ValueError:
            return self.error(request, 400, f"hours {hours_text!r} is not a number of hours "
                              "from 0 to ten years", "", request.query_params.get("format") ==
                              "json")

        def compute(db: Connection) -> dict[str, Any]:
            now = self.clock.now()
            found = reads.refusals(db, now - dt.timedelta(hours=hours))
            newest = found["newest_earlier"]
            # the window that reaches the newest earlier refusal (a simulation's, say, whose
            # clock was not this one's), in whole hours
            reach = None
            if newest:
                at = dt.datetime.fromisoformat(newest)
                at = at if at.tzinfo else at.replace(tzinfo=dt.UTC)   # SQLite's: UTC
                reach = math.ceil((now - at).total_seconds() / 3600) + 1
            return {"hours": hours, "reach_hours": reach, **found}
        return self.answer(request, "refusals.html", compute)

    def live(self, request: Request) -> Response:
        def compute(db: Connection) -> dict[str, Any]:
            return {"at": reads.iso(self.clock.now()), "counts": reads.counts(db)}
        return self.answer(request, "live.html", compute)

    def diagram(self, request: Request) -> Response:
        name = _path_name(request)
        try:
            with self.db.read() as db:
                found = reads.machine_rows(db, self.specs, name)
                spec = self.specs.get(db, name, found[0]["spec_version"]) if found else None
                counts = reads.counts(db, name).get(name, {})
        except Unavailable as exc:
            return Response(exc.reason, status_code=503, media_type="text/plain")
        if spec is None:
            return Response(f"no machine {name!r}", status_code=404, media_type="text/plain")
        kind, drawn = self.diagrams.get(name, spec.version, spec, counts)
        fresh = {"Cache-Control": "no-cache"}  # the counts change
        if kind == "svg":  # no script, even opened on its own rather than as an image
            return Response(drawn, media_type="image/svg+xml", headers={
                **fresh,
                "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'"})
        return Response(drawn, media_type="text/plain; charset=utf-8", headers=fresh)

    def metrics(self, request: Request) -> Response:
        """The metrics in the format the scraper asks for (its ``Accept`` header): Prometheus'
        text format 0.0.4 when it asks for nothing else, OpenMetrics when it prefers it."""
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(self.registry), headers={"Content-Type": content_type})


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every response (a plain ASGI middleware: it leaves
    the body as the page wrote it, in one piece)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                message = {**message, "headers": [
                    *message.get("headers", []),
                    *((k, v) for k, v in self.headers if k not in present)]}
            await send(message)

        await self.app(scope, receive, with_headers)


def create_app(url: str | None = None, *, clock: Clock | None = None) -> Starlette:
    """The dashboard of the database at ``url`` (the usual default: $LIFECYCLE_DATABASE_URL,
    else ./lifecycle.db); its connections close when the application shuts down."""
    dashboard = Dashboard(ReadOnlyDatabase(url), clock)

    def guarded(page: Callable[[Request], Response]) -> Callable[[Request], Response]:
        def run(request: Request) -> Response:
            try:
                return page(request)
            except Problem as exc:
                return dashboard.error(request, exc.status, exc.reason, exc.remedy,
                                       request.query_params.get("format") == "json")
        return run

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        dashboard.collector.history.start()
        try:
            yield
        finally:
            dashboard.collector.history.stop()
            dashboard.db.dispose()

    routes = [
        Route("/", guarded(dashboard.machines)),
        Route("/machines/{name}", guarded(dashboard.machine)),
        Route("/machines/{name}/resource", guarded(dashboard.resource)),
        Route("/machines/{name}/diagram", guarded(dashboard.diagram)),
        Route("/machines/{name}/payload", guarded(dashboard.payload)),
        Route("/effects", guarded(dashboard.effects)),
        Route("/refusals", guarded(dashboard.refusals)),
        Route("/live", guarded(dashboard.live)),
        Route("/metrics", dashboard.metrics),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    middleware=[Middleware(SecurityHeaders)])
    app.state.dashboard = dashboard
    return app


START_SECONDS = 60.0


@contextmanager
def serve_in_thread(url: str | None = None, *, clock: Clock | None = None,
                    host: str = "127.0.0.1") -> Iterator[str]:
    """The dashboard of ``url`` served by uvicorn in a thread of this process, on a free
    port of ``host``: its base URL (``http://127.0.0.1:PORT``) once it answers. Stopped, its
    connections closed, when the block ends (embedding it in a program; tests)."""
    import uvicorn

    # IPPROTO_TCP named: asyncio switches Nagle's algorithm off only on sockets that say so
    # (else every response waits ~40 ms for the client's delayed ACK of its headers)
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening.bind((host, 0))
    base = f"http://{host}:{listening.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(create_app(url, clock=clock), log_level="warning",
                                           timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]},
                              name="lifecycle-dashboard", daemon=True)
    thread.start()
    try:
        _wait_for(base, server, thread)
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        listening.close()
        if thread.is_alive():
            raise RuntimeError("the dashboard's server did not stop within 30 s")


def _wait_for(base: str, server: Any, thread: threading.Thread) -> None:
    """Until the server has started and answers a request (or died, or a minute passed)."""
    deadline = time.monotonic() + START_SECONDS
    address = base.removeprefix("http://").rpartition(":")
    while time.monotonic() < deadline:
        if not thread.is_alive():
            raise RuntimeError("the dashboard's server stopped while starting")
        if server.started:
            try:
                with socket.create_connection((address[0], int(address[2])), timeout=10) as s:
                    s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                    if s.recv(12).startswith(b"HTTP/1.1 200"):
                        return
            except OSError:
                pass
        time.sleep(0.01)
    raise RuntimeError(f"the dashboard did not answer at {base} within {START_SECONDS:g} s")
