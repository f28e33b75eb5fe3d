"""The Markdown report: fit to paste into a support ticket or a GitHub issue.

The verdict, the machine in a few lines, the seeds' checklist as tables, every problem with its
evidence and the command that fixes or confirms it, then passes, skips and measurements.
"""

from __future__ import annotations

import re

from ..record import FAIL, PASS, SKIP, WARN, Finding, RunRecord
from .checklist import CROSSED, GROUP_SOURCES, GROUP_TITLES, TICKED, UNKNOWN, WARNED, WORD, checklist, grouped
from .terminal import header_line, machine_lines, options_line, problems, quiet_rows, verdict_line

MARK = {TICKED: "✅", CROSSED: "❌", WARNED: "⚠️", UNKNOWN: "❔"}
STATUS_MARK = {FAIL: "❌ FAIL", WARN: "⚠️ WARN", PASS: "✅ PASS", SKIP: "➖ SKIP"}


def render_markdown(record: RunRecord) -> str:
    parts = [
        _title(record),
        _machine(record),
        _checklist(record),
        _problems(record.findings),
        _quiet(record.findings),
        _measurements(record),
        f"<sub>{text(header_line(record))} · schema gpuvet.run/1</sub>",
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


# -- escaping --------------------------------------------------------------------------------------

def text(value: str) -> str:
    """Free text for Markdown: HTML-looking parts escaped outside `code spans`, which stay as written."""
    pieces = value.split("`")
    if len(pieces) % 2 == 0:  # an unpaired backtick: nothing is code
        return _plain(value)
    return "`".join(piece if i % 2 else _plain(piece) for i, piece in enumerate(pieces))


def _plain(value: str) -> str:
    # Only what a Markdown renderer would take for HTML: "<tag", "</", "&name;". Arrows like
    # "host<->GPU" stay readable in the raw text a support agent may see.
    value = re.sub(r"&(?=#?\w+;)", "&amp;", value)
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", value)


def cell(value: str) -> str:
    """Text for a table cell: pipes escaped everywhere (GFM splits on them even inside code)."""
    return re.sub(r"\s*\n\s*", " ", text(value)).replace("|", "\\|")


# -- sections --------------------------------------------------------------------------------------

def _title(record: RunRecord) -> str:
    verdict, _, counts = verdict_line(record).partition("  ")
    return f"# gpuvet: {verdict}\n\n**{STATUS_MARK[record.verdict]}** {counts}"


def _machine(record: RunRecord) -> str:
    lines = [f"- {text(line.strip())}" for line in machine_lines(record.machine) + [options_line(record)] if line]
    return "## Machine\n\n" + "\n".join(lines)


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
    return "## Problems\n\n" + "\n\n".join(_problem(f) for f in found)


def _problem(f: Finding) -> str:
    lines = [f"### {STATUS_MARK[f.status]} `{f.check}` {text(f.subject)}", "", text(f.summary)]
    e = f.evidence
    facts = [("Measured", e.measured), ("Expected", e.expected), ("Source", e.source), ("Fix / confirm", f.remedy)]
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
            rows.setdefault((m.name, m.unit), []).append(f"{m.subject} {m.value:.4g}")
    if not rows:
        return ""
    body = "\n".join(f"| `{name}` | {cell(', '.join(values))} | {cell(unit)} |" for (name, unit), values in rows.items())
    return "## Measurements\n\n| Measurement | Values | Unit |\n|---|---|---|\n" + body
