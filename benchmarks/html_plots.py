"""What the HTML report's plots cost: page size, time to write it, and Chromium's time to lay it
out, for an 8-GPU 10-minute sustained load sampled at 10 Hz (48,000 telemetry rows), with
gpuvet's own SVG charts and, for comparison, the same series drawn by uPlot (a vendored
JavaScript chart library, https://github.com/leeoniya/uPlot, MIT) when its file is given.

The record is SYNTHETIC: the real 8x H100 record with its synthetic 90 s load (tests/fixtures/
records/h100-8x-synthetic-sustained.json) repeated to 600 s. Chromium's time is read inside the
page (performance.now() after the first frame is painted), so its start-up is not counted.

    .venv/bin/python benchmarks/html_plots.py [--uplot path/to/uPlot.iife.min.js] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpuvet.record import RunRecord  # noqa: E402
from gpuvet.report import charts  # noqa: E402
from gpuvet.report.html import render_html  # noqa: E402

SOAK_S, HZ = 600, 10
TIMER = ("<script>requestAnimationFrame(() => setTimeout(() => "
         "{ document.body.setAttribute('data-ms', performance.now().toFixed(0)); }, 0));</script>")


def soak_record() -> RunRecord:
    source = ROOT / "tests" / "fixtures" / "records" / "h100-8x-synthetic-sustained.json"
    record = RunRecord.from_dict(json.loads(source.read_text()))
    for series in record.series:
        rows = series["rows"]
        series["rows"] = [[round(i / HZ, 2)] + rows[i % len(rows)][1:] for i in range(SOAK_S * HZ)]
    return record


def uplot_page(record: RunRecord, library: str) -> str:
    """The same four charts drawn by uPlot from the thinned series (data as JSON in the page)."""
    blocks = []
    for n, column in enumerate(("power_w", "sm_mhz", "temp_c")):
        series = [s for s in record.series if s["name"] == "sustained.telemetry"]
        t, _ = charts.thin([r[0] for r in series[0]["rows"]], [r[0] for r in series[0]["rows"]])
        data = [t] + [charts.thin([r[0] for r in s["rows"]], [r[s["columns"].index(column)] for r in s["rows"]])[1][:len(t)]
                      for s in series]
        opts = {"title": column, "width": 1000, "height": 300,
                "series": [{}] + [{"label": s["subject"], "stroke": charts.COLOURS[i]} for i, s in enumerate(series)]}
        blocks.append(f"<div id='u{n}'></div><script>new uPlot({json.dumps(opts)}, {json.dumps(data)}, "
                      f"document.getElementById('u{n}'));</script>")
    return f"<!doctype html><html><head><meta charset='utf-8'><script>{library}</script></head><body>{''.join(blocks)}</body></html>"


def chromium_ms(browser: str, page: str, work: Path, repeat: int) -> float:
    path = work / "page.html"
    path.write_text(page.replace("</body>", TIMER + "</body>"), encoding="utf-8")
    times = []
    for i in range(repeat):
        dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={work / f'p{i}'}",
                              "--window-size=1280,4000", "--virtual-time-budget=5000", "--dump-dom", path.as_uri()],
                             capture_output=True, text=True, timeout=120)
        found = re.search(r'data-ms="(\d+)"', dom.stdout)
        if found:
            times.append(float(found.group(1)))
    return statistics.median(times) if times else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uplot", help="uPlot.iife.min.js (npm pack uplot) to compare with")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    record = soak_record()
    start = time.perf_counter()
    page = render_html(record)
    write_s = time.perf_counter() - start
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    print(f"8 GPUs x {SOAK_S} s at {HZ} Hz: gpuvet SVG page {len(page.encode()) / 1e6:.2f} MB, written in {write_s:.2f} s")
    with tempfile.TemporaryDirectory() as work:
        if browser:
            print(f"  Chromium: first frame after {chromium_ms(browser, page, Path(work), args.repeat):.0f} ms (median)")
        if args.uplot:
            library = Path(args.uplot).read_text()
            other = uplot_page(record, library)
            print(f"uPlot page (3 of the 4 charts, no report text): {len(other.encode()) / 1e6:.2f} MB "
                  f"(library {len(library.encode()) / 1e3:.0f} KB)")
            if browser:
                print(f"  Chromium: first frame after {chromium_ms(browser, other, Path(work), args.repeat):.0f} ms (median)")


if __name__ == "__main__":
    main()
