"""``serve``: the read-only web dashboard (the ``serve`` extra)."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket

import click

from ..errors import SetupError
from .common import db_option, err, escape, out

SERVE_EXTRA = "pip install 'lifecycle-fsm[serve]'"


def needs_serve_extra(exc: ModuleNotFoundError) -> SetupError:
    return SetupError(f"this needs the serve extra ({exc.name} is not installed): "
                          f"{SERVE_EXTRA}")


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The address to listen on: loopback unless told otherwise (the dashboard "
                   "has no login).")
@click.option("--port", default=8470, show_default=True, type=click.IntRange(0, 65535),
              help="The port to listen on.")
@db_option
def serve(host: str, port: int, db_url: str | None) -> None:
    """Serve a read-only web dashboard of the database, and /metrics for Prometheus.

    Machines with their diagrams and counts per state, each machine's resources, a
    resource's history, stuck effects, refused risky edges and a live page, each also as
    ?format=json. It never writes to the database."""
    try:
        import uvicorn

        from ..dashboard.app import create_app
    except ModuleNotFoundError as exc:
        raise needs_serve_extra(exc) from None
    app = create_app(db_url)
    shown = app.state.dashboard.db.display_url
    listening = _listen(host, port)   # before saying so: a busy port is one error line
    port = listening.getsockname()[1]
    if not _loopback(host):
        err.print(f"[yellow]warning[/]: listening on {escape(host)}, reachable from other "
                  "hosts; the dashboard has no login")
    out.print(f"dashboard of {escape(shown)}, read-only: http://{escape(host)}:{port}/")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                           timeout_graceful_shutdown=5))
    server.run(sockets=[listening])


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port`` (0: a free port), or a SetupError that says
    why not (the port is taken, the address is not this host's)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        hint = ("; is another `lifecycle serve` running? choose another with --port"
                if exc.errno == errno.EADDRINUSE else "")
        raise SetupError(f"cannot listen on {host}:{port}: {reason}{hint}") from None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
