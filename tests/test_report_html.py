"""The HTML report: one self-contained page, with plots, opened in a real headless browser.

The browser test needs Debian's chromium (`scripts/test` installs it). Without it the test fails
and says so; GPUVET_NO_BROWSER=1 turns that into a skip for machines that cannot have one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gpuvet.record import RunRecord
from gpuvet.report import charts
from gpuvet.report import html as html_report
from gpuvet.report.html import render_html

RECORDS = Path(__file__).parent / "fixtures" / "records"
SYNTHETIC = "h100-8x-synthetic-sustained"


def record(name: str) -> RunRecord:
    return RunRecord.from_dict(json.loads((RECORDS / f"{name}.json").read_text()))


class Page(HTMLParser):
    """What the tests look at in a page: tags, attributes, plot SVGs, the length of their lines'
    point lists, their texts and their hover tooltips."""

    def __init__(self, markup: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.plots: list[dict] = []  # {"paths": [points lengths], "texts": [...], "tips": [...]}
        self._text_into: list[str] | None = None
        self.feed(markup)

    def handle_starttag(self, tag, attrs):
        attributes = {k: v or "" for k, v in attrs}
        self.tags.append((tag, attributes))
        if tag == "svg" and "plot" in attributes.get("class", ""):
            self.plots.append({"paths": [], "texts": [], "tips": []})
        elif tag == "polyline" and self.plots:
            self.plots[-1]["paths"].append(len(attributes.get("points", "")))
        elif tag == "text" and self.plots:
            self._text_into = self.plots[-1]["texts"]
        elif tag == "rect" and "band" in attributes.get("class", "") and self.plots:
            self._text_into = self.plots[-1]["tips"]

    def handle_endtag(self, tag):
        if tag in ("text", "rect"):
            self._text_into = None

    def handle_data(self, data):
        if self._text_into is not None and data.strip():
            self._text_into.append(data.strip())


def test_the_page_refers_to_nothing_outside_itself():
    page = render_html(record(SYNTHETIC))
    parsed = Page(page)
    for tag, attributes in parsed.tags:
        assert tag not in ("script", "link", "img", "iframe", "object", "embed", "base"), tag
        for name, value in attributes.items():
            if name in ("href", "xlink:href", "src", "action", "srcset"):
                assert value.startswith("#"), (tag, name, value)
    assert not re.search(r"url\((?!#)", page) and "@import" not in page  # url(#clip) points inside the page
    assert not re.search(r"https?://", page)  # not even SVG namespace URLs


def test_plots_of_the_sustained_load_are_inline_svg_with_labels_per_gpu():
    page = render_html(record(SYNTHETIC))
    plots = {p.key: p for p in html_report.render_plots(record(SYNTHETIC))}
    assert list(plots) == ["power", "sm_clock", "temperature", "throughput"]
    parsed = Page(page)
    assert len(parsed.plots) == 4
    for plot in parsed.plots:
        assert max(plot["paths"]) > 1000  # a line of ~180 points, not an empty frame
        assert {f"gpu{i}" for i in range(8)} <= set(plot["texts"]) and "time since start (s)" in plot["texts"]
    texts = [set(p["texts"]) for p in parsed.plots]
    assert {"Power draw vs power limit", "power (W)", "power limit 700 W"} <= texts[0]
    assert {"SM clock vs max", "SM clock (MHz)", "max SM clock 1980 MHz"} <= texts[1]
    assert {"GPU temperature vs slowdown threshold", "slowdown 88 °C", "slowdown 89 °C (gpu6)"} <= texts[2]
    assert {"Throughput under sustained load", "throughput (TFLOPS)"} <= texts[3]
    # Hovering shows the values: each band's tooltip has the time and every GPU's reading with its unit.
    tip = parsed.plots[0]["tips"][60]
    assert tip.startswith("t = ") and all(re.search(rf"^gpu{i} \d+(\.\d)? W$", tip, re.M) for i in range(8)), tip
    # Several SVGs on one page must not share element ids (clip paths, markers).
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    for target in re.findall(r'(?:href="#|url\(#)([^")]+)', page):
        assert target in ids, target


def test_a_cpu_run_has_only_the_throughput_plot():
    parsed = Page(render_html(record("cpu-sustained")))
    assert len(parsed.plots) == 1 and "Throughput under sustained load" in parsed.plots[0]["texts"] and "cpu" in parsed.plots[0]["texts"]


def test_plots_need_no_plotting_library_and_a_record_without_series_says_so(monkeypatch):
    assert "This record has no time series" in render_html(record("h100-8x-throttle"))
    for name in ("matplotlib", "numpy"):  # the default install has neither: importing them now fails
        monkeypatch.setitem(sys.modules, name, None)
    page = render_html(record(SYNTHETIC))
    assert len(Page(page).plots) == 4 and "FAIL: something is wrong with this machine" in page


def test_the_page_reads_in_english_without_a_cjk_font():
    for name in (SYNTHETIC, "h100-8x-throttle", "gtx1070-6x-x1-riser"):
        page = render_html(record(name))
        assert not re.search("[\u2e80-\u9fff\uac00-\ud7af\uff00-\uffef]", page), name
        assert 'lang="zh"' not in page


def test_long_soaks_are_thinned_keeping_dips_and_the_page_stays_small():
    r = record(SYNTHETIC)
    for series in r.series:  # stretch each series to one hour at 10 Hz (36000 rows)
        rows = series["rows"]
        series["rows"] = [[round(i * 0.1, 1)] + rows[i % len(rows)][1:] for i in range(36000)]
    series = next(s for s in r.series if s["subject"] == "gpu2" and s["name"] == "sustained.telemetry")
    series["rows"][20000][series["columns"].index("sm_mhz")] = 100  # one deep dip must survive thinning
    page = render_html(r)
    assert len(page) < 1_000_000
    t, y = charts.thin([row[0] for row in series["rows"]], [row[series["columns"].index("sm_mhz")] for row in series["rows"]])
    assert len(y) <= charts.MAX_POINTS and min(v for v in y if v is not None) == 100


def test_facts_and_findings_are_on_the_page():
    r = record("h100-8x-throttle")
    page = render_html(r)
    for gpu in r.machine.gpus:
        assert gpu.uuid in page and str(gpu.serial) in page
    assert page.count('class="finding fail"') == 1 and page.count('class="finding warn"') == 1
    assert "<code>nvidia-smi -i 2 -q -d PERFORMANCE,TEMPERATURE,POWER</code>" in page
    assert "All facts (JSON)" in page


def _plot_texts(page: str) -> dict[str, set[str]]:
    """Each plot's texts by its title."""
    titles = ("GPU utilization", "Power draw vs power limit", "SM clock vs max", "GPU temperature vs slowdown threshold",
              "Host CPU: busy, steal and IO wait")
    return {title: set(p["texts"]) for p in Page(page).plots for title in titles if title in p["texts"]}


def _watch_record(monkeypatch, tmp_path, older: bool = False) -> RunRecord:
    from gpuvet import runner
    from test_watch import write_log

    path = write_log(monkeypatch, tmp_path / "watch.jsonl", ticks=5)
    if older:  # SYNTHETIC: the header cut back to what logs had before it named the GPUs' facts
        lines = path.read_text().splitlines()
        header = json.loads(lines[0])
        for subject in ("gpu0", "gpu1"):
            del header["series"][subject]["facts"]
        path.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    return runner.load_watch_log(str(path))


def test_a_watch_log_shows_the_watched_job_utilization_host_cpu_and_diagnosis_changes(monkeypatch, tmp_path):
    r = _watch_record(monkeypatch, tmp_path)
    page = render_html(r)
    assert "<h2>Watched job</h2>" in page and "Sustained load" not in page
    assert 'id="checklist"' not in page  # a watch is not a vetting run: nothing to tick
    assert [p.key for p in html_report.render_plots(r)] == ["utilization", "power", "sm_clock", "temperature", "host_cpu"]
    texts = _plot_texts(page)
    assert {"gpu0", "gpu1", "utilization (%)"} <= texts["GPU utilization"]
    assert "max SM clock 1980 MHz" in texts["SM clock vs max"] and "slowdown 88 °C" in texts["GPU temperature vs slowdown threshold"]
    assert {"CPU busy", "steal", "iowait"} <= texts["Host CPU: busy, steal and IO wait"]
    changes = page[page.index('id="diagnosis-changes"'):]
    assert "<td>gpu0</td><td>thermal</td><td>thermal: util 99%, SM clock at 100% of max, HW thermal slowdown active" in changes
    assert "<td>gpu1</td><td>neighbour</td>" in changes
    assert "FAIL: the platform failed the watched job" in page
    assert 'class="finding fail"' in page and "thermal 100% of the watched time" in page


def test_an_older_watch_log_without_gpu_facts_still_renders(monkeypatch, tmp_path):
    page = render_html(_watch_record(monkeypatch, tmp_path, older=True))
    texts = _plot_texts(page)
    assert "SM clock vs max" in texts and not any(t.startswith("max SM clock") for t in texts["SM clock vs max"])
    assert "<td>gpu1</td><td>neighbour</td>" in page


# -- in a real browser -----------------------------------------------------------------------------

def _browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("GPUVET_NO_BROWSER") == "1":
        pytest.skip("GPUVET_NO_BROWSER=1: no browser on this machine")
    pytest.fail("chromium is not installed: `sudo apt-get install -y chromium` (scripts/test does it), "
                "or set GPUVET_NO_BROWSER=1 to skip the browser test")


def _chromium(browser: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless, with the network unusable: names do not resolve and the proxy is a closed port."""
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
               f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9",
               "--window-size=1280,4200", "--hide-scrollbars", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_the_page_renders_in_headless_chromium_offline(tmp_path):
    browser = _browser()
    page = tmp_path / "report.html"
    page.write_text(render_html(record(SYNTHETIC)), encoding="utf-8")
    url = page.as_uri()

    dom = _chromium(browser, tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = Page(dom.stdout)
    assert "FAIL: something is wrong with this machine" in dom.stdout
    items = re.findall(r'<tr class="(?:ticked|crossed|warned|unknown)">.*?<td class="item">(.*?)</td>', dom.stdout)
    assert sum(len(i.split("<br>")) for i in items) == 14  # the 14 checklist items; items left open for one reason share a row
    assert "Power wall" in dom.stdout and "gpu2: HW power brake during 56% of the load" in dom.stdout
    assert len(parsed.plots) == 4 and all(max(p["paths"]) > 1000 for p in parsed.plots)

    shot = tmp_path / "report.png"
    result = _chromium(browser, tmp_path, f"--screenshot={shot}", url)
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == (1280, 4200)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
        assert len(colours) > 200  # text, badges and eight plotted lines; a blank page has a handful
        # The plots are painted: gpu2's line (the third colour, braked after 40 s) stands out in green.
        rgb = image.convert("RGB")
        green = sum(count for count, (r, g, b) in rgb.getcolors(maxcolors=1 << 20)
                    if abs(r - 0x2C) < 30 and abs(g - 0xA0) < 30 and abs(b - 0x2C) < 30)
        assert green > 500, green
        # The verdict banner's red border is drawn at the top of the page.
        top = image.convert("RGB").crop((0, 0, 1280, 200))
        assert any(abs(r - 0xB4) < 24 and g < 80 and b < 80 for _, (r, g, b) in top.getcolors(maxcolors=1 << 20))


def test_a_problem_shared_by_several_gpus_is_one_card_as_in_markdown():
    page = render_html(record("gtx1070-6x-x1-riser"))  # 6 GPUs on x1 risers, ethminer on each
    cards = re.findall(r'<article class="finding (\w+)"><h3>.*?<code>([\w.]+)</code> <span class="subject">([^<]+)</span>', page)
    assert len(cards) == len({(check, who) for _, check, who in cards})  # no repeated card
    assert ("warn", "gpu.isolation", "gpu1-5") in cards and ("warn", "gpu.isolation", "gpu0") in cards
    assert len(cards) < 12
    assert "(N: the GPU&#x27;s index" in page or "(N: the GPU's index" in page  # one remedy for all, with N


def test_an_input_where_nothing_could_be_checked_does_not_say_nothing_wrong(tmp_path):
    from gpuvet import runner

    version = Path(__file__).parent / "fixtures" / "proc_sysfs" / "proc-driver-nvidia-version-470.63.01.txt"
    page = render_html(runner.inspect([str(version)]))
    (heading,) = re.findall(r"<h1>(.*?)</h1>", page, re.S)
    assert heading.startswith("SKIP: nothing could be checked") and "<code>nvidia-smi -q -x &gt; gpu.xml</code>" in heading


def test_a_monitoring_loop_given_to_inspect_is_plotted_with_its_utilization():
    from gpuvet import runner

    dmon = Path(__file__).parent / "fixtures" / "smi_text" / "dmon-h100-vm-load-590.48.01.txt"  # real `nvidia-smi dmon`
    r = runner.inspect([str(dmon)])
    assert [p.key for p in html_report.render_plots(r)] == ["utilization", "power", "sm_clock", "temperature"]
    page = render_html(r)
    assert "<h2>Monitoring loop (from the capture)</h2>" in page and len(Page(page).plots) == 4


# -- issue 29: what a GPU-less page and the tables read like -----------------------------------------

def test_a_gpu_less_run_says_each_reason_once_and_groups_the_items_it_left_open():
    page = render_html(record("cpu-full-no-torch"))
    assert page.count("pip install torch --index-url https://download.pytorch.org/whl/cpu") == 1  # in the header
    checklist = page[page.index('id="checklist"'):page.index('id="problems"')]
    rows = re.findall(r'<tr class="unknown"><td class="mark"[^>]*>\?</td><td class="item">(.*?)</td>', checklist)
    assert "Whole GPU, not shared<br>Power limit at the default" in rows  # one row, one reason
    assert len(rows) == 9  # of 12 undecided items
    assert checklist.count("no GPU facts: no NVIDIA driver (see GPUs above)") == 4


def test_ids_wrap_only_after_a_dot_and_details_read_as_words():
    page = render_html(record(SYNTHETIC))
    assert '<code class="id">sustained.<wbr>decay_pct</code>' in page
    assert "code.id { overflow-wrap:normal; }" in page  # never broken mid-word (sustained.decay_pc / t)
    assert "windows 180, duration 90 s</td>" in page and "duration_s" not in page.split('id="facts"')[0]
    assert "<td>mean of the first fifth of the windows vs the last fifth, dtype bfloat16" in page
    assert html_report.detail_text("p99_us", 95.8) == "p99 95.8 µs"
    assert html_report.detail_text("file_bytes", 1 << 30) == "file 1 GiB"


def test_a_watch_logs_diagnosis_changes_are_on_the_clock_asked_for(capsys):
    """`gpuvet report LOG --format html --utc-offset 8`: 3 a.m. in the renter's zone, not +10800 s."""
    from datetime import datetime, timedelta, timezone

    from cli_runner import gpuvet

    log = RECORDS / "watch-replay-rtx-3080-595.58.03.jsonl"  # a real log; its header's t0 is when it started
    t0 = json.loads(log.read_text().splitlines()[0])["t0"]
    code, page, err = gpuvet(capsys, "report", str(log), "--format", "html", "--utc-offset", "8")
    assert code == 0, err
    changes = page[page.index('id="diagnosis-changes"'):]
    assert "<th>Time (UTC+8)</th>" in changes
    first = datetime.fromtimestamp(t0, timezone(timedelta(hours=8)))
    assert f'<td class="num">{first:%Y-%m-%d %H:%M:%S} <small>(+0 s)</small></td><td>gpu0</td><td>neighbour</td>' in changes
    texts = _plot_texts(page)["GPU utilization"]
    assert "time (UTC+8)" in texts and f"{first:%H:%M:%S}.{first.microsecond // 100000}" in texts  # the axis too
    assert re.search(r"<title>\d\d:\d\d:\d\d\.\d \(t = [\d.]+ s\)\ngpu0 ", page)  # and each moment's tooltip
