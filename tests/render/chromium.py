"""Render Mermaid diagrams with the official ``mermaid`` library in headless Chromium.

One Chromium process serves every diagram: it is driven over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: commands on fd 3, answers on fd 4, each a JSON text ended by a
NUL byte), so nothing but the standard library is needed on the Python side and no port is
opened. The ``mermaid`` package comes from the npm registry, installed once into a cache
directory outside the repository (``$LIFECYCLE_MERMAID_DIR``, by default
``~/.cache/lifecycle/mermaid-VERSION``).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MERMAID_VERSION = "12.3.0"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--hide-scrollbars", "--mute-audio",
]


class Unavailable(Exception):
    """A renderer this module needs is not installed (the message says which and how)."""


class RenderError(Exception):
    """Mermaid refused a diagram: a parse error, or a render that threw."""


def chromium_executable() -> str:
    for name in filter(None, (os.environ.get("LIFECYCLE_CHROMIUM"), "chromium",
                              "chromium-browser", "google-chrome")):
        found = shutil.which(name)
        if found:
            return found
    raise Unavailable("Chromium is not installed: `apt-get install chromium` (or set "
                      "LIFECYCLE_CHROMIUM to a Chromium or Chrome executable)")


def mermaid_js() -> Path:
    """``mermaid.min.js``, installed with npm on first use."""
    # the tests' conftest.py points XDG_CACHE_HOME at a directory of the session's own and
    # keeps the user's in LIFECYCLE_USER_CACHE ("" when it was unset)
    user_cache = os.environ.get("LIFECYCLE_USER_CACHE", os.environ.get("XDG_CACHE_HOME"))
    default = Path(user_cache or Path.home() / ".cache") / "lifecycle"
    base = Path(os.environ.get("LIFECYCLE_MERMAID_DIR") or default / f"mermaid-{MERMAID_VERSION}")
    script = base / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
    if script.exists():
        return script
    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable("npm is not installed, so the mermaid package cannot be: "
                          "`apt-get install npm` (or install Node.js)")
    base.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{base.name}-", dir=base.parent))
    try:
        done = subprocess.run(
            [npm, "install", "--prefix", str(staging), "--no-save", "--no-audit", "--no-fund",
             "--ignore-scripts", "--loglevel=error", f"mermaid@{MERMAID_VERSION}"],
            capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            raise Unavailable(f"npm install mermaid@{MERMAID_VERSION} failed: "
                              f"{done.stderr.strip()[-2000:]}")
        try:
            staging.rename(base)
        except OSError:  # installed meanwhile by another run
            if not script.exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return script


class Chromium:
    """A headless Chromium with a fresh profile, driven over a DevTools pipe."""

    def __init__(self, executable: str | None = None, *, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="lifecycle-chromium-")
        commands_read, commands_write = os.pipe()
        answers_read, answers_write = os.pipe()
        # the child sees them as fds 3 and 4; bash moves them there (sh cannot from fd >= 10)
        child_read = fcntl.fcntl(commands_read, fcntl.F_DUPFD_CLOEXEC, 10)
        child_write = fcntl.fcntl(answers_write, fcntl.F_DUPFD_CLOEXEC, 10)
        for fd in (commands_read, answers_write):
            os.close(fd)
        move = f'exec "$0" "$@" 3<&{child_read} 4>&{child_write} {child_read}<&- {child_write}>&-'
        argv = [executable or chromium_executable(), *FLAGS, f"--user-data-dir={self.profile}",
                "--remote-debugging-pipe", "about:blank"]
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - open while Chromium runs
        self.process = subprocess.Popen(
            ["bash", "-c", move, *argv], pass_fds=(child_read, child_write),
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        os.close(child_read)
        os.close(child_write)
        self._out = commands_write
        self._in = answers_read
        self._buffer = b""
        self._next_id = 0

    def call(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method,
                                   "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        try:
            os.write(self._out, json.dumps(message).encode() + b"\0")
        except BrokenPipeError:
            raise RuntimeError(f"Chromium exited: {self.output()}") from None
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._read(deadline, method)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return dict(answer.get("result", {}))

    def _read(self, deadline: float, method: str) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise TimeoutError(f"Chromium did not answer {method} in {self.timeout:g} s")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium exited: {self.output()}")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return dict(json.loads(raw))

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:]

    def close(self) -> None:
        try:
            if self.process.poll() is None:
                self.call("Browser.close")
                self.process.wait(timeout=10)
        except Exception:
            self.process.kill()
            self.process.wait(timeout=10)
        finally:
            for fd in (self._out, self._in):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.log.close()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Rendered:
    """What Mermaid drew, read back from the page."""

    svg: str
    width: float
    height: float
    states: list[str]
    """The text of every state box (name and description lines)."""
    clusters: list[str]
    edges: list[dict[str, str]] = field(default_factory=list)
    """Every transition arrow: ``id``, ``label``, computed ``stroke`` and ``dash``."""


_RENDER = """
async (text, id) => {
  const out = document.getElementById('out');
  out.innerHTML = '';
  let result;
  try { result = await mermaid.render(id, text); }  // which parses it first
  catch (e) {  // told apart only on failure: parsing costs startd's diagram half a second
    try { await mermaid.parse(text); }
    catch (p) { return {error: 'parse error: ' + (p && p.message || p)}; }
    return {error: 'render error: ' + (e && e.message || e)};
  }
  out.innerHTML = result.svg;
  const svg = out.querySelector('svg');
  const box = svg.getBoundingClientRect();
  const labels = {};
  for (const l of svg.querySelectorAll('.edgeLabel .label[data-id]'))
    labels[l.dataset.id] = l.textContent.trim();
  const edges = [...svg.querySelectorAll('path.transition[data-id]')]
    .filter(p => !p.classList.contains('note-edge'))
    .map(p => { const s = getComputedStyle(p);
      return {id: p.dataset.id, label: labels[p.dataset.id] || '', stroke: s.stroke,
              dash: s.strokeDasharray}; });
  const states = [...svg.querySelectorAll('g.node.statediagram-state')]
    .map(n => n.textContent.trim());
  const clusters = [...svg.querySelectorAll('g.statediagram-cluster')]
    .map(c => (c.querySelector('.cluster-label') || c).textContent.trim());
  return {svg: result.svg, width: box.width, height: box.height, edges, states, clusters};
}
"""


class MermaidPage:
    """A page with Mermaid loaded; renders one diagram at a time and takes screenshots."""

    def __init__(self, browser: Chromium, script: Path) -> None:
        self.browser = browser
        self.folder = Path(tempfile.mkdtemp(prefix="lifecycle-mermaid-"))
        page = self.folder / "page.html"
        page.write_text(
            '<!doctype html><html><head><meta charset="utf-8">'
            "<style>body{margin:0;background:#fff} #out{display:inline-block;padding:16px}"
            f'</style><script src="{script.resolve().as_uri()}"></script></head>'
            '<body><div id="out"></div></body></html>', encoding="utf-8")
        target = browser.call("Target.createTarget", {"url": "about:blank"})
        self.session = browser.call("Target.attachToTarget", {
            "targetId": target["targetId"], "flatten": True})["sessionId"]
        self._call("Page.enable")
        self._call("Emulation.setDeviceMetricsOverride", {
            "width": 1600, "height": 1000, "deviceScaleFactor": 1, "mobile": False})
        self._call("Page.navigate", {"url": page.as_uri()})
        self._wait_for("typeof mermaid !== 'undefined'")
        self._evaluate("mermaid.initialize({startOnLoad: false, suppressErrorRendering: true, "
                       "securityLevel: 'strict', state: {useMaxWidth: false}})")
        self._count = 0

    def _call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.call(method, params, self.session)

    def _evaluate(self, expression: str) -> Any:
        result = self._call("Runtime.evaluate", {
            "expression": expression, "awaitPromise": True, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"in the page: {result['exceptionDetails']}")
        return result["result"].get("value")

    def _wait_for(self, condition: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self._evaluate(condition):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page never met {condition!r}")
            time.sleep(0.05)

    def render(self, text: str) -> Rendered:
        self._count += 1
        value = self._evaluate(f"({_RENDER})({json.dumps(text)}, 'diagram{self._count}')")
        if "error" in value:
            raise RenderError(value["error"])
        return Rendered(svg=value["svg"], width=value["width"], height=value["height"],
                        states=value["states"], clusters=value["clusters"],
                        edges=value["edges"])

    def screenshot(self, rendered: Rendered, path: Path, scale: float = 1.0) -> bytes:
        """A PNG of the diagram on the page now, at ``scale`` device pixels per CSS pixel.

        The viewport is made the diagram's size, so the capture needs nothing beyond it. At
        scale 1 the text is drawn at its own size; at 2 the largest built-in machine (startd,
        about 5,900 by 6,300 CSS pixels) becomes 150 megapixels, which cost Chromium seconds
        to raster and compress for no more proof. The PNG is compressed for speed (the same
        pixels in a larger file: a fifth less of the capture's CPU).
        """
        width, height = int(rendered.width) + 32, int(rendered.height) + 32
        self._call("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": scale, "mobile": False})
        data = base64.b64decode(self._call("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": False, "optimizeForSpeed": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}})["data"])
        path.write_bytes(data)
        return data

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
