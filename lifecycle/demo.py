"""``lifecycle demo``: drive the tutorial machine on the embedded database, show each
decision the engine took or refused, the journal it wrote, and that the journal replays."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.table import Table

from .engine import Engine


def run_demo(engine: Engine, out: Console) -> None:
    started = time.perf_counter()
    out.print(f"[bold]lifecycle demo[/] on {engine.store.display_url}\n")
    taken = len(engine.resources("batch_job"))
    keys = [f"job-{taken + i}" for i in (1, 2, 3)]
    ok, crash, held = keys
    plan: list[tuple[str, str, dict[str, Any] | None]] = [
        (ok, "start", None), (ok, "executing", None), (ok, "exit", {"exit_code": 0}),
        (crash, "start", None), (crash, "exit", {"exit_code": 1}),
        (crash, "executing", None), (crash, "exit", {"exit_code": 137}),
        (held, "hold", {"holds": 3}), (held, "release", None), (held, "step", None),
    ]
    for key in keys:
        engine.create("batch_job", key, {"owner": "demo", "cmd": f"/bin/{key}"}, actor="demo")
    table = Table("resource", "event", "from", "to", "outcome", title="what the engine decided",
                  title_justify="left")
    for key, trigger, payload in plan:
        if trigger == "step":
            result = engine.step(key, actor="demo")
        else:
            result = engine.fire(key, trigger, payload, actor="demo")
        event = result.trigger + (f" {payload}" if payload else "")
        if result.fired:
            table.add_row(key, event, result.source, result.dest or "", "[green]fired[/]")
        else:
            table.add_row(key, event, result.source, "",
                          f"[yellow]refused[/]: {result.reason}")
    out.print(table)

    history = Table("seq", "what", "from", "to", "version", "guards",
                    title=f"journal of batch_job:{held}", title_justify="left")
    for e in engine.history(f"batch_job:{held}"):
        verdicts = ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in (e.guards or {}).items())
        history.add_row(str(e.seq), e.trigger or ("(eventless)" if e.kind == "transition"
                                                  else e.kind),
                        e.source or "", e.dest, str(e.version), verdicts)
    out.print(history)
    mismatches = engine.verify()
    if mismatches:
        for m in mismatches:
            out.print(f"[red]mismatch[/] {m}")
    else:
        total = sum(sum(c.values()) for c in engine.counts().values())
        out.print(f"verify: all {total} resources in the database replay from their journals")
    out.print(f"\ndone in {time.perf_counter() - started:.2f} s. Look further with:")
    out.print(f"  lifecycle history batch_job:{ok}     the journal of one resource")
    out.print(f"  lifecycle show {ok}                  its state, data and next triggers")
    out.print("  lifecycle describe batch_job        the machine's states and transitions")
    out.print("  lifecycle list batch_job            every resource of the machine")
