"""The HTML report in a real headless browser (Chromium, driven by Selenium): its script
runs under the report's own Content-Security-Policy, the charts render, a click on an
evidence link scrolls to the highlighted row, the search box filters a table, a header
click sorts it, a kernel named with <script> in it stays text, and nothing is fetched.

Skips with the reason where Selenium, Chromium or its driver is missing (CI installs
Debian's chromium and chromium-driver: see .ci/run).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest
from report_samples import NASTY, sample_report

from advisor.reports import render_html

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")

# How long a page may take to load, or a condition to come true, before the test gives up:
# only against a browser that hangs, never short enough for a busy machine to fail it (a
# condition that holds is seen within 50 ms whatever this is).
HANG_GUARD_S = 120.0

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
DRIVERS = ("chromedriver", "/usr/lib/chromium/chromedriver")


def _find(names) -> str | None:
    for name in names:
        path = shutil.which(name) or (name if Path(name).is_file() else None)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    binary, driver_path = _find(BROWSERS), _find(DRIVERS)
    if binary is None:
        pytest.skip("no Chromium installed (apt-get install chromium chromium-driver)")
    if driver_path is None:
        pytest.skip("Chromium is installed but its driver is not (apt-get install chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    profile = tempfile.mkdtemp(prefix="advisor-chromium-")
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                     "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
                     f"--user-data-dir={profile}", "--window-size=1400,1000"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(options=options, service=Service(driver_path))
    except Exception as exc:  # selenium raises several types for a browser that will not start
        shutil.rmtree(profile, ignore_errors=True)
        pytest.skip(f"Chromium did not start: {str(exc).splitlines()[0]}")
    driver.set_page_load_timeout(HANG_GUARD_S)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def opened(browser, tmp_path_factory):
    path = tmp_path_factory.mktemp("html") / "report.html"
    path.write_text(render_html(sample_report()), encoding="utf-8")
    browser.get(path.as_uri())
    _wait(lambda: browser.execute_script("return document.documentElement.getAttribute('data-ready')") == "1",
          "the report's script never ran (blocked by its policy?)")
    return browser


def _wait(condition, message: str, timeout: float = HANG_GUARD_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(message)


def _in_view(driver, element) -> bool:
    return driver.execute_script(
        "var r = arguments[0].getBoundingClientRect();"
        "return r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight;", element)


def test_the_script_runs_and_the_page_reports_no_errors(opened):
    errors = [e for e in opened.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


def test_charts_render(opened):
    sizes = opened.execute_script(
        "return Array.from(document.querySelectorAll('svg.chart')).map(function (s) {"
        "  var r = s.getBoundingClientRect(); return [r.width, r.height]; });")
    assert len(sizes) == 5
    assert all(w > 300 and h > 40 for w, h in sizes), sizes
    drawn = opened.execute_script(
        "return Array.from(document.querySelectorAll('#chart-steps rect.s-dataloader'))"
        ".map(function (r) { return r.getBBox().height; });")
    assert len(drawn) == 3 and all(h > 10 for h in drawn)
    assert opened.execute_script("return document.querySelectorAll('#chart-roofline circle').length") == 1


def test_an_evidence_link_scrolls_to_its_highlighted_row(opened):
    opened.execute_script("window.scrollTo(0, 0)")
    link = opened.find_element("css selector", "a.ev[href^='#tbl-kernel-']")
    target = opened.find_element("id", link.get_attribute("href").split("#")[1])
    assert not _in_view(opened, target)
    link.click()
    _wait(lambda: _in_view(opened, target), "the cited row was not scrolled into view")
    assert "hl" in target.get_attribute("class").split()
    cells = target.find_elements("css selector", "td.hl-cell")
    assert len(cells) == 1 and cells[0].text == "36.0 ms"
    assert opened.execute_script("return location.hash") == "#" + target.get_attribute("id")


def test_evidence_opens_a_folded_table(opened):
    opened.execute_script("window.scrollTo(0, 0)")
    folded = opened.find_element("id", "tbl-operator_kernels")
    opened.execute_script("arguments[0].open = false", folded)
    link = opened.find_element("css selector", "a.ev[href^='#tbl-operator_kernels-']")
    link.click()
    target = opened.find_element("id", link.get_attribute("href").split("#")[1])
    _wait(lambda: _in_view(opened, target), "the row of a folded table was not shown")
    assert folded.get_attribute("open") is not None


def test_the_search_box_filters_a_table(opened):
    search = opened.find_element("css selector", "input.search[data-table='tbl-model-data']")
    opened.execute_script("arguments[0].scrollIntoView({block: 'center'})", search)
    search.clear()
    search.send_keys("dataloader")
    rows = opened.find_elements("css selector", "#tbl-model-data tbody tr")
    shown = [r for r in rows if r.is_displayed()]
    assert [r.find_element("css selector", "td").text for r in shown] == ["Dataloader"]
    assert opened.find_element("id", "tbl-model-data-shown").text == "1 of 6 rows"
    search.clear()
    search.send_keys(" ")  # clearing fires no input event; a blank query shows all again
    assert len([r for r in rows if r.is_displayed()]) == 6


COLUMN_VALUES = (
    "var th = document.querySelector('#tbl-model-data th[data-col=\"cpu_total_ns\"]');"
    "return Array.from(document.querySelectorAll('#tbl-model-data tbody tr'))"
    ".map(function (r) { return Number(r.cells[th.cellIndex].getAttribute('data-v')); });"
)


def test_a_header_click_sorts_by_the_numbers(opened):
    header = opened.find_element("css selector", "#tbl-model-data th[data-col='cpu_total_ns'] button")
    opened.execute_script("arguments[0].scrollIntoView({block: 'center'})", header)
    before = opened.execute_script(COLUMN_VALUES)
    assert before != sorted(before, reverse=True)
    header.click()
    values = opened.execute_script(COLUMN_VALUES)
    assert values == sorted(before, reverse=True) and values[0] == 300_000_000
    header.click()
    assert opened.execute_script(COLUMN_VALUES) == sorted(before)


def test_a_kernel_named_with_script_is_only_text(opened):
    assert opened.execute_script("return typeof window.__pwned") == "undefined"
    assert opened.execute_script("return document.images.length") == 0
    keys = opened.execute_script(
        "return Array.from(document.querySelectorAll('#tbl-kernel-data td.key')).map(function (c) {"
        " return c.textContent; });")
    assert NASTY in keys


def test_nothing_is_fetched(opened):
    assert opened.execute_script("return performance.getEntriesByType('resource').length") == 0


def test_the_notebook_cell_shows_findings_and_charts_and_leaves_the_notebook_alone(browser, tmp_path):
    """advisor.diagnose(...)'s _repr_html_, set in a page as a notebook sets an output cell:
    the findings and charts show without any script, and the page's own styles stay."""
    from advisor.api.notebook import Diagnosis

    report = sample_report()
    cell = Diagnosis(report)._repr_html_()
    assert "<script" not in cell.lower()
    page = tmp_path / "notebook.html"
    page.write_text('<!DOCTYPE html><html><head><meta charset="utf-8"><style>body { background: rgb(1, 2, 3); }'
                    "h2 { color: rgb(4, 5, 6); }</style></head><body><h2 id='theirs'>A notebook heading</h2>"
                    f'<div class="output">{cell}</div></body></html>', encoding="utf-8")
    browser.get(page.as_uri())
    css = browser.execute_script
    assert css("return getComputedStyle(document.body).backgroundColor") == "rgb(1, 2, 3)"
    assert css("return getComputedStyle(document.getElementById('theirs')).color") == "rgb(4, 5, 6)"
    findings = css("return Array.from(document.querySelectorAll('.advisor-report .finding'))"
                   ".filter(e => e.offsetHeight > 0).length")
    assert findings == len(report.findings) + sum(len(f.explains) for f in report.findings)
    assert report.findings[0].title in css("return document.querySelector('.advisor-report').innerText")
    charts = css("return Array.from(document.querySelectorAll('.advisor-report svg'))"
                 ".filter(e => e.getBoundingClientRect().width > 100).length")
    assert charts >= 2
