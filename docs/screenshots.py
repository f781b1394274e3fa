"""Regenerate the screenshots of the HTML report shown in the README.

    python docs/screenshots.py [TRACE]

TRACE defaults to ../shared/traces/resnet50_v100_num_workers_0.pt.trace.json.gz. The report
is rendered as `advisor diagnose TRACE --format html` would, opened in headless Chromium
(Selenium) at 1400x2000, and four views are saved next to this script: the top of the
page (header and findings), the charts, the roofline and the row an evidence link jumps to.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from advisor.importers import load
from advisor.reports import build_report, render_html
from advisor.rules import run_rules
from advisor.tables import TABLE_DOCS, compute_tables

HERE = Path(__file__).resolve().parent
DEFAULT = HERE.parent.parent / "shared" / "traces" / "resnet50_v100_num_workers_0.pt.trace.json.gz"
SIZE = (1400, 2000)


def render(trace: Path, out: Path) -> None:
    # Read from the trace's folder so the report names the file, not this machine's path.
    here = Path.cwd()
    os.chdir(trace.parent)
    try:
        session = load(Path(trace.name))
    finally:
        os.chdir(here)
    tables = compute_tables(session)
    report = build_report(session, tables, run_rules(session, tables).findings, table_docs=TABLE_DOCS)
    out.write_text(render_html(report), encoding="utf-8")


def shoot(page: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("google-chrome") or "chromium"
    profile = tempfile.mkdtemp(prefix="advisor-shots-")
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                     "--disable-component-update", "--no-first-run", "--hide-scrollbars",
                     f"--user-data-dir={profile}", f"--window-size={SIZE[0]},{SIZE[1]}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver") or "chromedriver"))
    try:
        driver.get(page.as_uri())
        driver.execute_script("document.documentElement.style.scrollBehavior = 'auto'")
        driver.save_screenshot(str(HERE / "html-report-findings.png"))
        driver.execute_script("document.getElementById('charts').scrollIntoView({block: 'start'});"
                              "window.scrollBy(0, -50);")
        time.sleep(0.3)
        driver.save_screenshot(str(HERE / "html-report-charts.png"))
        driver.execute_script("document.getElementById('chart-roofline').scrollIntoView({block: 'start'});"
                              "window.scrollBy(0, -60);")
        time.sleep(0.3)
        driver.save_screenshot(str(HERE / "html-report-roofline.png"))
        driver.execute_script("window.scrollTo(0, 0)")
        driver.execute_script("document.querySelector('a.ev').click()")
        time.sleep(1.0)  # the smooth scroll
        driver.save_screenshot(str(HERE / "html-report-evidence.png"))
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def main() -> int:
    trace = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    if not trace.is_file():
        print(f"screenshots: no trace at {trace}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        page = Path(folder) / "report.html"
        render(trace.resolve(), page)
        shoot(page)
    for name in ("html-report-findings.png", "html-report-charts.png", "html-report-roofline.png",
                 "html-report-evidence.png"):
        print(f"{HERE / name}: {(HERE / name).stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
