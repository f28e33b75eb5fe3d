"""The terminal report: problems in full, passes in one line each, the verdict last."""

from __future__ import annotations

import re
from itertools import groupby

from rich.console import Console
from rich.markup import escape

from ..facts import Machine
from ..record import FAIL, PASS, SKIP, WARN, Finding, RunRecord

STYLE = {FAIL: "bold red", WARN: "bold yellow", PASS: "green", SKIP: "dim"}
AREAS = (("gpu", "GPU"), ("cpu", "CPU benchmarks"), ("stack", "Software stack"), ("host", "Host"), ("storage", "Storage"))
_ORDER = {FAIL: 0, WARN: 1, PASS: 2, SKIP: 3}


def render(record: RunRecord, console: Console, verbose: bool = False) -> None:
    _header(record, console)
    _measurements(record, console)
    findings = record.findings
    for prefix, title in AREAS:
        area = [f for f in findings if f.check.split(".")[0] == prefix]
        if not area:
            continue
        console.print(f"\n[bold]{title}[/]")
        # Findings arrive in rule order; a stable sort puts failures first and keeps that order.
        for f in sorted(area, key=lambda f: _ORDER.get(f.status, 9)):
            if f.status in (FAIL, WARN):
                _problem(f, console)
        for status in (PASS, SKIP):
            _quiet([f for f in area if f.status == status], console, verbose)
    _verdict(record, console)


def _badge(status: str) -> str:
    return f"[{STYLE.get(status, '')}]{status.upper():4}[/]"


def _problem(f: Finding, console: Console) -> None:
    console.print(f"  {_badge(f.status)}  {f.check:<18} {f.subject:<8} {escape(f.summary)}")
    e = f.evidence
    parts = []
    if e.measured:
        parts.append(f"measured {e.measured}")
    if e.expected:
        parts.append(f"expected {e.expected}")
    if parts:
        console.print(f"        [dim]{escape(' · '.join(parts))}[/]")
    if e.source:
        console.print(f"        [dim]source: {escape(e.source)}[/]")
    if f.remedy:
        console.print(f"        [cyan]fix/confirm:[/] {escape(f.remedy)}")


def _quiet(findings: list[Finding], console: Console, verbose: bool) -> None:
    """Passes and skips in one line each: subjects with the same summary merged, and checks that
    skip for the same reason (no GPU at all) merged too."""
    if findings and findings[0].status == SKIP:
        by_reason: dict[str, list[Finding]] = {}
        for f in findings:
            by_reason.setdefault(f.summary, []).append(f)
        for summary, group in by_reason.items():
            checks = ", ".join(dict.fromkeys(f.check for f in group))
            subjects = subject_range(list(dict.fromkeys(f.subject for f in group)))
            console.print(f"  {_badge(SKIP)}  {checks:<18} {subjects:<8} {escape(summary)}", style="dim")
        return
    for check, group in groupby(findings, key=lambda f: f.check):
        by_summary: dict[str, list[str]] = {}
        for f in group:
            by_summary.setdefault(f.summary, []).append(f.subject)
        lines = list(by_summary.items())
        for summary, subjects in lines if verbose else lines[:1]:
            more = 0 if verbose else len(lines) - 1
            extra = f" [dim](+{more} more; -v lists them)[/]" if more else ""
            console.print(f"  {_badge(PASS)}  {check:<18} {subject_range(subjects):<8} {escape(summary)}{extra}")


def subject_range(subjects: list[str]) -> str:
    """["gpu0", "gpu1", "gpu2"] -> "gpu0-2"."""
    if len(subjects) == 1:
        return subjects[0]
    numbers = [re.fullmatch(r"gpu(\d+)", s) for s in subjects]
    if all(numbers):
        idx = sorted(int(m.group(1)) for m in numbers)
        if idx == list(range(idx[0], idx[-1] + 1)):
            return f"gpu{idx[0]}-{idx[-1]}"
        return "gpu" + ",".join(str(i) for i in idx)
    return ",".join(dict.fromkeys(subjects))


def measurement_lines(record: RunRecord) -> list[str]:
    """One line per measured quantity, every subject on it: "gemm.bf16  gpu0 756.2, gpu1 760.1 TFLOPS"."""
    rows: dict[tuple[str, str], list[str]] = {}
    for m in record.measurements:
        if m.value is None or not m.unit:
            continue  # notes of skipped benchmarks and telemetry summaries: the findings tell those
        rows.setdefault((m.name, m.unit), []).append(f"{m.subject} {m.value:.4g}")
    return [f"{name:<22} {', '.join(values)} {unit}" for (name, unit), values in rows.items()]


def _measurements(record: RunRecord, console: Console) -> None:
    lines = measurement_lines(record)
    if lines:
        console.print("\n[bold]Measured[/]")
        for line in lines:
            console.print(f"  {escape(line)}")


def _header(record: RunRecord, console: Console) -> None:
    m = record.machine
    when = record.started_at.replace("T", " ")[:16]
    console.print(f"[bold]gpuvet {record.tool.get('version', '')}[/] · {m.source} · {when} UTC · {record.duration_s:.1f} s")
    for line in machine_lines(m):
        console.print(f"  {escape(line)}")


def machine_lines(m: Machine) -> list[str]:
    lines = []
    if m.gpus:
        names: dict[str, int] = {}
        for g in m.gpus:
            names[g.name or "unknown GPU"] = names.get(g.name or "unknown GPU", 0) + 1
        gpus = ", ".join(f"{n} x {name}" for name, n in names.items())
        driver = f"driver {m.driver.version}" + (f" (CUDA {m.driver.cuda_version})" if m.driver.cuda_version else "") if m.driver.version else ""
        lines.append(f"GPUs: {gpus}" + (f" · {driver}" if driver else ""))
    else:
        lines.append(f"GPUs: none ({m.gpu_error or 'no NVIDIA GPU found'})")
    if m.host is not None:
        h = m.host
        parts = [f"{h.cpu_usable_cores or h.cpu_logical_cores or '?'} CPU cores ({h.cpu_model or 'unknown CPU'})"]
        if h.memory_total_bytes:
            parts.append(f"{h.memory_total_bytes / 1024**3:.0f} GiB RAM")
        where = ", ".join(x for x in (h.cloud, h.hypervisor and f"{h.hypervisor} VM", h.container and f"in {h.container}") if x)
        if where:
            parts.append(where)
        lines.append("Host: " + " · ".join(parts))
    if m.stack is not None and m.stack.torch.installed:
        t = m.stack.torch
        lines.append(f"PyTorch {t.version}" + (f" (CUDA {t.cuda})" if t.cuda else " (CPU build)"))
    lines += _capture_lines(m.captures)
    for probe, error in m.probe_errors.items():
        lines.append(f"probe {probe} failed: {error}")
    return lines


def _capture_lines(captures: list[dict[str, str]]) -> list[str]:
    """One line per file (a bundle's sections listed by kind), plus one per failed section."""
    files: dict[str, list[dict[str, str]]] = {}
    for c in captures:
        files.setdefault(c["path"].split(" [", 1)[0], []).append(c)
    lines = []
    for path, parts in files.items():
        kinds = ", ".join(dict.fromkeys(p["kind"] for p in parts if p["kind"] != "error"))
        lines.append(f"capture: {path} ({kinds or 'nothing readable'})")
        for p in parts:
            if p.get("note") and (p["kind"] == "error" or len(parts) == 1):
                section = p["path"][len(path):].strip(" []")
                lines.append(f"  {section + ': ' if section else ''}{p.get('note')}")
    return lines


def _verdict(record: RunRecord, console: Console) -> None:
    counts = {s: sum(1 for f in record.findings if f.status == s) for s in (FAIL, WARN, PASS, SKIP)}
    verdict = record.verdict
    text = {FAIL: "FAIL: something is wrong with this machine", WARN: "WARN: usable, with caveats", PASS: "PASS: nothing wrong found"}[verdict]
    console.print(
        f"\n[{STYLE[verdict]}]{text}[/]  ({counts[FAIL]} failed, {counts[WARN]} warnings, {counts[PASS]} passed, {counts[SKIP]} skipped)"
    )
