"""The dashboard in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by Selenium; no browser is downloaded) on a database the drone
simulation filled. A person's path, from the machines to a machine's page to one drone's
history, with screenshots that must show something; the live page following a write; a
key holding markup shown as text, its script never run.

Skipped when Chromium or its driver is missing, unless LIFECYCLE_REQUIRE_BROWSER=1 (as
.ci/run sets), where that fails."""

from __future__ import annotations

import io
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hostile_inputs import TOGGLE
from PIL import Image

from lifecycle import Engine, Store
from lifecycle.dashboard.app import serve_in_thread as served
from lifecycle.sim import drone_race

REQUIRE_BROWSER = os.environ.get("LIFECYCLE_REQUIRE_BROWSER") == "1"
CHROMIUM = os.environ.get("LIFECYCLE_CHROMIUM") or shutil.which("chromium") or \
    "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,1000"]
WAIT_SECONDS = 60
HOSTILE_KEY = "<img src=x onerror=\"document.title='pwned'\">&lt;b&gt;"


def _missing() -> str | None:
    for what, path in (("chromium", CHROMIUM), ("chromium-driver", DRIVER)):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{what} is not installed ({path}): apt-get install chromium chromium-driver"
    return None


@pytest.fixture(scope="module")
def drones(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite file with both drone machines' resources from a short drone race, and a
    toggle whose key holds markup."""
    path = tmp_path_factory.mktemp("browser") / "drones.db"
    url = f"sqlite:///{path}"
    with Store(url, upgrade=True) as store:
        drone_race.simulate(seed=1, store=store, drones=8, hours=0.5)
        Engine(store, [TOGGLE]).create("toggle", HOSTILE_KEY, {"ad": "<script>x()</script>"})
    return url


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Chromium and its driver for the module's tests (each start costs a second)."""
    problem = _missing()
    if problem:
        if REQUIRE_BROWSER:
            pytest.fail(f"LIFECYCLE_REQUIRE_BROWSER=1 but {problem}")
        pytest.skip(problem)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tmp_path_factory.mktemp("chromium") / "profile"
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))
    driver.set_page_load_timeout(WAIT_SECONDS)
    driver.first_size = driver.get_window_size()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """The module's browser on a blank page at its first size, as a test found it fresh
    (each test serves the dashboard on a port of its own: an origin no test saw before)."""
    chromium.get("about:blank")
    chromium.set_window_size(chromium.first_size["width"], chromium.first_size["height"])
    yield chromium
    chromium.get("about:blank")


def _shot(driver: Any, path: Path) -> None:
    """A screenshot, saved, that is not blank: many colours, and no one colour nearly
    everywhere."""
    png = driver.get_screenshot_as_png()
    path.write_bytes(png)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    width, height = image.size
    assert width >= 800 and height >= 600, image.size
    colours = image.getcolors(maxcolors=width * height)
    assert colours is not None
    commonest = max(count for count, _ in colours)
    assert len(colours) >= 16, f"{path.name}: {len(colours)} colours: blank?"
    assert commonest < 0.97 * width * height, f"{path.name}: one colour nearly everywhere"


def _wait(driver: Any, condition: Any) -> Any:
    """``condition``'s first true value, asked until it has one; an element it read that the
    page replaced meanwhile (the live page re-renders ``#rows`` every 2 s) is asked again."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_SECONDS, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException,)).until(condition)


def _text(driver: Any, element_id: str) -> str:
    """The text of the element with ``element_id`` as the page shows it now, found again if
    the page replaced it between the finding and the reading."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(100):
        try:
            return str(driver.find_element(By.ID, element_id).text)
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"#{element_id} was replaced each of 100 times it was read")


def test_a_drone_followed_from_the_machines_to_its_history(drones: str, browser: Any,
                                                          tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    with served(drones) as base:
        browser.get(base + "/")
        names = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "section.machine h2 a")]
        assert {"drone", "drone_tardis", "toggle"} <= set(names)
        _shot(browser, tmp_path / "machines.png")
        browser.find_element(By.LINK_TEXT, "drone").click()
        _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#resources a.resource"))
        assert browser.find_element(By.TAG_NAME, "h1").text.startswith("drone")
        _shot(browser, tmp_path / "machine.png")
        link = browser.find_elements(By.CSS_SELECTOR, "#resources a.resource")[0]
        key = link.text
        link.click()
        _wait(browser, lambda d: d.find_elements(By.ID, "history"))
        assert browser.find_element(By.ID, "key").text == key
        rows = browser.find_elements(By.CSS_SELECTOR, "#history tr")
        assert len(rows) > 2  # the header, the creation, and what came after
        assert "create" in rows[1].text
        _shot(browser, tmp_path / "resource.png")


def _fenced_drone(url: str) -> str:
    """A drone whose removal rested on a fresh status and gave its terminate a fence."""
    with Store(url) as store:
        engine = Engine(store)
        for resource in engine.resources("drone"):
            if any(e.fence for e in engine.history(f"drone:{resource.key}")):
                return resource.key
    raise AssertionError("the race removed no drone on a fence")


def test_a_drones_history_tells_its_fence_and_breaks_no_word(drones: str, browser: Any,
                                                             tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    key = _fenced_drone(drones)
    with served(drones) as base:
        browser.get(f"{base}/machines/drone/resource?key={key}")
        _wait(browser, lambda d: d.find_elements(By.ID, "history"))
        text = browser.find_element(By.ID, "history").text
        assert "fence: its effects expect" in text
        assert re.search(r"effect terminate: done .*\n\s*acted=(true|false)", text), text
        _shot(browser, tmp_path / "fenced.png")
        # a name is never broken inside the word: each span of a heading is one line box
        # wherever the window is narrow (the journal's trigger column once read "(eventle ss)")
        browser.set_window_size(700, 900)
        broken = browser.execute_script("""
            return Array.from(document.querySelectorAll('#history .heading span'))
                .filter(s => !/\\s/.test(s.textContent.trim()) && s.getClientRects().length > 1)
                .map(s => s.textContent);""")
        assert broken == []


def test_a_machines_diagram_is_drawn_to_read_and_zooms(drones: str, browser: Any,
                                                       tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    with served(drones) as base:
        browser.get(base + "/machines/drone")
        _wait(browser, lambda d: d.execute_script(
            "var i = document.getElementById('diagram-image'); "
            "return i && i.complete && i.naturalWidth > 0"))
        natural, shown, view = browser.execute_script(
            "var i = document.getElementById('diagram-image'); "
            "return [i.naturalWidth, i.getBoundingClientRect().width, "
            "document.getElementById('diagram-view').clientWidth]")
        assert natural > view  # the drone's machine is wider than the window ...
        assert shown == natural  # ... and is drawn at its own size, to scroll
        browser.find_element(By.ID, "zoom-fit").click()
        assert browser.execute_script(
            "return document.getElementById('diagram-image').getBoundingClientRect().width"
        ) <= view
        assert browser.find_element(By.ID, "zoom-level").text.endswith("%")
        _shot(browser, tmp_path / "diagram.png")
        browser.find_element(By.ID, "diagram-image").click()  # to read it where clicked
        assert browser.find_element(By.ID, "zoom-level").text == "actual size"
        assert browser.execute_script(
            "return document.getElementById('diagram-image').getBoundingClientRect().width"
        ) == natural


def test_the_live_page_follows_writes_without_a_reload(drones: str, browser: Any,
                                                      tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # the page asks every LIVE_POLL_MS (2 s); a tenth of it waits less for the same proof
    monkeypatch.setattr("lifecycle.dashboard.app.LIVE_POLL_MS", 200)
    with served(drones) as base:
        browser.get(base + "/live")
        marker = browser.execute_script("window.sameDocument = 'yes'; return 1")
        assert marker == 1
        assert "toggle off 1" in _text(browser, "rows")
        with Store(drones) as store:
            Engine(store, [TOGGLE]).create("toggle", "live-1")
        _wait(browser, lambda d: "toggle off 2" in _text(d, "rows"))
        assert browser.execute_script("return window.sameDocument") == "yes"  # no reload
        _shot(browser, tmp_path / "live.png")


def test_a_key_with_markup_is_text_in_the_browser(drones: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    with served(drones) as base:
        browser.get(base + "/machines/toggle")
        link = browser.find_element(By.PARTIAL_LINK_TEXT, "<img")
        assert link.text == HOSTILE_KEY
        link.click()
        _wait(browser, lambda d: d.find_elements(By.ID, "key"))
        assert browser.find_element(By.ID, "key").text == HOSTILE_KEY
        assert "<script>x()</script>" in browser.find_element(By.ID, "data").text
        assert browser.find_elements(By.CSS_SELECTOR, "main img") == []
        assert browser.title == f"toggle:{HOSTILE_KEY} · lifecycle"  # the handler never ran
