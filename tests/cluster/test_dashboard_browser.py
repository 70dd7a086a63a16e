"""The dashboard in a real headless browser (Selenium, Debian's chromium + chromium-driver) while a job runs.

`CLASP_SCREENSHOTS=docs pytest tests/cluster/test_dashboard_browser.py` also saves the screenshots of the README
(docs/dashboard-cluster.png, docs/dashboard-job.png).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from clasp.apps import wc

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # the dev extra brings it
    webdriver = None

pytestmark = pytest.mark.skipif(
    webdriver is None or not CHROMIUM or not CHROMEDRIVER,
    reason="the dashboard's browser test needs Debian's chromium and chromium-driver packages "
           "(apt-get install -y chromium chromium-driver) and selenium (the dev extra)")


@pytest.fixture
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1700", "--hide-scrollbars"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def text(driver, css: str) -> str:
    """The element's text; the page re-renders parts every second, so an element found can be replaced
    before it is read: then it is looked up again."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(20):
        try:
            els = driver.find_elements(By.CSS_SELECTOR, css)
            return els[0].text if els else ""
        except StaleElementReferenceException:
            time.sleep(0.05)
    return ""


def number(driver, css: str) -> float | None:
    t = text(driver, css).split("\n")[-1].replace(",", "")
    try:
        return float(t)
    except ValueError:
        return None


def test_the_page_shows_a_running_job_and_a_forced_scale(cluster3, client3, browser):
    lines = wc.generate(20_000, 3)
    job = client3.submit(wc.build_dag(), placement={"split": {0: 1.0}, "count": {0: 1.0}}, autoscale=False)
    stop = threading.Event()

    def push():  # ≈ 4,000 lines/s, well under one worker's rate
        i = 0
        while not stop.is_set():
            job.push(lines[i:i + 400])
            i = (i + 400) % len(lines)
            time.sleep(0.1)

    pusher = threading.Thread(target=push, daemon=True)
    pusher.start()
    wait = WebDriverWait(browser, 30, poll_frequency=0.2)
    try:
        browser.get(cluster3.dashboard + f"#/job/{job.id}")
        wait.until(lambda d: (number(d, "#job-throughput") or 0) > 0)
        wait.until(lambda d: "split" in text(d, "#dag") and "count" in text(d, "#dag"))
        assert number(browser, "#job-workers") == 1
        first = (number(browser, "#job-throughput"), number(browser, "#job-completed"), text(browser, "#dag"))
        time.sleep(2.5)
        second = (number(browser, "#job-throughput"), number(browser, "#job-completed"), text(browser, "#dag"))
        assert second[1] > first[1], (first, second)  # the page updates itself
        assert second != first
        assert text(browser, "#live") in ("live (server-sent events)", "live (polling)")

        # The checkpoints panel (checkpoints are on: the planner's default interval) shows the count that
        # job.stats() reports. The page's figure is at most ~2 s old (a view a second, an update a second)
        # and checkpoints complete about once a second: it lies between job.stats() a few seconds before and
        # job.stats() just after, and within a few seconds it equals a count read at the same moment.
        wait.until(lambda d: (number(d, "#ckpt-completed") or 0) >= 1)
        before = job.stats()["checkpoints"]["completed"]
        time.sleep(3)
        shown = number(browser, "#ckpt-completed")
        after = job.stats()["checkpoints"]["completed"]
        assert before <= shown <= after, (before, shown, after)
        wait.until(lambda d: number(d, "#ckpt-completed") == job.stats()["checkpoints"]["completed"])
        assert number(browser, "#ckpt-failed") == 0
        headings = [h.get_attribute("textContent") for h in browser.find_elements(By.CSS_SELECTOR, "h1, h2, h3, title")]
        assert any(h.startswith("Checkpoints and recoveries") for h in headings), headings
        assert not [h for h in headings if re.search(r"issue|\b\d/8\b|branch", h, re.I)], headings
        assert "no checkpoints" not in text(browser, "#checkpoints")

        job.scale(2)
        wait.until(lambda d: "job.scale(2)" in text(d, "#decisions"))
        wait.until(lambda d: number(d, "#job-workers") == 2)
        wait.until(lambda d: "manual scale to 2 workers" in text(d, "#migrations"))
        # the placement matrix: the operator column and one per worker holding a share
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#matrix-table thead th")) == 3)
        out = os.environ.get("CLASP_SCREENSHOTS")
        if out:
            time.sleep(6)  # a few seconds of timeline after the scale
            Path(out).mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(str(Path(out) / "dashboard-job.png"))

        browser.get(cluster3.dashboard + "#/cluster")
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#workers tbody tr")) == 3)
        wait.until(lambda d: number(d, "#cluster-workers") == 3)
        assert "w0" in text(browser, "#workers") and "α" in text(browser, "#models")
        if out:
            time.sleep(1.5)
            browser.save_screenshot(str(Path(out) / "dashboard-cluster.png"))

        browser.get(cluster3.dashboard + f"?poll#/job/{job.id}")  # the polling fallback
        wait.until(lambda d: text(d, "#live") == "live (polling)")
        wait.until(lambda d: "job.scale(2)" in text(d, "#decisions"))
    finally:
        stop.set()
        pusher.join(10)
        job.cancel()


def test_the_dag_shows_each_time_operators_watermark_and_the_late_records(cluster3, client3, browser):
    """A window downstream of the push source: its node on the DAG carries the watermark released to it, which
    moves as events are pushed; a record pushed behind the watermark shows in the late-records card."""
    from tests.cluster.test_push_time import pushed_windows

    job = client3.submit(pushed_windows("dashboard-windows"), autoscale=False)
    wait = WebDriverWait(browser, 30, poll_frequency=0.2)

    def node_watermark(d) -> float | None:
        m = re.search(r"watermark ([\d,.]+)", text(d, "#dag"))
        return float(m.group(1).replace(",", "")) if m else None

    try:
        job.push([[f"k{i % 3}", i * 0.05] for i in range(200)])  # 0 .. 10 s: the watermark reaches 8.95
        browser.get(cluster3.dashboard + f"#/job/{job.id}")
        wait.until(lambda d: (node_watermark(d) or 0) >= 8)
        assert "counts.windows (keyed)" in text(browser, "#dag")
        job.push([[f"k{i % 3}", 10 + i * 0.05] for i in range(200)])  # .. 20 s
        wait.until(lambda d: (node_watermark(d) or 0) >= 18)
        job.push([["k0", 1.0]])  # its window fired long ago
        wait.until(lambda d: number(d, "#job-late") == 1)
        assert job.stats()["event_time"]["late"] == 1
    finally:
        job.cancel()
