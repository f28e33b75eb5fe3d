"""The HTML report: one self-contained page a person opens in any browser, offline.

Verdict at the top, the seeds' checklist, every finding with its evidence and remedy, plots of
the sustained-load time series, measurements, and the machine's facts. Styles and plots are
inline (SVG written by report/charts.py, in every install); nothing on the page refers to anything
outside it, so it opens the same on an air-gapped laptop or as a support-ticket attachment. All
its text reads in English with any Latin font (no CJK font needed).
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from collections.abc import Mapping
from typing import Any

from ..facts import Gpu, Host, Machine, Topology, to_dict
from ..record import FAIL, MEASURED, PASS, SKIP, WARN, Finding, RunRecord
from . import charts as charts_lib
from .numbers import number
from .checklist import GROUP_SOURCES, GROUP_TITLES, UNKNOWN, WORD, checklist, grouped
from .markdown import general_remedy, same_problems
from .terminal import (header_line, is_watch_log, machine_lines, options_line, problems, quiet_rows, said_once, status_counts,
                       subject_range, torch_missing_line, verdict_text)

GIB = 1024**3


def render_html(record: RunRecord, utc_offset_hours: float = 0.0) -> str:
    """The page; `utc_offset_hours`: the clock a watch log's moments are given on."""
    plots = render_plots(record, utc_offset_hours)
    watched = is_watch_log(record)
    banner = _banner(record)  # says whole the reasons said_once shortens below
    record = said_once(record)
    sections = [
        banner,
        "" if watched else _checklist(record),
        _problems(record.findings),
        _watched_section(record, plots, utc_offset_hours) if watched else _plots_section(record, plots),
        _quiet(record.findings),
        _measurements(record),
        _facts(record.machine),
    ]
    title = f"gpuvet {record.verdict.upper()} · {_gpu_summary(record.machine)} · {record.started_at.replace('T', ' ')[:16]} UTC"
    return (
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{_e(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
        + "\n".join(s for s in sections if s)
        + f"\n<footer>{_e(header_line(record))} · run record schema gpuvet.run/1</footer>\n</main>\n</body>\n</html>\n"
    )


# -- text helpers ----------------------------------------------------------------------------------

def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def rich_text(value: str | None) -> str:
    """Escaped text with `backtick spans` shown as code (remedies are written that way)."""
    if not value:
        return ""
    pieces = value.split("`")
    if len(pieces) % 2 == 0:
        return _e(value)
    return "".join(f"<code>{_e(p)}</code>" if i % 2 else _e(p) for i, p in enumerate(pieces))


def _gpu_summary(m: Machine) -> str:
    if not m.gpus:
        return "no GPU"
    names: dict[str, int] = {}
    for g in m.gpus:
        names[g.name or "unknown GPU"] = names.get(g.name or "unknown GPU", 0) + 1
    return ", ".join(f"{n} x {name}" for name, n in names.items())


# -- verdict, checklist, findings ------------------------------------------------------------------

def _banner(record: RunRecord) -> str:
    counts = status_counts(record)
    warnings = "warning" if counts[WARN] == 1 else "warnings"
    pills = "".join(f'<span class="pill {s}">{counts[s]} {label}</span>'
                    for s, label in ((FAIL, "failed"), (WARN, warnings), (PASS, "passed"), (MEASURED, "measured, not judged"),
                                     (SKIP, "skipped")) if s != MEASURED or counts[s])
    lines = "".join(f"<li>{rich_text(line.strip())}</li>"
                    for line in machine_lines(record.machine) + [torch_missing_line(record), options_line(record)] if line)
    verdict = verdict_text(record)
    return (f'<header class="verdict {record.verdict}" id="verdict">\n'
            f'<h1>{rich_text(verdict)}</h1>\n<p class="pills">{pills}</p>\n'
            f'<ul class="machine">{lines}</ul>\n<p class="meta">{_e(header_line(record))}</p>\n</header>')


def _checklist(record: RunRecord) -> str:
    parts = ['<section id="checklist">']
    for group, lines in grouped(checklist(record)):
        rows = "".join(
            f'<tr class="{line.state}"><td class="mark" title="{_e(WORD[line.state])}">{_e(line.mark)}</td>'
            f'<td class="item">{"<br>".join(_e(t) for t in titles)}</td>'
            f"<td>{rich_text(line.figure)}</td></tr>"
            for line, titles in _undecided_together(lines))
        parts.append(f'<h2>{_e(GROUP_TITLES[group])}</h2>\n<p class="note">{_e(GROUP_SOURCES[group])}</p>\n'
                     f'<table class="checklist"><thead><tr><th></th><th>Item</th><th>What decided it</th></tr></thead>'
                     f"<tbody>{rows}</tbody></table>")
    parts.append("</section>")
    return "\n".join(parts)


def _undecided_together(lines: list) -> list[tuple[Any, list[str]]]:
    """Items left undecided for one reason (no GPU, no PyTorch) as one row naming them all, where
    it first comes: a GPU-less run's page was a column of "?" each giving the same reason."""
    rows: list[tuple[Any, list[str]]] = []
    first: dict[str, list[str]] = {}
    for line in lines:
        if line.state == UNKNOWN and line.figure in first:
            first[line.figure].append(line.item.title)
            continue
        rows.append((line, [line.item.title]))
        if line.state == UNKNOWN:
            first[line.figure] = rows[-1][1]
    return rows


def _problems(findings: list[Finding]) -> str:
    found = problems(findings)
    if not found:
        return '<section id="problems"><h2>Problems</h2><p>None found.</p></section>'
    return '<section id="problems"><h2>Problems</h2>\n' + "\n".join(_card(same) for same in same_problems(found)) + "\n</section>"


def _card(same: list[Finding]) -> str:
    """One card for a problem that reads the same on several subjects (as the Markdown report
    groups them): six GPUs on x1 risers are one problem to a reader, not six cards."""
    f = same[0]
    e = f.evidence
    who = subject_range(list(dict.fromkeys(x.subject for x in same)))
    remedy_text = f.remedy
    if len(same) > 1 and len({x.remedy for x in same}) > 1:
        general = general_remedy(f.remedy) or ""
        remedy_text = (f"{general} (N: the GPU's index, BUS_ID: its bus ID in the GPUs table)" if "BUS_ID" in general
                       else f"{general} (N: the GPU's index)")
    rows = "".join(f"<dt>{label}</dt><dd>{rich_text(value)}</dd>"
                   for label, value in (("Measured", e.measured), ("Expected", e.expected), ("Source", e.source)) if value)
    remedy = f'<p class="remedy"><b>Fix / confirm:</b> {rich_text(remedy_text)}</p>' if remedy_text else ""
    return (f'<article class="finding {f.status}"><h3><span class="badge {f.status}">{f.status.upper()}</span> '
            f"<code>{_e(f.check)}</code> <span class=\"subject\">{_e(who)}</span></h3>"
            f"<p>{rich_text(f.summary)}</p>" + (f"<dl>{rows}</dl>" if rows else "") + remedy + "</article>")


def _quiet(findings: list[Finding]) -> str:
    rows = [f'<tr class="{status}"><td><span class="badge {status}">{status.upper()}</span></td><td>{_e(area)}</td>'
            f"<td class=\"check\">{_id(check)}</td><td>{_e(who)}</td><td>{rich_text(summary)}</td></tr>"
            for area, status, check, who, summary in quiet_rows(findings)]
    if not rows:
        return ""
    return ('<section id="passed"><h2>Passed, measured (not judged) and skipped</h2><table><thead><tr><th>Status</th><th>Area</th><th>Check</th>'
            f"<th>Subject</th><th>Summary</th></tr></thead><tbody>{''.join(rows)}</tbody></table></section>")


def _measurements(record: RunRecord) -> str:
    rows = [f"<tr><td>{_id(m.name)}</td><td>{_e(m.subject)}</td><td class=\"num\">{number(m.value)}</td><td>{_e(m.unit)}</td>"
            f"<td>{_e(_details_text(m.details))}</td></tr>"
            for m in record.measurements if m.value is not None and m.unit]
    if not rows:
        return ""
    return ('<section id="measurements"><h2>Measurements</h2><table><thead><tr><th>Measurement</th><th>Subject</th>'
            f"<th>Value</th><th>Unit</th><th>Details</th></tr></thead><tbody>{''.join(rows)}</tbody></table></section>")


# A detail's key ends in its unit (duration_s, p99_us, read_mb_s): the reader sees words and the unit.
_UNIT_SUFFIXES = (("_mb_s", "MB/s"), ("_us", "µs"), ("_s", "s"), ("_pct", "%"))


def _details_text(details: dict[str, Any]) -> str:
    flat = [detail_text(k, v) for k, v in details.items() if not isinstance(v, (dict, list)) or k == "shape"]
    return ", ".join(flat)


def detail_text(key: str, value: Any) -> str:
    """One measurement detail as words: 'duration 30 s', 'p99 95.8 µs', 'file 1 GiB', 'queue depth 32'."""
    shown = number(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
    if key == "shape" and isinstance(value, list):
        shown = "x".join(str(v) for v in value)
    if key == "how":  # already a phrase: "mean of the first fifth of the windows vs the last fifth"
        return shown
    if key == "bytes" or key.endswith("_bytes"):
        name = key.removesuffix("bytes").removesuffix("_") or "size"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            shown = f"{value / GIB:.3g} GiB" if value >= GIB else f"{value / 2**20:.3g} MiB" if value >= 2**20 else f"{value:,.0f} B"
        return f"{name.replace('_', ' ')} {shown}"
    for suffix, unit in _UNIT_SUFFIXES:
        if key.endswith(suffix) and key != suffix[1:]:
            return f"{key.removesuffix(suffix).replace('_', ' ')} {shown} {unit}".replace(" %", "%")
    return f"{key.replace('_', ' ')} {shown}"


def _id(name: str) -> str:
    """A check or measurement id: it may wrap only after a dot (sustained.<wbr>decay_pct), never mid-word."""
    return '<code class="id">' + ".<wbr>".join(_e(part) for part in name.split(".")) + "</code>"


# -- machine facts ---------------------------------------------------------------------------------

def _facts(m: Machine) -> str:
    parts = ['<section id="facts"><h2>Machine facts</h2>']
    parts.append(_gpu_table(m))
    parts.append(_dl("Driver", [("version", m.driver.version), ("CUDA (driver)", m.driver.cuda_version),
                                ("kernel module", m.driver.kernel_module_version)]))
    if m.host is not None:
        parts.append(_dl("Host", _host_rows(m.host)))
    if m.stack is not None:
        t = m.stack.torch
        parts.append(_dl("Software stack", [
            ("Python", m.stack.python), ("PyTorch", t.version if t.installed else "not installed"), ("torch CUDA", t.cuda),
            ("torch arch list", " ".join(t.arch_list) if t.arch_list else None), ("nvcc", m.stack.nvcc_version),
            ("CUDA home", m.stack.cuda_home), ("CUDA_MODULE_LOADING", m.stack.cuda_module_loading)]))
    if m.topology is not None and m.topology.devices:
        parts.append(_topology(m.topology))
    captures = "".join(f"<li><code>{_e(c.get('path'))}</code> ({_e(c.get('kind'))})</li>" for c in m.captures)
    if captures:
        parts.append(f"<h3>Captures</h3><ul>{captures}</ul>")
    facts_json = json.dumps(to_dict(m), indent=1, sort_keys=False)
    parts.append(f"<details><summary>All facts (JSON)</summary><pre>{_e(facts_json)}</pre></details>")
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


def _dl(title: str, rows: list[tuple[str, Any]]) -> str:
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in rows if v not in (None, "", [], {}))
    return f"<h3>{_e(title)}</h3><dl class=\"facts\">{items}</dl>" if items else ""


def _host_rows(h: Host) -> list[tuple[str, Any]]:
    w = h.workdir
    return [
        ("hostname", h.hostname), ("OS", h.os), ("kernel", h.kernel), ("CPU", h.cpu_model),
        ("cores", f"{h.cpu_usable_cores or '?'} usable, {h.cpu_physical_cores or '?'} physical, {h.cpu_logical_cores or '?'} logical"),
        ("memory", f"{h.memory_total_bytes / GIB:.0f} GiB" if h.memory_total_bytes else None), ("NUMA nodes", h.numa_nodes),
        ("/dev/shm", f"{h.shm_total_bytes / GIB:.1f} GiB" if h.shm_total_bytes else None),
        ("cloud", h.cloud), ("hypervisor", h.hypervisor), ("container", h.container),
        ("CPU steal", f"{h.steal_pct:.1f}%" if h.steal_pct is not None else None), ("net.core.somaxconn", h.somaxconn),
        ("working directory", f"{w.path} on {w.fs_type} ({w.kind})" if w and w.fs_type else None),
        ("NICs", ", ".join(f"{n.name} {n.speed_mbps or '?'} Mb/s" for n in h.nics if not n.virtual) if h.nics else None),
        ("RDMA", ", ".join(f"{r.device}/{r.port} {r.state or '?'} {r.rate_gbps or '?'} Gb/s" for r in h.rdma) if h.rdma else None),
    ]


_GPU_COLUMNS = ("GPU", "Model", "Memory", "Power limit", "PCIe link", "SM clock", "Temperature", "ECC", "Mode", "UUID", "Serial")


def _gpu_table(m: Machine) -> str:
    if not m.gpus:
        return f"<p>No GPU facts: {_e(m.gpu_error or 'no NVIDIA GPU found')}</p>"
    head = "".join(f"<th>{c}</th>" for c in _GPU_COLUMNS)
    rows = "".join("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in _gpu_row(g)) + "</tr>" for g in m.gpus)
    return f'<h3>GPUs</h3><div class="wide"><table class="gpus"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>'


def _gpu_row(g: Gpu) -> list[Any]:
    p, t, c = g.power, g.thermal, g.clocks
    limit = p.enforced_limit_w if p.enforced_limit_w is not None else p.limit_w
    power = f"{limit:.0f} W" + (f" (default {p.default_limit_w:.0f})" if p.default_limit_w else "") if limit is not None else "?"
    link = "; ".join(f"Gen{r.current_gen or '?'} x{r.current_width or '?'} of Gen{r.max_gen or '?'} x{r.max_width or '?'}"
                     f" ({r.source}{', load' if r.under_load else ''})" for r in g.pcie.readings[:2]) or "?"
    slowdown = _slowdown_c(g)
    temp = (f"{t.gpu_c:.0f} C" if t.gpu_c is not None else "?") + (f" (slowdown {slowdown:.0f})" if slowdown else "")
    mode = ", ".join(x for x in (g.virtualization_mode, "MIG" if g.mig_enabled else None) if x) or "?"
    ecc = "?" if g.ecc.enabled is None else "on" if g.ecc.enabled else "off"
    memory = f"{g.memory_total_mib / 1024:.1f} GiB" if g.memory_total_mib else "?"
    sm = f"{c.sm_mhz or '?'} of {c.max_sm_mhz or '?'} MHz"
    return [f"gpu{g.index}", g.name, memory, power, link, sm, temp, ecc, mode, g.uuid, g.serial]


def _topology(topo: Topology) -> str:
    devices = topo.devices
    head = "<th></th>" + "".join(f"<th>{_e(d)}</th>" for d in devices)
    rows = "".join(f"<tr><th>{_e(a)}</th>" + "".join(f"<td>{_e(topo.links.get(a, {}).get(b, ''))}</td>" for b in devices) + "</tr>"
                   for a in devices)
    return ('<h3>Topology (nvidia-smi topo -m)</h3><div class="wide"><table class="topo">'
            f"<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>")


def _slowdown_c(g: Gpu) -> float | None:
    """The slowdown threshold; newer drivers give only the margin from the current temperature."""
    t = g.thermal
    if t.slowdown_c is not None:
        return t.slowdown_c
    if t.gpu_c is not None and t.slowdown_margin_c is not None:
        return t.gpu_c + t.slowdown_margin_c
    return None


# -- plots -----------------------------------------------------------------------------------------

@dataclass
class Plot:
    key: str  # "power", "sm_clock", "temperature", "throughput"
    title: str
    svg: str


@dataclass
class _Series:
    """One recorded series; a column reads as floats (None where a reading was missing, which
    breaks the line there)."""

    subject: str
    names: list[str]
    rows: list[list[Any]]

    @classmethod
    def of(cls, series: Mapping[str, Any]) -> _Series:
        names = list(series.get("columns") or [])
        rows = [row for row in series.get("rows") or [] if len(row) == len(names)]
        return cls(str(series.get("subject", "?")), names, rows)

    def column(self, name: str) -> list[float | None] | None:
        if name not in self.names:
            return None
        i = self.names.index(name)
        return [_number(row[i]) for row in self.rows]


def render_plots(record: RunRecord, utc_offset_hours: float = 0.0) -> list[Plot]:
    """Every time series the record holds, as inline SVG (report/charts.py: no plotting library);
    a watch log of one session on the wall clock of `utc_offset_hours`."""
    telemetry = [_Series.of(s) for s in record.series if s.get("name", "").endswith(".telemetry")]
    throughput = [_Series.of(s) for s in record.series if s.get("name") == "sustained.throughput"]
    gpus = {f"gpu{g.index}": g for g in record.machine.gpus}
    charts = [
        ("power", "Power draw vs power limit", "power (W)", "W", _lines(telemetry, "power_w"),
         _limit_lines(telemetry, "power_limit_w", "power limit", "W")),
        ("sm_clock", "SM clock vs max", "SM clock (MHz)", "MHz", _lines(telemetry, "sm_mhz"),
         _fact_lines(telemetry, gpus, lambda g: g.clocks.max_sm_mhz, "max SM clock", "MHz")),
        ("temperature", "GPU temperature vs slowdown threshold", "temperature (°C)", "°C", _lines(telemetry, "temp_c"),
         _fact_lines(telemetry, gpus, _slowdown_c, "slowdown", "°C")),
        ("throughput", "Throughput under sustained load", "throughput (TFLOPS)", "TFLOPS", _lines(throughput, "tflops"), []),
    ]
    if any(s.get("name") == "capture.telemetry" for s in record.series):  # dmon / --query-gpu -l: utilization too
        charts.insert(0, ("utilization", "GPU utilization", "utilization (%)", "%", _lines(telemetry, "util_pct"),
                          [charts_lib.Limit("fully busy 100%", 100.0)]))
    if is_watch_log(record):
        host = [_Series.of(s) for s in record.series if s.get("name") == "watch.host"]
        job = [_Series.of(s) for s in record.series if s.get("name") == "watch.job"]
        charts = [("utilization", "GPU utilization", "utilization (%)", "%", _lines(telemetry, "util_pct"),
                   [charts_lib.Limit("fully busy 100%", 100.0)])] + charts[:3] + [
            ("host_cpu", "Host CPU: busy, steal and IO wait", "% of all CPUs", "%", _host_lines(host), []),
            ("job_cpu", "Followed job: CPU", "% of one core", "%", _job_lines(job, (("cpu_pct", "CPU", 1.0),)), []),
            ("job_io", "Followed job: storage IO", "MB/s", "MB/s",
             _job_lines(job, (("read_bps", "read", 1e-6), ("write_bps", "write", 1e-6))), []),
        ]
    ticks, x_title = _watch_clock(record, utc_offset_hours)
    plots = []
    for key, title, axis, unit, lines, limits in charts:
        svg = charts_lib.line_chart(key, title, axis, lines, limits, unit=unit, x_title=x_title, x_ticks=ticks)
        if svg:
            plots.append(Plot(key, title, svg))
    return plots


def _watch_clock(record: RunRecord, utc_offset_hours: float):
    """A watch log of one session: time ticks on the clock (03:00, not 10800). Several sessions
    share the seconds axis, each from its own start, so they keep it."""
    starts = {s.get("t0") for s in record.series if s.get("name", "").startswith("watch.")}
    t0 = next(iter(starts)) if len(starts) == 1 else None
    if not is_watch_log(record) or not isinstance(t0, (int, float)) or not t0:
        return None, "time since start (s)"
    zone = timezone(timedelta(hours=utc_offset_hours))
    short = record.duration_s < 60  # ticks under a second apart: tenths, or they would read alike

    def tick(t: float) -> str:
        text = f"{datetime.fromtimestamp(t0 + t, zone):%H:%M:%S.%f}"
        return text[:-5] if short else text[:-7]

    return tick, f"time ({_zone_name(zone)})"


def _host_lines(host: list[_Series]) -> list[charts_lib.Line]:
    """The host's CPU busy, steal and IO-wait shares, one line each (sessions of a log one after another)."""
    lines = []
    for column, label in (("cpu_pct", "CPU busy"), ("steal_pct", "steal"), ("iowait_pct", "iowait")):
        for line in _lines(host, column):
            lines.append(charts_lib.Line(label, line.t, line.y))
    return lines


def _job_lines(job: list[_Series], columns: tuple[tuple[str, str, float], ...]) -> list[charts_lib.Line]:
    """The followed job's (watch --pid) columns, one line each, scaled (bytes/s to MB/s)."""
    lines = []
    for column, label, scale in columns:
        for line in _lines(job, column):
            lines.append(charts_lib.Line(label, line.t, [None if v is None else v * scale for v in line.y]))
    return lines


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _lines(series_list: list[_Series], column: str) -> list[charts_lib.Line]:
    lines = []
    for s in series_list:
        t, y = s.column("t"), s.column(column)
        if t is None or y is None:
            continue
        pairs = sorted((a, b) for a, b in zip(t, y) if a is not None)  # time in order, missing times dropped
        if any(b is not None for _, b in pairs):
            lines.append(charts_lib.Line(s.subject, [a for a, _ in pairs], [b for _, b in pairs]))
    return lines


def _most_frequent(values: list[float]) -> float:
    counts: dict[float, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return max(sorted(counts), key=lambda v: counts[v])


def _limit_lines(series_list: list[_Series], column: str, what: str, unit: str) -> list[charts_lib.Limit]:
    """Reference lines from a column (the enforced power limit): each GPU's most frequent value."""
    values: dict[float, list[str]] = {}
    for s in series_list:
        known = [v for v in s.column(column) or [] if v is not None]
        if known:
            values.setdefault(_most_frequent(known), []).append(s.subject)
    return _labelled(values, what, unit, len(series_list))


def _fact_lines(series_list: list[_Series], gpus: dict[str, Gpu], fact, what: str, unit: str) -> list[charts_lib.Limit]:
    values: dict[float, list[str]] = {}
    for s in series_list:
        gpu = gpus.get(s.subject)
        value = fact(gpu) if gpu is not None else None
        if value:
            values.setdefault(float(value), []).append(s.subject)
    return _labelled(values, what, unit, len(series_list))


def _labelled(values: dict[float, list[str]], what: str, unit: str, total: int) -> list[charts_lib.Limit]:
    """One reference line per distinct value; the most common one unnamed, the others name their
    GPUs (legends stay short)."""
    common = max(values, key=lambda v: len(values[v]), default=None)
    lines = []
    for value, subjects in sorted(values.items(), key=lambda kv: kv[0] != common):
        named = value != common or len(subjects) < total and len(values) == 1
        lines.append(charts_lib.Limit(f"{what} {value:g} {unit}" + (f" ({subject_range(subjects)})" if named else ""), value))
    return lines


CAPTIONS = {
    "power": "Power drawn under load; dashed: the enforced limit. Well under the limit with clocks down means something "
             "else holds the GPU back (power brake, heat).",
    "sm_clock": "SM clock under load; dashed: the GPU's maximum. At the power limit clocks settle below it; a step down is "
                "a slowdown.",
    "temperature": "GPU temperature; dashed: where the GPU starts slowing itself down.",
    "throughput": "Work done per window of the sustained matmul load; a falling line is heat or power soaking in.",
    "utilization": "Share of time a kernel ran on each GPU (NVML). Dips while the job runs are time the GPU waited: "
                   "for input, the CPU, storage or other GPUs.",
    "job_cpu": "The followed job's process tree (gpuvet watch --pid): CPU in % of one core (400% = four cores busy). "
               "Busy CPUs while its GPUs idle: the input pipeline; both low: the job waits on something else (IO, network, a lock).",
    "job_io": "The followed job's storage reads and writes (/proc/<pid>/io of its process tree). Reads rising as GPU "
              "utilization dips: the job waits on data; write bursts: checkpoints.",
    "host_cpu": "The host's CPUs: busy, taken by the hypervisor (steal) and waiting on storage (iowait). Steal or iowait "
                "rising when utilization dips names the bottleneck.",
}


def _watched_section(record: RunRecord, plots: list[Plot], utc_offset_hours: float = 0.0) -> str:
    """A watch log: the plots of the watched time, and each diagnosis change."""
    head = '<section id="plots"><h2>Watched job</h2>'
    log = record.options.get("log")
    note = (f'<p class="note">Recorded by <code>gpuvet watch --log {_e(log)}</code>; times count from the start of '
            "each watch session.</p>") if log else ""
    if not plots:
        figures = '<p class="note">The log holds no readings to plot.</p>'
    else:
        figures = "\n".join(f'<figure class="plot" id="plot-{p.key}">{p.svg}<figcaption>{_e(CAPTIONS[p.key])}</figcaption></figure>'
                            for p in plots)
    return f"{head}\n{note}\n{figures}\n{_diagnosis_changes(record, utc_offset_hours)}\n</section>"


def _diagnosis_changes(record: RunRecord, utc_offset_hours: float = 0.0) -> str:
    from ..wording import DIAGNOSIS_LABELS as LABELS

    rows = []
    for s in record.series:
        if s.get("name") != "watch.diagnosis":
            continue
        for row in s.get("rows") or []:
            if len(row) != 3 or row[1] == "no_data":
                continue
            t, state, text = row
            rows.append((s.get("t0") or 0, _number(t) if _number(t) is not None else math.nan, str(s.get("subject")), str(state), text))
    if not rows:
        return '<h3 id="diagnosis-changes">Diagnosis changes</h3><p class="note">The log records no diagnosis.</p>'
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    zone = timezone(timedelta(hours=utc_offset_hours))
    body = "".join(f'<tr class="state-{_e(state)}"><td class="num">{_wall_clock(t0, t, zone)}</td><td>{_e(subject)}</td>'
                   f"<td>{_e(LABELS.get(state, state))}</td><td>{_e(text)}</td></tr>"
                   for t0, t, subject, state, text in rows)
    return ('<h3 id="diagnosis-changes">Diagnosis changes</h3><p class="note">Each line: the moment a subject\'s diagnosis '
            "changed; it holds until that subject's next line.</p>"
            f"<table><thead><tr><th>Time ({_zone_name(zone)})</th><th>Subject</th><th>State</th><th>What was seen</th></tr></thead>"
            f"<tbody>{body}</tbody></table>")


def _wall_clock(t0: float, t: float | None, zone: timezone) -> str:
    """When it happened on the clock ("2026-12-04 03:00:12"), with the seconds into the watch
    session after it; a log without its start time gives those seconds alone."""
    if t is None or math.isnan(t):
        return "?"
    if not t0:
        return f"+{t:.0f} s"
    wall = datetime.fromtimestamp(t0 + t, zone)
    return f"{wall:%Y-%m-%d %H:%M:%S} <small>(+{t:.0f} s)</small>"


def _zone_name(zone: timezone) -> str:
    hours = (zone.utcoffset(None) or timedelta()).total_seconds() / 3600
    return "UTC" if hours == 0 else f"UTC{hours:+g}"


def _plots_section(record: RunRecord, plots: list[Plot]) -> str:
    loops = [s for s in record.series if s.get("name") == "capture.telemetry"]
    title = "Monitoring loop (from the capture)" if loops and len(loops) == len(record.series) else "Sustained load"
    head = f'<section id="plots"><h2>{title}</h2>'
    if not plots:
        return (f'{head}<p class="note">This record has no time series: `gpuvet run` (or `gpuvet bench sustained`) '
                "records power, clocks, temperature and throughput under minutes of load.</p></section>")
    figures = "\n".join(f'<figure class="plot" id="plot-{p.key}">{p.svg}<figcaption>{_e(CAPTIONS[p.key])}</figcaption></figure>'
                        for p in plots)
    return f"{head}\n{figures}\n</section>"


CSS = """
:root { --fail:#b42318; --fail-bg:#fef3f2; --warn:#b54708; --warn-bg:#fffaeb; --pass:#067647; --pass-bg:#ecfdf3;
        --skip:#667085; --line:#e4e7ec; font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", sans-serif; }
body { margin:0; background:#f9fafb; color:#101828; line-height:1.45; }
main { max-width:1180px; margin:0 auto; padding:24px; }
h1 { margin:0 0 8px; font-size:1.6rem; } h2 { margin:32px 0 8px; font-size:1.25rem; } h3 { font-size:1rem; margin:18px 0 6px; }
code { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size:.88em; background:#f2f4f7;
       padding:1px 4px; border-radius:4px; overflow-wrap:anywhere; }
code.id { overflow-wrap:normal; }
.verdict { border-radius:12px; padding:18px 22px; border:2px solid; }
.verdict.fail { background:var(--fail-bg); border-color:var(--fail); } .verdict.fail h1 { color:var(--fail); }
.verdict.warn { background:var(--warn-bg); border-color:var(--warn); } .verdict.warn h1 { color:var(--warn); }
.verdict.pass { background:var(--pass-bg); border-color:var(--pass); } .verdict.pass h1 { color:var(--pass); }
.pills { margin:0 0 8px; } .pill { display:inline-block; margin-right:8px; padding:2px 10px; border-radius:999px; font-weight:600;
       background:#fff; border:1px solid var(--line); }
.pill.fail { color:var(--fail); } .pill.warn { color:var(--warn); } .pill.pass { color:var(--pass); } .pill.skip { color:var(--skip); }
.machine { margin:6px 0; padding-left:18px; } .meta, .note { color:#475467; font-size:.9rem; margin:4px 0; }
table { border-collapse:collapse; width:100%; background:#fff; font-size:.92rem; }
th, td { border-bottom:1px solid var(--line); padding:6px 8px; text-align:left; vertical-align:top; }
th { background:#f2f4f7; font-weight:600; }
.wide { overflow-x:auto; } td.check code { white-space:nowrap; } td.num { text-align:right; font-variant-numeric: tabular-nums; }
.checklist td.mark { font-size:1.2rem; font-weight:700; width:2em; text-align:center; }
.checklist td.item { width:30%; font-weight:600; }
tr.ticked td.mark { color:var(--pass); } tr.crossed td.mark { color:var(--fail); } tr.warned td.mark { color:var(--warn); }
tr.unknown td.mark, tr.unknown td { color:var(--skip); }
tr.crossed { background:var(--fail-bg); } tr.warned { background:var(--warn-bg); }
.badge { display:inline-block; min-width:3.2em; text-align:center; border-radius:6px; padding:0 6px; font-size:.8rem;
         font-weight:700; color:#fff; }
.badge.fail { background:var(--fail); } .badge.warn { background:var(--warn); } .badge.pass { background:var(--pass); }
.badge.skip { background:var(--skip); } .badge.measured { background:#3a7ca5; } .pill.measured { color:#3a7ca5; }
.finding { background:#fff; border:1px solid var(--line); border-left:6px solid; border-radius:8px; padding:10px 14px; margin:10px 0; }
.finding.fail { border-left-color:var(--fail); } .finding.warn { border-left-color:var(--warn); }
.finding h3 { margin:0 0 6px; } .finding p { margin:4px 0; } .subject { color:#475467; font-weight:400; }
dl { display:grid; grid-template-columns:max-content 1fr; gap:2px 12px; margin:6px 0; font-size:.9rem; }
dt { color:#475467; } dd { margin:0; overflow-wrap:anywhere; }
.remedy { background:#f0f9ff; border-radius:6px; padding:6px 10px; }
figure.plot { background:#fff; border:1px solid var(--line); border-radius:8px; margin:12px 0; padding:8px; }
svg.plot { width:100%; height:auto; display:block; } .band { fill:#101828; fill-opacity:0; } .band:hover { fill-opacity:.07; } figcaption { color:#475467; font-size:.85rem; }
details pre { max-height:480px; overflow:auto; background:#fff; border:1px solid var(--line); padding:8px; font-size:.8rem; }
footer { margin:32px 0 8px; color:#667085; font-size:.85rem; }
"""
