"""gpu.xid: what the NVIDIA driver logged in the kernel log since boot (Xid, NVSwitch SXid, a GPU
fallen off the bus, a GPU the driver could not start, PCIe AER errors on a GPU's bus), judged
against the Xid table in data/xid.csv (code, meaning, hardware or not, what to do; every row
sourced from NVIDIA's Xid catalogue or the Fabric Manager guide's SXid list). Each row keeps NVIDIA's
resolution bucket and the gpuvet action it maps to (gpuvet.actions), so a remediator acts on it; a
code the table lacks fails, as the catalogue's answer for an unknown code is CONTACT_SUPPORT."""

from __future__ import annotations

import csv
import functools
import io
import re
from dataclasses import dataclass
from datetime import datetime
from importlib import resources

from ..catalog import checked
from .. import actions
from ..wording import duration_text  # noqa: F401 (the report words windows the same way)
from ..facts import Gpu, KernelEvent, KernelLog
from ..record import MEASURED, Finding
from .common import FAIL, PASS, SKIP, WARN, Context, finding, subject

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
GPU_XID = checked("gpu.xid")

XID_FILE = "xid.csv"
TABLE_NOTE = "gpuvet's Xid table (specs/data/xid.csv)"
# What a user runs where gpuvet could not read the log, or to read it again on that machine.
READ_COMMAND = "sudo dmesg -T | grep -E 'NVRM|SXid|AER'"
EXPECTED = "no Xid, SXid, fallen-off-the-bus, RmInitAdapter or PCIe AER error for the GPUs since boot"
# `--xid-window`: the kernel log keeps an Xid until reboot, so after a GPU reset (`nvidia-smi -r`)
# or a fix a since-boot rule fails the node for ever. Events older than the window are shown as
# history, not judged. `gpuvet health` defaults to 2 h, the window of Azure's health checks
# (Azure/azurehpc-health-checks customTests/azure_gpu_xid.nhc lines 15-18 @ 0e0a1ac: time_threshold=2,
# hours; line 42 fails only an Xid within it); `run` and `inspect` judge since boot unless asked.
HEALTH_WINDOW_S = 2 * 3600.0
WINDOW_SOURCE = "Azure/azurehpc-health-checks azure_gpu_xid.nhc (Xid in the last 2 h)"


@dataclass(frozen=True)
class XidEntry:
    kind: str  # "xid" or "sxid"
    code: int
    name: str
    hardware: bool
    verdict: str  # fail, warn, pending (fail while a row or page waits for a reset), line (the line says fatal or not)
    action: str  # what a person does, in words
    meaning: str
    source: str
    resolution: str = ""  # NVIDIA's "Resolution Bucket (Immediate Action)"; "" where the catalogue gives none
    remediation: str = actions.NONE  # the gpuvet action (gpuvet.actions) a remediator takes

    @property
    def unused(self) -> bool:
        """A code NVIDIA's catalogue lists as unused on A100 and newer GPUs."""
        return self.name.startswith("Unused")


@functools.cache
def xid_table() -> dict[tuple[str, int], XidEntry]:
    text = resources.files("gpuvet.specs").joinpath("data").joinpath(XID_FILE).read_text(encoding="utf-8")
    table = {}
    for row in csv.DictReader(io.StringIO(text)):
        entry = XidEntry(row["kind"], int(row["code"]), row["name"], row["hardware"] == "yes", row["verdict"],
                         row["action"], row["meaning"], row["source"], row["resolution"], row["remediation"])
        table[(entry.kind, entry.code)] = entry
    return table


def check_xid(ctx: Context) -> list[Finding]:
    machine = ctx.machine
    log = machine.kernel_log
    during_run = machine.nvml_xid_events
    findings: list[Finding] = []
    if _no_gpu_here(ctx):
        return [finding(GPU_XID, "machine", SKIP, f"no NVIDIA GPU on this machine ({machine.gpu_error}): "
                        "no Xid to look for", remedy="`nvidia-smi -L` lists the GPUs the driver sees")]
    if log is None or not log.read:
        findings.append(_unread(log, machine.source))
        if not during_run:
            return findings
        log = KernelLog(source="NVML events during gpuvet's benchmarks", read=True)
    gpu_of_bus = {g.pcie.bus_id: g for g in machine.gpus if g.pcie.bus_id}
    gpu_buses = set(gpu_of_bus) | set(log.gpu_buses)
    window = _Window(ctx.options.get("xid_window_s"), log)
    groups: dict[tuple[str, str, int | str | None], list[KernelEvent]] = {}
    older: dict[tuple[str, str, int | str | None], list[KernelEvent]] = {}
    live_ids = {id(e) for e in during_run}  # NVML's, while gpuvet ran: recent by definition
    for event in log.events + during_run:
        if event.kind == "aer" and event.bus_id not in gpu_buses:
            continue  # a root port's or a NIC's error is not this check's; the GPU's own bus is
        recent = id(event) in live_ids or window.holds(event)
        (groups if recent else older).setdefault(_key(event), []).append(event)
    for key, events in groups.items():
        judged = _judge_group(key, events, log, gpu_of_bus)
        judged.summary += window.note(older.pop(key, []), events)
        if window.seconds is not None and "could not be applied" not in judged.summary:
            judged.evidence.expected = EXPECTED.replace("since boot", window.since())
        findings.append(judged)
    findings += [_older(key, events, log, gpu_of_bus, window) for key, events in older.items()]
    if findings and findings[0].status == SKIP:
        return findings  # only NVML's events were judged: no pass for what the log would have shown
    hit = {key[0] for key in groups}
    clean = [g for g in machine.gpus if g.pcie.bus_id not in hit]
    if not groups:
        findings.append(_clean("machine", log, "no NVIDIA driver error", window))
    elif clean:
        findings += [_clean(subject(g), log, "none for this GPU", window) for g in clean]
    return findings


def _no_gpu_here(ctx: Context) -> bool:
    """Live, NVML saw no GPU and the kernel log names none: a kernel log without Xid lines says
    nothing about GPUs that are not there. A capture's log stands alone (no report beside it), and a
    log with NVIDIA events (a GPU fallen off the bus is not seen by NVML) is always judged."""
    machine, log = ctx.machine, ctx.machine.kernel_log
    if machine.source == "capture" or machine.gpus or not machine.gpu_error or machine.nvml_xid_events:
        return False
    return log is None or not (log.events or log.gpu_buses)


def _age_text(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 0):.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 48 * 3600 else f"{seconds / 86400:.1f} d"


def _instant(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


class _Window:
    """Which events `--xid-window` judges: those at most `seconds` before the log's `now` (when it
    was read, or a capture's last dated line). Events with no date are judged, and said to be."""

    def __init__(self, seconds: float | None, log: KernelLog):
        self.seconds, self.now, self.now_is = seconds, _instant(log.now), log.now_is

    def age_s(self, event: KernelEvent) -> float | None:
        at = _instant(event.at)
        if at is None or self.now is None:
            return None
        try:
            return (self.now - at).total_seconds()
        except TypeError:  # one dated with its zone, the other without: not comparable
            return None

    def holds(self, event: KernelEvent) -> bool:
        if self.seconds is None:
            return True
        age = self.age_s(event)
        return age is None or age <= self.seconds  # undated: judged (note() says so)

    @property
    def text(self) -> str:
        return f"the {duration_text(self.seconds or 0)} window"

    def note(self, before: list[KernelEvent], judged: list[KernelEvent]) -> str:
        """What a judged group's summary adds: the events before the window, or why it could not apply."""
        if self.seconds is None:
            return ""
        if any(self.age_s(e) is None for e in judged if not e.line.startswith("NVML Xid event")):
            return (f" ({self.text} could not be applied: the log's lines carry seconds since boot, not dates; "
                    "judged since the log begins)")
        if before:
            return f"; {len(before)} more line(s) before {self.text}"
        return f" (within {self.text})"

    def since(self) -> str:
        return f"in the last {duration_text(self.seconds)}" if self.seconds is not None else "since boot"


def _unread(log: KernelLog | None, source: str) -> Finding:
    if log is None:
        where = "no kernel log among the captures" if source == "capture" else "the kernel log was not read"
        return finding(GPU_XID, "machine", SKIP, f"{where}: Xid and SXid events not checked",
                       remedy=f"on that machine: `{READ_COMMAND}` (or `sudo journalctl -k -b > kernel.txt`), "
                              "then `gpuvet inspect kernel.txt` with its other captures")
    return finding(GPU_XID, "machine", SKIP, f"could not read the kernel log: {log.why_unread or 'no reason given'}",
                   remedy=f"`{READ_COMMAND}` as root (or `sudo journalctl -k -b`), or give its output to `gpuvet inspect`")


def _key(event: KernelEvent) -> tuple[str, str, int | str | None]:
    bus = event.bus_id or "?"
    if event.kind == "fallen_off_bus":
        return bus, "xid", 79  # the driver prints both; one event
    if event.kind == "aer":
        return bus, "aer", "corrected" if event.severity == "corrected" else "uncorrected"
    if event.kind == "reset_required":
        return bus, "reset_required", None
    return bus, event.kind, event.code


def _span(log: KernelLog) -> str:
    if log.since_boot:
        return f"since boot ({log.first or 'first line'} to {log.last or 'last line'})" if log.first else "since boot"
    if log.first:
        return f"from {log.first} to {log.last} (older lines may have left the kernel's ring buffer)"
    return "lines without times"


def _clean(subj: str, log: KernelLog, what: str, window: _Window) -> Finding:
    if window.seconds is None:
        return finding(GPU_XID, subj, PASS, f"{what} in the kernel log ({log.lines} lines {_span(log)})",
                       measured=f"0 events for {'the GPUs' if subj == 'machine' else subj} in {log.lines} lines of {log.source}",
                       expected=EXPECTED, source=f"the kernel log ({log.source}) against {TABLE_NOTE}")
    return finding(GPU_XID, subj, PASS, f"{what} {window.since()} of the kernel log ({log.lines} lines {_span(log)})",
                   measured=f"0 events {window.since()} for {'the GPUs' if subj == 'machine' else subj} "
                            f"in {log.lines} lines of {log.source}",
                   expected=EXPECTED.replace("since boot", window.since()),
                   source=f"the kernel log ({log.source}) against {TABLE_NOTE}; window: {WINDOW_SOURCE}")


def _older(key: tuple[str, str, int | str | None], events: list[KernelEvent], log: KernelLog,
           gpu_of_bus: dict[str, Gpu], window: _Window) -> Finding:
    """Events before the window: shown, so a user sees the history, but not judged."""
    bus, kind, code = key
    count, when = _times(events)
    ages = [a for a in (window.age_s(e) for e in events) if a is not None]
    entry = xid_table().get((kind, code)) if isinstance(code, int) else None
    if kind == "aer":
        label = f"{code} PCIe errors on this GPU's bus"
    elif kind == "init_failed":
        label = "RmInitAdapter failed"
    elif kind == "reset_required":
        label = "GPU reset required"
    else:
        label = _xid_label(kind, code) + (f" ({entry.name})" if entry else "")
    reference = "the log was read" if window.now_is == "read" else "the log's last line"
    age = _age_text(min(ages))
    return finding(GPU_XID, _subject(bus, kind, gpu_of_bus), MEASURED,
                   f"{label} at {when}, {age} ago, before {window.text} ({_times_text(count)}): history, not judged",
                   measured=f"{len(events)} line(s) in {log.source}; latest {age} before it was {reference}",
                   source=WINDOW_SOURCE,
                   remedy="none unless it comes back; `--xid-window boot` judges the whole boot")


def _xid_label(kind: str, code: int | str | None) -> str:
    return f"{'SXid' if kind == 'sxid' else 'Xid'} {code if code is not None else '(number unreadable)'}"


def _times_text(count: int) -> str:
    return f"{count} time{'s' if count != 1 else ''}"


def _subject(bus: str, kind: str, gpu_of_bus: dict[str, Gpu]) -> str:
    if bus == "?":
        return "machine"  # the line names no device ("NVRM: nvAssertOkFailedNoLog: ... Reset required")
    if kind == "sxid":
        return f"nvswitch {bus}"
    gpu = gpu_of_bus.get(bus)
    return subject(gpu) if gpu is not None else f"pci {bus}"


def _times(events: list[KernelEvent]) -> tuple[int, str]:
    """How many times it happened and when: lines at one instant are one event, and an SXid is
    logged over several lines (its severity line, then "Severity ..." and "Data {...}")."""
    heads = [e for e in events if e.kind != "sxid" or e.severity is not None] or \
        [e for e in events if "Data {" in e.line] or events
    instants = list(dict.fromkeys(_when(e) or _line_of(e) for e in heads))
    when = instants[0] if len(instants) == 1 else f"first {instants[0]}, last {instants[-1]}"
    return len(instants), when


def _line_of(event: KernelEvent) -> str:
    """An undated line, cited by its number in the log (1-based, as an editor shows it)."""
    return f"line {event.line_number}" if event.line_number else "an undated line"


def _when(event: KernelEvent) -> str | None:
    """The time as the log printed it, or its date where it printed seconds since boot and the
    boot time dated it (read live)."""
    if event.at and (event.when or "[").startswith("["):
        return event.at.replace("+00:00", "Z")
    if event.when and event.when.startswith("[+"):  # dmesg -H's seconds after the line before: no instant
        return None
    return event.when


def _judge_group(key: tuple[str, str, int | str | None], events: list[KernelEvent], log: KernelLog,
                 gpu_of_bus: dict[str, Gpu]) -> Finding:
    bus, kind, code = key
    subj = _subject(bus, kind, gpu_of_bus)
    count, when = _times(events)
    times = _times_text(count)
    example = events[0].line if len(events[0].line) <= 200 else events[0].line[:197] + "..."
    measured = f"{len(events)} line(s) in {log.source}, {when}; e.g. {example!r}"
    processes = sorted({e.process for e in events if e.process})
    hit = f"; hit process {', '.join(processes)}" if processes else ""
    # NVML's events while gpuvet ran name the step they hit (their line: "... during benchmark gemm").
    steps = sorted({e.line.split(" during ", 1)[1] for e in events if e.line.startswith("NVML Xid event") and " during " in e.line})
    hit += f"; seen by NVML during {', '.join(steps)}" if steps else ""
    gpu = gpu_of_bus.get(bus)
    if kind == "init_failed":
        return finding(GPU_XID, subj, FAIL, f"the driver could not start this GPU (RmInitAdapter failed), {times} ({when})",
                       measured=measured, expected=EXPECTED, source=f"the kernel log ({log.source})",
                       remedy=f"reboot; if it repeats, ask the provider (the GPU, its power or its slot); `{READ_COMMAND}`",
                       action=actions.REBOOT_NODE)
    if kind == "reset_required":
        where = "this GPU" if gpu is not None else ("the GPU at " + bus if bus != "?" else "a GPU (the line names none)")
        return finding(GPU_XID, subj, FAIL,
                       f"the driver says {where} must be reset before it takes new work (NV_ERR_RESET_REQUIRED), {times} ({when})",
                       measured=measured, expected=EXPECTED, source=f"the kernel log ({log.source}); NVML's NVML_ERROR_RESET_REQUIRED",
                       remedy=f"drain the GPU's work and reset it (`nvidia-smi -r`{f' -i {gpu.index}' if gpu else ''}), or reboot; "
                              f"ask the provider if it comes back; `{READ_COMMAND}` shows the Xid before it",
                       action=actions.RESET_GPU)
    if kind == "aer":
        corrected = code == "corrected"
        text = ("corrected PCIe errors on this GPU's bus (the link retried; many slow it down)" if corrected
                else "uncorrected PCIe errors on this GPU's bus (data lost on the link; the GPU may fall off the bus)")
        return finding(GPU_XID, subj, WARN if corrected else FAIL, f"{text}, {times} ({when})", measured=measured,
                       expected=EXPECTED, source=f"the kernel log's PCIe AER lines ({log.source})",
                       remedy=f"`sudo lspci -vvv -s {bus}` (DevSta, AER counters); reseat or replace the riser or GPU, "
                              "or ask the provider", action=actions.NONE if corrected else actions.ASK_PROVIDER)
    entry = xid_table().get((kind, code)) if isinstance(code, int) else None
    fatal = any(e.severity == "fatal" for e in events)
    label = _xid_label(kind, code)
    if entry is None:
        # NVIDIA's catalogue answers a code it does not list with CONTACT_SUPPORT: a fault to drain
        # the node for, not a warning a scheduler lets pass.
        return finding(GPU_XID, subj, FAIL,
                       f"{label} ({'fatal, ' if fatal else ''}not in NVIDIA's Xid catalogue as gpuvet holds it), {times} ({when}){hit}",
                       measured=measured, expected=EXPECTED, source=f"the kernel log ({log.source}) against {TABLE_NOTE}",
                       remedy="drain the GPU and ask the provider (or NVIDIA support) with the log line; look the code up in "
                              "NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors)", action=actions.DRAIN_AND_REPAIR)
    status, why = _status(entry, fatal, gpu)
    cause = _stated_cause(events) if code == 45 and kind == "xid" else None
    if cause is not None:
        nature = cause
    elif entry.unused:
        nature = "a code NVIDIA lists as unused on A100 and newer GPUs"
    elif entry.hardware:
        nature = "a hardware fault" if status == FAIL else "a hardware event"
    else:
        nature = "an NVSwitch event the switch recovers from" if kind == "sxid" else "usually the application, not the GPU"
    remedy = entry.action.replace("-i N", f"-i {gpu.index}") if gpu is not None else entry.action
    bucket = f" (NVIDIA's resolution: {entry.resolution})" if entry.resolution else ""
    return finding(GPU_XID, subj, status, f"{label} ({entry.name}), {times} ({when}): {nature}; {entry.meaning}{why}{hit}",
                   measured=measured, expected=EXPECTED, source=f"{entry.source}, via {TABLE_NOTE}",
                   remedy=remedy + bucket, action=_pending_action(entry, status))


_CAUSED_BY = re.compile(r"caused by previous Xid (\d{1,9})")


def _stated_cause(events: list[KernelEvent]) -> str | None:
    """Xid 45 lines of newer drivers name the Xid that made the driver clean up ("... caused by
    previous Xid 149"): that Xid, not the application, is the cause."""
    causes = sorted({int(m.group(1)) for e in events if (m := _CAUSED_BY.search(e.line))})
    if not causes:
        return None
    named = []
    for code in causes:
        entry = xid_table().get(("xid", code))
        kind = "" if entry is None else (f" ({entry.name}, a hardware event)" if entry.hardware else f" ({entry.name})")
        named.append(f"Xid {code}{kind}")
    return f"caused by previous {' and '.join(named)}, as the line says; look for that Xid's own line"


def _pending_action(entry: XidEntry, status: str) -> str:
    """The row's action; a remap that waits for a reset (Xid 63 while pending) needs that reset."""
    return actions.RESET_GPU if entry.verdict == "pending" and status == FAIL else entry.remediation


def _status(entry: XidEntry, fatal: bool, gpu: Gpu | None) -> tuple[str, str]:
    if entry.verdict == "fail":
        return FAIL, ""
    if entry.verdict == "line":
        return (FAIL, " (the line says Fatal)") if fatal else (WARN, " (the line says non-fatal)")
    if entry.verdict == "pending":
        pending = None if gpu is None else (gpu.ecc.remapped_rows_pending or gpu.ecc.retired_pages_pending)
        if pending:
            return FAIL, " (a remap or retirement is still pending: reset the GPU)"
        return WARN, " (nothing pending now)" if pending is False else " (whether it is still pending is not known)"
    return WARN, ""

