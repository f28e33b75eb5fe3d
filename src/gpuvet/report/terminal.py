"""The terminal report: the seeds' checklist first, then the problems in full (failures first),
the skips with their reasons, one line counting the passes (`-v` lists them, one line per
check), the measurements, and the verdict last. Quiet on success: a clean machine is the
checklist, the skips and the verdict."""

from __future__ import annotations

import dataclasses
import re
import sys
from itertools import groupby


from ..console import Console, escape, Text
from ..facts import CaptureEntry, Machine
from ..wording import duration_text
from ..record import FAIL, MEASURED, PASS, SKIP, WARN, Finding, RunRecord
from .numbers import number
from .checklist import CROSSED, GROUP_SOURCES, GROUP_TITLES, TICKED, UNKNOWN, WARNED, checklist, grouped
from .checklist import subject_range as subject_range  # re-exported: other reports use it from here

STYLE = {FAIL: "bold red", WARN: "bold yellow", PASS: "green", SKIP: "dim", MEASURED: "cyan"}
MARK_STYLE = {TICKED: "bold green", CROSSED: "bold red", WARNED: "bold yellow", UNKNOWN: "dim"}
# Known areas in report order; a check from an area not listed here (a newer rule) still shows,
# under a title made from its prefix.
AREAS = (("gpu", "GPU"), ("cpu", "CPU benchmarks"), ("stack", "Software stack"), ("host", "Host"),
         ("storage", "Storage"), ("net", "Network"), ("workload", "Reference workload"), ("env", "Environment"))
_ORDER = {FAIL: 0, WARN: 1, PASS: 2, MEASURED: 3, SKIP: 4}
VERDICT_TEXT = {FAIL: "FAIL: something is wrong with this machine", WARN: "WARN: usable, with caveats",
                PASS: "PASS: nothing wrong found"}


def is_watch_log(record: RunRecord) -> bool:
    """A record made of a `gpuvet watch --log` file (runner.load_watch_log): readings of a running
    job, not a vetting run, so the acceptance checklist has nothing to tick."""
    return record.options.get("profile") == "watch"


# A watch log judges what the watched GPUs went through, not the machine as a whole.
WATCH_VERDICT_TEXT = {FAIL: "FAIL: the platform failed the watched job (heat, a hardware slowdown or a GPU lost)",
                      WARN: "WARN: the watched job was held back part of the time",
                      PASS: "PASS: the watched GPUs stayed ok"}


def stdout_console() -> Console:
    """The console reports print on: wrapped by report/terminal.py on a terminal; to a file or
    a pipe, whole lines and tables as wide as their content (rich would cut them at 80 columns)."""
    wide = None if sys.stdout.isatty() else 100_000
    return Console(highlight=False, soft_wrap=True, width=wide)


_NO_TORCH = re.compile(r"PyTorch is not installed: (`[^`]+`[^;]*); gpuvet never installs or replaces it for you")
NO_TORCH_SHORT = "PyTorch is not installed (see PyTorch above)"


def torch_missing_line(record: RunRecord) -> str | None:
    """The header's one line with the pip command to add PyTorch, when checks repeat it: every
    GPU benchmark and three checklist items give the same 150-character line otherwise."""
    if len(_repeating(record, _NO_TORCH)) < 2:
        return None
    found = _NO_TORCH.search(_repeating(record, _NO_TORCH)[0])
    assert found is not None
    return f"PyTorch: not installed; to add one this machine runs: {found.group(1)}; gpuvet never installs or replaces it"


def _repeating(record: RunRecord, pattern: re.Pattern[str]) -> list[str]:
    return [t for f in record.findings for t in (f.summary, f.evidence.measured) if t and pattern.search(t)]


def said_once(record: RunRecord) -> RunRecord:
    """The record with the reasons its header says whole shortened where checks repeat them: why no
    GPU could be read (a 90-character NVML message that a machine without a driver repeats in a
    dozen checks) to its first clause, and the pip line that would add PyTorch."""
    cuts: list[tuple[re.Pattern[str], str]] = []
    reason = record.machine.gpu_error
    if reason and len(reason) >= 40 and len(_repeating(record, re.compile(re.escape(reason)))) >= 3:
        cuts.append((re.compile(re.escape(reason)), f"{reason.split(':')[0]} (see GPUs above)"))
    if torch_missing_line(record):
        cuts.append((_NO_TORCH, NO_TORCH_SHORT))
    if not cuts:
        return record

    def cut(text: str | None) -> str | None:
        for pattern, short in cuts:
            text = pattern.sub(short.replace("\\", r"\\"), text) if text else text
        return text

    findings = [dataclasses.replace(f, summary=cut(f.summary) or "", evidence=dataclasses.replace(
        f.evidence, measured=cut(f.evidence.measured))) for f in record.findings]
    return dataclasses.replace(record, findings=findings)


def emit(console: Console, markup: str, indent: int, style: str = "") -> None:
    """One report line: on a terminal, wrapped at spaces to its width with continuation lines
    indented under the text they continue (a hanging indent), never split mid-word by the
    terminal; to a file or pipe, whole."""
    text = Text.from_markup(markup, style=style)
    width = console.width if console.is_terminal else 0
    if not width or text.cell_len <= width or indent >= width - 20:
        console.print(text, soft_wrap=True)
        return
    plain, cuts, start, room = text.plain, [], 0, width
    while len(plain) - start > room:
        cut = plain.rfind(" ", start + 1, start + room + 1)
        if cut <= start:  # one word longer than the line: cut it where the line ends
            cut = start + room
        cuts.append(cut)
        start, room = cut, width - indent
    for n, piece in enumerate(text.divide(cuts)):
        piece.rstrip()
        while n and piece.plain.startswith(" "):
            piece = piece[1:]
        console.print(piece if n == 0 else Text(" " * indent) + piece, soft_wrap=True)


_COLUMN_GAP = re.compile(r" {2,}")


def print_columns(console: Console, lines: list[str]) -> None:
    """Plain lines laid out in columns (the catalogue of checks, a run's plan), wrapped on a
    terminal with each continuation under the last column's start (its text), never mid-word."""
    for line in lines:
        starts = [m.end() for m in _COLUMN_GAP.finditer(line) if m.end() <= 60]
        emit(console, escape(line), indent=starts[-1] if starts else len(line) - len(line.lstrip()))


def render(record: RunRecord, console: Console, verbose: bool = False, saved_as: int | None = None) -> None:
    """The report; `saved_as`: the history's id for the run, said under the verdict where the
    reader looks last (it was a stderr line above the whole report)."""
    _header(record, console)  # the whole of a reason shared by many checks is said here, once
    record = said_once(record)
    if not is_watch_log(record):
        _checklist(record, console)
    _problems(record.findings, console)
    if verbose:
        _passes_and_skips(record.findings, console, verbose)
    else:
        _skips_and_pass_count(record.findings, console)
    _measurements(record, console)
    _verdict(record, console)
    if saved_as is not None:
        console.print(f"[dim]{saved_line(record, saved_as)}[/]")


def saved_line(record: RunRecord, run_id: int) -> str:
    """Where the run is kept and what to do with it next; a faulty machine's evidence first."""
    if record.verdict in (FAIL, WARN):
        return f"saved as run {run_id}: gpuvet report {run_id} --for-provider writes the evidence to send the provider"
    return f"saved as run {run_id}: gpuvet report {run_id} renders it again (--format html for a page)"


def _badge(status: str) -> str:
    return f"[{STYLE.get(status, '')}]{('MEAS' if status == MEASURED else status.upper()):4}[/]"


# -- checklist -------------------------------------------------------------------------------------

def _checklist(record: RunRecord, console: Console) -> None:
    lines_all = checklist(record)
    undecided = 0
    if record.options.get("profile") == "bench":
        # `gpuvet bench` measures what the user chose: show only the items it decided, not a page of "?".
        decided = [line for line in lines_all if line.state != UNKNOWN]
        undecided, lines_all = len(lines_all) - len(decided), decided
        if not decided:
            console.print(f"\n[dim]Acceptance checklist: these benchmarks alone decide none of its {undecided} items; "
                          "`gpuvet run` checks them all[/]")
            return
    for group, lines in grouped(lines_all):
        if not lines:
            continue
        console.print()
        emit(console, f"[bold]{GROUP_TITLES[group]}[/] [dim]({GROUP_SOURCES[group]})[/]", indent=2)
        for line in lines:
            style = MARK_STYLE[line.state]
            figure = escape(line.figure)
            emit(console, f"  [{style}]{line.mark}[/]  {line.item.title:<37} " + (f"[dim]{figure}[/]" if line.state == UNKNOWN else figure),
                 indent=43)
    if undecided:
        console.print(f"  [dim]and {undecided} more items these benchmarks do not decide; `gpuvet run` checks them all[/]")


# -- findings --------------------------------------------------------------------------------------

def area_title(check: str) -> str:
    prefix = check.split(".")[0]
    return dict(AREAS).get(prefix, prefix.capitalize())


def by_area(findings: list[Finding]) -> list[tuple[str, list[Finding]]]:
    """Findings grouped by area: known areas in AREAS order, then any other in order of appearance."""
    known = [title for _, title in AREAS]
    titles = list(dict.fromkeys(area_title(f.check) for f in findings))
    titles.sort(key=lambda t: known.index(t) if t in known else len(known))
    return [(t, [f for f in findings if area_title(f.check) == t]) for t in titles]


def quiet_rows(findings: list[Finding]) -> list[tuple[str, str, str, str, str]]:
    """Passes and skips as (area, status, check, subjects, summary): one row per check and
    summary, subjects merged ("gpu0-7"), passes before skips within each area."""
    rows = []
    for area, group in by_area(findings):
        by_key: dict[tuple[str, str, str], list[str]] = {}
        for f in group:
            if f.status in (PASS, MEASURED, SKIP):
                by_key.setdefault((f.status, f.check, f.summary), []).append(f.subject)
        for (status, check, summary), subjects in sorted(by_key.items(), key=lambda kv: _ORDER[kv[0][0]]):
            rows.append((area, status, check, subject_range(list(dict.fromkeys(subjects))), summary))
    return rows


ID_MIN_WIDTH = 18
NAME_MIN_WIDTH = 22  # the measurement-name column


def problems(findings: list[Finding]) -> list[Finding]:
    """Failures, then warnings; each in rule order (a stable sort keeps it)."""
    return sorted((f for f in findings if f.status in (FAIL, WARN)), key=lambda f: _ORDER[f.status])


def _problems(findings: list[Finding], console: Console) -> None:
    found = problems(findings)
    if not found:
        return
    failed, warned = sum(f.status == FAIL for f in found), sum(f.status == WARN for f in found)
    console.print(f"\n[bold]Problems[/] [dim]({failed} failed, {warned} warning{'' if warned == 1 else 's'})[/]")
    width = id_width([f.check for f in found])
    for group in same_problem_groups(found):
        _problem(group, console, width)


_GPU_INDEX = re.compile(r"(?<=-i )\d+|\bgpu\d+\b|\bGPU\d+\b")


def _without_index(text: str | None) -> str:
    return _GPU_INDEX.sub("#", text or "")


def same_problem_groups(found: list[Finding]) -> list[list[Finding]]:
    """Findings that say the same thing about several GPUs (8 x "not the 'H100' you expected"):
    one group each, in order of first appearance. Same check, status and summary once GPU
    numbers are set aside."""
    groups: dict[tuple[str, str, str, str], list[Finding]] = {}
    for f in found:
        groups.setdefault((f.check, f.status, f.subject.rstrip("0123456789"), _without_index(f.summary)), []).append(f)
    return list(groups.values())


def id_width(checks: list[str]) -> int:
    """The check-id column: wide enough for the longest id shown (stack.container_runtime), so the
    columns after it stay aligned; 18 at least."""
    return max([ID_MIN_WIDTH, *(len(check) for check in checks)])


def _problem(group: list[Finding], console: Console, width: int) -> None:
    f = group[0]
    subjects = subject_range(list(dict.fromkeys(g.subject for g in group)))
    emit(console, f"  {_badge(f.status)}  {f.check:<{width}} {subjects:<8} {escape(f.summary)}", indent=8)
    e = f.evidence
    parts = []
    if e.measured:
        alike = all(g.evidence.measured == e.measured for g in group)
        parts.append(f"measured {e.measured}" if alike else f"measured ({f.subject}) {e.measured}")
    if e.expected:
        parts.append(f"expected {e.expected}")
    if parts:
        emit(console, f"        [dim]{escape(' · '.join(parts))}[/]", indent=10)
    if e.source:
        emit(console, f"        [dim]source: {escape(e.source)}[/]", indent=10)
    if f.remedy:
        emit(console, f"        [cyan]fix/confirm:[/] {escape(_group_remedy(group))}", indent=10)


def _group_remedy(group: list[Finding]) -> str:
    """One remedy for the group: nvidia-smi's `-i` takes a list, so "-i 3" becomes "-i 0,1,2,3"
    when the remedies differ only in the GPU index; otherwise the first GPU's, marked as such."""
    first = group[0].remedy or ""
    if len(group) == 1 or all(g.remedy == first for g in group):
        return first
    if all(_without_index(g.remedy) == _without_index(first) for g in group) and "-i " in first:
        indexes = ",".join(g.subject.removeprefix("gpu") for g in group)
        return re.sub(r"(?<=-i )\d+", indexes, first)
    return f"({group[0].subject}) {first}"


def _passes_and_skips(findings: list[Finding], console: Console, verbose: bool) -> None:
    for title, area in by_area(findings):
        quiet = [f for f in area if f.status not in (FAIL, WARN)]
        if not quiet:
            continue
        console.print(f"\n[bold]{title}[/]")
        for status in (PASS, MEASURED, SKIP):
            _quiet([f for f in quiet if f.status == status], console, verbose)


def _skips_and_pass_count(findings: list[Finding], console: Console) -> None:
    """The default: what could not be checked (and why), then the passes counted in one line."""
    measured = [f for f in findings if f.status == MEASURED]
    if measured:
        console.print("\n[bold]Measured, not judged[/] [dim](no real expectation to hold these against)[/]")
        _quiet(measured, console, verbose=True)
    skips = [f for f in findings if f.status == SKIP]
    if skips:
        console.print("\n[bold]Not checked[/]")
        _quiet(skips, console, verbose=False)
    passed = [f for f in findings if f.status == PASS]
    if passed:
        checks = len(dict.fromkeys(f.check for f in passed))
        console.print(f"\n[green]{len(passed)} passed[/] [dim]({checks} check{'' if checks == 1 else 's'}; "
                      f"-v lists them)[/]")


def _quiet(findings: list[Finding], console: Console, verbose: bool) -> None:
    """Passes and skips in one line each: subjects with the same summary merged, and checks that
    skip for the same reason (no GPU at all) merged too."""
    rows: list[tuple[str, str, str]] = []  # (check, where, the rest) of each line
    if findings and findings[0].status == SKIP:
        by_reason: dict[str, list[Finding]] = {}
        for f in findings:
            by_reason.setdefault(f.summary, []).append(f)
        for summary, skipped in by_reason.items():
            checks = list(dict.fromkeys(f.check for f in skipped))
            where = subject_range(list(dict.fromkeys(f.subject for f in skipped)))
            if len(checks) == 1:
                rows.append((checks[0], where, escape(summary)))
            else:  # several checks, one reason: one line, the reason said once, no columns
                rows.append(("", "", f"{', '.join(checks)} ({where}): {escape(summary)}"))
    else:
        for check, group in groupby(findings, key=lambda f: f.check):
            by_summary: dict[str, list[str]] = {}
            for f in group:
                by_summary.setdefault(f.summary, []).append(f.subject)
            lines = list(by_summary.items())
            for summary, subjects in lines if verbose else lines[:1]:
                more = 0 if verbose else len(lines) - 1
                extra = f" [dim](+{more} more; -v lists them)[/]" if more else ""
                rows.append((check, subject_range(subjects), escape(summary) + extra))
    width = id_width([check for check, _, _ in rows if check])
    style = "dim" if findings and findings[0].status == SKIP else ""
    for check, where, rest in rows:
        columns = f"{check:<{width}} {where:<8} " if check else ""
        emit(console, f"  {_badge(findings[0].status)}  {columns}{rest}", indent=8, style=style)


# -- measurements, header, verdict -----------------------------------------------------------------

def measurement_lines(record: RunRecord) -> list[str]:
    """One line per measured quantity, every subject on it: "gemm.bf16  gpu0 756.2, gpu1 760.1 TFLOPS"."""
    rows: dict[tuple[str, str], list[str]] = {}
    for m in record.measurements:
        if m.value is None or not m.unit:
            continue  # notes of skipped benchmarks and telemetry summaries: the findings tell those
        rows.setdefault((m.name, m.unit), []).append(f"{m.subject} {number(m.value)}")
    width = max([NAME_MIN_WIDTH, *(len(name) for name, _ in rows)])
    return [f"{name:<{width}} {', '.join(values)} {unit}" for (name, unit), values in rows.items()]


def _measurements(record: RunRecord, console: Console) -> None:
    lines = measurement_lines(record)
    if lines:
        console.print("\n[bold]Measured[/]")
        indent = 3 + max([NAME_MIN_WIDTH, *(len(line.split(" ", 1)[0]) for line in lines)])  # under the values
        for line in lines:
            emit(console, f"  {escape(line)}", indent=indent)


def header_line(record: RunRecord) -> str:
    when = record.started_at.replace("T", " ")[:16]
    redacted = " · redacted" if record.options.get("redacted") else ""
    # A capture's record is dated when it was inspected; the capture's own time is on its line below.
    source = "capture, inspected" if record.machine.source == "capture" else record.machine.source
    return f"gpuvet {record.tool.get('version', '')} · {source} {when} UTC · {record.duration_s:.1f} s{redacted}"


def options_line(record: RunRecord) -> str:
    """What the run was asked to do ("" when nothing was asked); a synthetic record says so here."""
    parts = []
    for key, value in record.options.items():
        if key == "redacted" or value in (None, "", [], {}) or isinstance(value, dict):
            continue  # a dict is bookkeeping (each step's wall time), not something the user asked
        shown = ", ".join(map(str, value)) if isinstance(value, list) else value
        if key.endswith("_s") and isinstance(value, (int, float)) and not isinstance(value, bool):
            key, shown = key.removesuffix("_s"), duration_text(float(value))  # xid_window_s 7200.0 -> xid_window 2 h
        parts.append(f"{key} {shown!r}" if key == "expect" else f"{key}: {shown}" if key == "synthetic" else f"{key} {shown}")
    return ("options: " + " · ".join(parts)) if parts else ""


def _header(record: RunRecord, console: Console) -> None:
    console.print(f"[bold]{escape(header_line(record))}[/]")
    for line in machine_lines(record.machine) + [torch_missing_line(record), options_line(record)]:
        if line:
            emit(console, f"  {escape(line)}", indent=4)


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


def _capture_lines(captures: list[CaptureEntry]) -> list[str]:
    """One line per file (a bundle's sections listed by kind), plus one per failed section."""
    files: dict[str, list[CaptureEntry]] = {}
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


def status_counts(record: RunRecord) -> dict[str, int]:
    return {s: sum(1 for f in record.findings if f.status == s) for s in (FAIL, WARN, PASS, MEASURED, SKIP)}


# Every check skipped: "nothing wrong found" would read as a clean bill of health for a machine
# nothing was learnt about (a /proc/driver/nvidia/version or `lspci -nn` alone).
NOTHING_CHECKED_TEXT = ("SKIP: nothing could be checked from this input: capture `nvidia-smi -q -x > gpu.xml` "
                        "(and `nvidia-smi topo -m`) on the machine and inspect that, or run `gpuvet run` there")


def nothing_checked(record: RunRecord) -> bool:
    counts = status_counts(record)
    return counts[FAIL] + counts[WARN] + counts[PASS] == 0


def verdict_text(record: RunRecord) -> str:
    """The verdict in words; the record's verdict field stays the worst status (pass when all skip)."""
    if nothing_checked(record) and not is_watch_log(record):
        if status_counts(record)[MEASURED]:
            return ("MEASURED: figures were taken but none could be judged (nothing real to hold them against "
                    "here; see 'Measured, not judged')")
        if record.options.get("profile") == "bench":
            return "SKIP: nothing was measured: the benchmarks could not run here (why: under 'Not checked')"
        return NOTHING_CHECKED_TEXT
    if no_gpu_watched(record):
        return f"SKIP: no GPU was watched ({record.machine.gpu_error or 'no NVIDIA GPU found'})"
    text = (WATCH_VERDICT_TEXT if is_watch_log(record) else VERDICT_TEXT)[record.verdict]
    counts = status_counts(record)
    if record.verdict == PASS and not is_watch_log(record) and counts[SKIP] + counts[MEASURED] >= counts[PASS]:
        # 1 pass and 15 skips is not a clean bill of health: say how little was judged.
        text += f", but only {counts[PASS]} of {sum(counts.values())} findings could be judged (see 'Not checked')"
    return text


def verdict_line(record: RunRecord) -> str:
    counts = status_counts(record)
    measured = f"{counts[MEASURED]} measured (not judged), " if counts[MEASURED] else ""
    return (f"{verdict_text(record)}  ({counts[FAIL]} failed, {counts[WARN]} warnings, "
            f"{counts[PASS]} passed, {measured}{counts[SKIP]} skipped)")


def no_gpu_watched(record: RunRecord) -> bool:
    """A watch log of a host without GPUs (a job watched with --pid still has its own line)."""
    return is_watch_log(record) and not record.machine.gpus and record.verdict == PASS


def _verdict(record: RunRecord, console: Console) -> None:
    skipped = (nothing_checked(record) and not is_watch_log(record)) or no_gpu_watched(record)
    style = STYLE[SKIP] if skipped else STYLE[record.verdict]
    text, _, rest = verdict_line(record).partition("  ")
    console.print()
    emit(console, f"[{style}]{escape(text)}[/]  {escape(rest)}", indent=2)
