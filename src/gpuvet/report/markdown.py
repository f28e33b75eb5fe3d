"""The Markdown report: fit to paste into a support ticket or a GitHub issue.

The verdict, the machine in a few lines, the seeds' checklist as tables, every problem with its
evidence and the command that fixes or confirms it (identical problems of several GPUs once), a table
of the GPUs (bus ID, UUID, serial and VBIOS, so the provider knows which card is meant), then passes,
skips and measurements.
"""

from __future__ import annotations

import re

from ..facts import Gpu, Machine
from ..record import FAIL, MEASURED, PASS, SKIP, WARN, Finding, RunRecord
from ..text_patterns import PCI_BUS_ID
from .numbers import number
from .checklist import CROSSED, GROUP_SOURCES, GROUP_TITLES, TICKED, UNKNOWN, WARNED, WORD, checklist, grouped, subject_range
from .terminal import header_line, is_watch_log, machine_lines, options_line, problems, quiet_rows, verdict_line

MARK = {TICKED: "✅", CROSSED: "❌", WARNED: "⚠️", UNKNOWN: "❔"}
STATUS_MARK = {FAIL: "❌ FAIL", WARN: "⚠️ WARN", PASS: "✅ PASS", SKIP: "➖ SKIP", MEASURED: "📏 MEASURED (not judged)"}


def render_markdown(record: RunRecord) -> str:
    watched = is_watch_log(record)  # readings of a running job: no acceptance checklist to tick
    parts = [
        _title(record),
        _machine(record),
        "" if watched else _checklist(record),
        _problems(record.findings),
        _watched(record) if watched else "",
        _gpu_table(record.machine),
        _quiet(record.findings),
        _measurements(record),
        f"<sub>{text(header_line(record))} · schema gpuvet.run/1</sub>",
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


# -- escaping --------------------------------------------------------------------------------------

# What starts a Markdown block when it opens a line: a heading, a quote, a list, a rule, a table.
_BLOCK_START = re.compile(r"^(\s*)(?=#{1,6}(?:\s|$)|[-+*](?:\s|$)|[>|=]|[-*_]{3,}\s*$)")
_ORDERED_LIST_START = re.compile(r"^(\s*\d{1,9})(?=[.)](?:\s|$))")


def text(value: str) -> str:
    """Free text for Markdown, on one line: a field's newlines become spaces (so a GPU name or a
    label cannot start a heading or an image line of its own), a block marker at its start is
    escaped, and HTML-looking parts and link syntax are escaped outside `code spans`, which stay
    as written."""
    value = _one_line(value)
    value = _ORDERED_LIST_START.sub(r"\1\\", _BLOCK_START.sub(r"\1\\", value, count=1), count=1)
    pieces = value.split("`")
    if len(pieces) % 2 == 0:  # an unpaired backtick: nothing is code
        return _plain(value)
    return "`".join(piece if i % 2 else _plain(piece) for i, piece in enumerate(pieces))


def _one_line(value: str) -> str:
    """`value` with each line break, and the spaces around it, as one space. Split, not one
    regular expression: "\\s*[\\r\\n]+" tried at each space of a long run is quadratic."""
    parts = _LINE_BREAKS.split(value)
    if len(parts) == 1:
        return value
    return " ".join([parts[0].rstrip()] + [p.strip() for p in parts[1:-1]] + [parts[-1].lstrip()])


_LINE_BREAKS = re.compile(r"[\r\n]+")


def _plain(value: str) -> str:
    # Only what a Markdown renderer would take for HTML: "<tag", "</", "&name;". Arrows like
    # "host<->GPU" stay readable in the raw text a support agent may see.
    value = re.sub(r"&(?=#?\w+;)", "&amp;", value)
    value = value.replace("](", "]\\(")  # no link or image: "![x](http://...)" stays text
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", value)


def cell(value: str) -> str:
    """Text for a table cell: pipes escaped everywhere (GFM splits on them even inside code)."""
    return text(value).replace("|", "\\|")  # text() left no line break


# -- sections --------------------------------------------------------------------------------------

def _title(record: RunRecord) -> str:
    verdict, _, counts = verdict_line(record).partition("  ")
    return f"# gpuvet: {verdict}\n\n**{STATUS_MARK[record.verdict]}** {counts}"


def _machine(record: RunRecord) -> str:
    lines = [f"- {text(line.strip())}" for line in machine_lines(record.machine) + [_host_line(record.machine),
                                                                                     options_line(record)] if line]
    return "## Machine\n\n" + "\n".join(lines)


def _host_line(m: Machine) -> str:
    """Which host, OS and kernel: a support ticket needs them to find the machine and its image
    (`--redact` replaces the hostname)."""
    h = m.host
    if h is None:
        return ""
    parts = [f"{label} {value}" for label, value in (("host", h.hostname), ("OS", h.os), ("kernel", h.kernel)) if value]
    return "System: " + " · ".join(parts) if parts else ""


# The HTML report's GPU columns (report/html.py), with the PCI bus ID and VBIOS a provider's support
# needs to find the card: "gpu2" alone names a different card after a reboot or in another tool.
_GPU_COLUMNS = ("GPU", "Model", "Bus ID", "UUID", "Serial", "VBIOS", "Memory", "Power limit", "PCIe link", "SM clock",
                "Temperature", "ECC", "Mode")


def _gpu_table(m: Machine) -> str:
    if not m.gpus:
        return ""
    head = "| " + " | ".join(_GPU_COLUMNS) + " |\n|" + "---|" * len(_GPU_COLUMNS)
    rows = "\n".join("| " + " | ".join(cell(str(v)) if v not in (None, "") else "?" for v in _gpu_row(g)) + " |" for g in m.gpus)
    return f"## GPUs\n\n{head}\n{rows}"


def _gpu_row(g: Gpu) -> list[object]:
    p, t, c = g.power, g.thermal, g.clocks
    limit = p.enforced_limit_w if p.enforced_limit_w is not None else p.limit_w
    power = f"{limit:.0f} W" + (f" (default {p.default_limit_w:.0f})" if p.default_limit_w else "") if limit is not None else None
    link = "; ".join(f"Gen{r.current_gen or '?'} x{r.current_width or '?'} of Gen{r.max_gen or '?'} x{r.max_width or '?'}"
                     f" ({r.source}{', load' if r.under_load else ''})" for r in g.pcie.readings[:2])
    slowdown = t.slowdown_c if t.slowdown_c is not None else (
        t.gpu_c + t.slowdown_margin_c if t.gpu_c is not None and t.slowdown_margin_c is not None else None)
    temp = (f"{t.gpu_c:.0f} C" if t.gpu_c is not None else "?") + (f" (slowdown {slowdown:.0f})" if slowdown else "")
    mode = ", ".join(x for x in (g.virtualization_mode, "MIG" if g.mig_enabled else None) if x)
    ecc = None if g.ecc.enabled is None else "on" if g.ecc.enabled else "off"
    memory = f"{g.memory_total_mib / 1024:.1f} GiB" if g.memory_total_mib else None
    sm = f"{c.sm_mhz or '?'} of {c.max_sm_mhz or '?'} MHz" if c.sm_mhz or c.max_sm_mhz else None
    return [f"gpu{g.index}", g.name, g.pcie.bus_id, g.uuid, g.serial, g.vbios, memory, power, link, sm, temp, ecc, mode]


def _checklist(record: RunRecord) -> str:
    sections = []
    for group, lines in grouped(checklist(record)):
        rows = [f"| {MARK[line.state]} {WORD[line.state]} | {cell(line.item.title)} | {cell(line.figure)} |" for line in lines]
        sections.append(f"## {GROUP_TITLES[group]}\n\n_{GROUP_SOURCES[group]}_\n\n| | Item | What decided it |\n|---|---|---|\n"
                        + "\n".join(rows))
    return "\n\n".join(sections)


def _problems(findings: list[Finding]) -> str:
    found = problems(findings)
    if not found:
        return "## Problems\n\nNone found."
    return "## Problems\n\n" + "\n\n".join(_problem(same) for same in same_problems(found))


# What differs between GPUs in an otherwise identical remedy: `nvidia-smi -i 3`, a PCI bus ID.
_GPU_INDEX = re.compile(r"(-i )\d+\b")
_BUS_ID = re.compile(rf"\b{PCI_BUS_ID}\b")


def general_remedy(remedy: str | None) -> str | None:
    return _BUS_ID.sub("BUS_ID", _GPU_INDEX.sub(r"\1N", remedy)) if remedy else remedy


def same_problems(found: list[Finding]) -> list[list[Finding]]:  # the HTML report groups its cards the same way
    """Problems that read the same on several subjects, together, in first-seen order: six GPUs on
    x1 risers are one problem to a reader, not six."""
    groups: dict[tuple, list[Finding]] = {}
    for f in found:
        e = f.evidence
        key = (f.status, f.check, f.summary, e.measured, e.expected, e.source, general_remedy(f.remedy))
        groups.setdefault(key, []).append(f)
    return list(groups.values())


def _problem(same: list[Finding]) -> str:
    f = same[0]
    who = subject_range(list(dict.fromkeys(x.subject for x in same)))
    lines = [f"### {STATUS_MARK[f.status]} `{f.check}` {text(who)}", "", text(f.summary)]
    e = f.evidence
    remedy, general = f.remedy, general_remedy(f.remedy)
    if general and len(same) > 1 and len({x.remedy for x in same}) > 1:  # same_problems: one general remedy
        remedy = (f"{general} (N: the GPU's index, BUS_ID: its bus ID in the GPUs table)"
                  if "BUS_ID" in general else f"{general} (N: the GPU's index)")
    facts = [("Measured", e.measured), ("Expected", e.expected), ("Source", e.source), ("Fix / confirm", remedy)]
    listed = [f"- **{label}:** {text(value)}" for label, value in facts if value]
    return "\n".join(lines + ([""] + listed if listed else []))


def _quiet(findings: list[Finding]) -> str:
    """Passes and skips, one row per check and summary, in area order."""
    rows = [f"| {STATUS_MARK[status]} | {cell(area)} | `{check}` | {cell(who)} | {cell(summary)} |"
            for area, status, check, who, summary in quiet_rows(findings)]
    if not rows:
        return ""
    return "## Passed and skipped\n\n| Status | Area | Check | Subject | Summary |\n|---|---|---|---|---|\n" + "\n".join(rows)


def _measurements(record: RunRecord) -> str:
    rows: dict[tuple[str, str], list[str]] = {}
    for m in record.measurements:
        if m.value is not None and m.unit:
            rows.setdefault((m.name, m.unit), []).append(f"{m.subject} {number(m.value)}")
    if not rows:
        return ""
    body = "\n".join(f"| `{name}` | {cell(', '.join(values))} | {cell(unit)} |" for (name, unit), values in rows.items())
    return "## Measurements\n\n| Measurement | Values | Unit |\n|---|---|---|\n" + body


# -- a watch log (`gpuvet watch --log`) -------------------------------------------------------------

def _watched(record: RunRecord) -> str:
    """What the watch found, subject by subject, and each diagnosis change (as the HTML report's
    "Watched job" section, without its plots)."""
    log = record.options.get("log")
    note = f"Recorded by `gpuvet watch --log {log}`; times count from the start of each watch session." if log else ""
    found = [f"- {STATUS_MARK[f.status]} **{text(f.subject)}**: {text(f.summary)}"
             for f in record.findings if f.check.startswith("watch.")]
    body = "\n".join(found) if found else "Nothing was diagnosed."
    return "## Watched job\n\n" + (f"_{text(note)}_\n\n" if note else "") + body + "\n\n" + _diagnosis_changes(record)


def _diagnosis_changes(record: RunRecord) -> str:
    from ..wording import DIAGNOSIS_LABELS as LABELS

    rows = []
    for s in record.series:
        if s.get("name") != "watch.diagnosis":
            continue
        before: str | None = None
        for row in s.get("rows") or []:
            if len(row) != 3 or row[1] == "no_data":
                continue
            t, state, what = row
            seconds = t if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0
            rows.append((s.get("t0") or 0, seconds, str(s.get("subject")), before, str(state), str(what)))
            before = str(state)
    if not rows:
        return "### Diagnosis changes\n\nThe log records no diagnosis."
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    body = "\n".join(f"| +{t:.0f} s | {cell(subject)} | {cell(LABELS.get(before, before) if before else 'start')} → "
                     f"{cell(LABELS.get(state, state))} | {cell(what)} |" for _, t, subject, before, state, what in rows)
    return ("### Diagnosis changes\n\n_Each line: the moment a subject's diagnosis changed; it holds until that subject's "
            "next line._\n\n| Time | Subject | From → to | What was seen |\n|---|---|---|---|\n" + body)
