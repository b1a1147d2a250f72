"""The dashboard in a real headless browser (Debian's ``chromium`` driven by Selenium through the system
``chromedriver``; nothing is downloaded): sign in, see the jobs, open the stopped job and find its curve with the
stop marked, fail to open another tenant's job, sign out.

Skipped, saying why, where the browser, its driver or Selenium cannot be had (``tests/run.sh`` installs them when it
runs as root on Debian). With ``EVALSTOP_SCREENSHOTS=DIR`` set, the pages' screenshots are written to
``DIR/dashboard-*.png`` (``docs/img`` holds the ones the docs show).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from dashboard_support import OTHER_TENANTS_JOB, RUNNING_JOB, STOPPED_JOB, Scenario, dashboard_scenario

REPO = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _browser() -> tuple[str, str]:
    browser = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.skip(
            "no headless browser: needs Debian's chromium and chromium-driver (apt-get install chromium "
            "chromium-driver; tests/run.sh does it as root)"
        )
    return browser, driver


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Any]:
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install 'evalstop[test]')")
    browser, chromedriver = _browser()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
    ):
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    service = webdriver.ChromeService(executable_path=chromedriver)
    drv = webdriver.Chrome(options=options, service=service)
    drv.set_page_load_timeout(60)
    try:
        yield drv
    finally:
        drv.quit()


def _screenshot(drv: Any, name: str) -> None:
    folder = os.environ.get("EVALSTOP_SCREENSHOTS")
    if not folder:
        return
    out = Path(folder) if Path(folder).is_absolute() else REPO / folder
    out.mkdir(parents=True, exist_ok=True)
    # The whole page: as tall as its content, so that the screenshot shows everything.
    height, frame = drv.execute_script(
        "return [document.documentElement.scrollHeight, window.outerHeight - window.innerHeight]"
    )
    drv.set_window_size(1280, max(700, min(int(height), 2400)) + int(frame))
    drv.save_screenshot(str(out / f"dashboard-{name}.png"))
    drv.set_window_size(1280, 1000)


def _at(drv: Any, url: str) -> None:
    """Wait until the browser has loaded ``url`` (a click returns before the navigation it starts)."""
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    try:
        WebDriverWait(drv, 20).until(expected_conditions.url_to_be(url))
    except Exception:
        raise AssertionError(f"expected {url}, at {drv.current_url}: {drv.page_source[:2000]}") from None


def test_sign_in_browse_a_stopped_job_and_sign_out(driver: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    with dashboard_scenario(tmp_path) as sc:
        _walk(driver, sc, By)


def _walk(drv: Any, sc: Scenario, By: Any) -> None:
    base = sc.server.url
    drv.get(base + "/")
    assert drv.current_url == base + "/login"  # not signed in: sent to the sign-in form
    _screenshot(drv, "login")
    drv.find_element(By.ID, "token").send_keys(sc.alpha)
    drv.find_element(By.ID, "sign-in").click()
    _at(drv, base + "/")
    assert sc.alpha not in drv.current_url
    # The inline stylesheet was applied under the page's CSP (a blocked style would leave the header unstyled).
    header_bg = drv.find_element(By.TAG_NAME, "header").value_of_css_property("background-color")
    assert header_bg in ("rgba(29, 36, 51, 1)", "rgb(29, 36, 51)"), header_bg
    rows = drv.find_elements(By.CSS_SELECTOR, "table#jobs tbody tr")
    shown = {row.get_attribute("data-job") for row in rows}
    assert shown == {STOPPED_JOB, RUNNING_JOB, "dpo-finished"}
    assert OTHER_TENANTS_JOB not in drv.page_source
    _screenshot(drv, "jobs")

    # Sort by reports, most first, by clicking the column header.
    drv.find_element(By.CSS_SELECTOR, 'th a[data-sort="reports"]').click()
    _at(drv, base + "/?sort=reports&order=desc")
    order = [row.get_attribute("data-job") for row in drv.find_elements(By.CSS_SELECTOR, "table#jobs tbody tr")]
    assert order[0] == STOPPED_JOB

    drv.find_element(By.LINK_TEXT, STOPPED_JOB).click()
    _at(drv, base + "/jobs/" + quote(STOPPED_JOB, safe=""))
    assert drv.find_element(By.ID, "job-id").text == STOPPED_JOB
    curve = drv.find_element(By.CSS_SELECTOR, "svg.curve")
    assert curve.is_displayed() and curve.size["width"] > 600
    points = curve.find_element(By.CSS_SELECTOR, "polyline.line").get_attribute("points")
    assert points is not None and len(points.split()) == sc.stop_step // 10
    stop = curve.find_element(By.CSS_SELECTOR, "g.stop-marker")
    assert stop.get_attribute("data-step") == str(sc.stop_step)
    assert stop.find_element(By.TAG_NAME, "text").text == f"stop at step {sc.stop_step}"
    best = curve.find_element(By.CSS_SELECTOR, "g.best-marker")
    assert best.get_attribute("data-step") == str(sc.best_step)
    _screenshot(drv, "job")

    drv.get(f"{base}/jobs/{OTHER_TENANTS_JOB}")  # another tenant's job: the same 404 as a job that does not exist
    assert drv.find_element(By.ID, "error").text == "404"
    assert "No job" in drv.find_element(By.TAG_NAME, "main").text

    drv.find_element(By.ID, "sign-out").click()
    _at(drv, base + "/login")
    drv.get(base + "/")
    assert drv.current_url == base + "/login"
    assert drv.get_cookie("evalstop_session") is None
