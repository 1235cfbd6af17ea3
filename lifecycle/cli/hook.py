"""``lifecycle hook``: programs HTCondor runs as hooks. ``prepare-job`` is a drone's own
last word: its startd's starter runs it before a payload starts (``HOOK_PREPARE_JOB``), and it
asks ``lifecycle serve`` whether lifecycle is about to remove this drone (docs/tardis.md)."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import click

DRONE_VARIABLE = "TardisDroneUuid"
"""The drone's name, in its job's environment (TARDIS's site adapters put it there)."""


@click.group()
def hook() -> None:
    """Programs HTCondor runs as hooks: `prepare-job` for a drone's startd."""


@hook.command("prepare-job")
@click.option("--url", required=True, metavar="URL",
              help="Where `lifecycle serve` answers (http://host:port).")
@click.option("--drone", "key", envvar=DRONE_VARIABLE, required=True, metavar="KEY",
              help=f"The drone's key. Default: ${DRONE_VARIABLE}.")
@click.option("--machine", default="drone", show_default=True,
              help="The drone's machine.")
@click.option("--wait", type=click.FloatRange(min=0), default=120.0, show_default=True,
              metavar="SECONDS", help="How long a drone on its way up may make the job wait.")
@click.option("--every", type=click.FloatRange(min=0.01), default=5.0, show_default=True,
              metavar="SECONDS", help="How often to ask again meanwhile.")
@click.option("--timeout", type=click.FloatRange(min=0.01), default=5.0, show_default=True,
              metavar="SECONDS", help="How long one question may take.")
@click.option("--if-unreachable", type=click.Choice(["refuse", "allow"]), default="refuse",
              show_default=True,
              help="What to do when lifecycle serve gives no answer within --wait.")
def prepare_job(url: str, key: str, machine: str, wait: float, every: float, timeout: float,
                if_unreachable: str) -> None:
    """HTCondor's HOOK_PREPARE_JOB for a drone's startd: exit 0 (the payload may start) once
    lifecycle says the drone is integrated; ask again every --every seconds while it is on
    its way up, for at most --wait seconds; exit 1 (the starter does not run the payload)
    when the drone is being removed or is gone, or is still not integrated at the end."""
    sys.stdin.read()   # the job's ClassAd, which the starter writes: read, so it never blocks
    asking = (f"{url.rstrip('/')}/machines/{urllib.parse.quote(machine, safe='')}/payload?"
              + urllib.parse.urlencode({"key": key}))
    deadline = time.monotonic() + wait
    while True:
        answer, trouble = _ask(asking, timeout)
        left = deadline - time.monotonic()
        if answer is not None and answer.get("verdict") in ("yes", "no"):
            _say(f"drone {key}: {answer.get('reason')}")
            sys.exit(0 if answer["verdict"] == "yes" else 1)
        said = trouble if answer is None else f"drone {key}: {answer.get('reason')}"
        if left <= 0:
            if answer is None and if_unreachable == "allow":
                _say(f"{said}; allowed (--if-unreachable allow)")
                sys.exit(0)
            _say(f"{said}; refused after {wait:g} s")
            sys.exit(1)
        _say(f"{said}; asking again in {min(every, left):.3g} s")
        time.sleep(min(every, left))


def _ask(url: str, timeout: float) -> tuple[dict[str, Any] | None, str]:
    """lifecycle serve's answer, or None and why there is none."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read()), ""
    except urllib.error.HTTPError as exc:
        try:
            said = json.loads(exc.read()).get("error", "")
        except ValueError:
            said = ""
        return None, f"lifecycle serve answered {exc.code} {said}".rstrip()
    except (OSError, ValueError) as exc:   # refused, timed out, not JSON
        return None, f"no answer from {url} within {timeout:g} s: {exc}"


def _say(message: str) -> None:
    print(f"lifecycle hook prepare-job ({os.getpid()}): {message}", file=sys.stderr,
          flush=True)
