"""`gpuvet health` for schedulers and people: one summary line first (it becomes a Slurm drain
reason and a Kubernetes node condition's message), then the problems, plain text.

node-problem-detector keeps the first `max_output_length` bytes of a plugin's trimmed stdout
(80 by default, pkg/custompluginmonitor/types/config.go), so the summary is ASCII and at most
SUMMARY_MAX bytes: what matters comes first in it."""

from __future__ import annotations

from ..judge.health import HEALTHY, PROBLEM
from ..record import FAIL, MEASURED, SKIP, WARN, Finding, RunRecord

SUMMARY_MAX = 80
PREFIX = "gpuvet:"  # every summary starts with it: Slurm drains gpuvet made are told apart by it


# Which failure names the node in a drain reason: a GPU gone or wedged before its symptoms.
_FIRST = {check: rank for rank, check in enumerate(("health.probe", "gpu.reachable", "gpu.xid", "gpu.ecc"))}


def _naming_order(f: Finding) -> tuple[int, int]:
    """By check, then the driver's own words first (an Xid line over the PCIe error before it)."""
    driver_said = f.summary.startswith(("Xid", "SXid")) or "fallen off the bus" in f.summary
    return _FIRST.get(f.check, len(_FIRST)), 0 if driver_said else 1


def ascii_line(text: str, limit: int = SUMMARY_MAX) -> str:
    """One line of printable ASCII, cut to `limit` bytes with "..." when longer."""
    flat = " ".join(text.split()).encode("ascii", "replace").decode("ascii")
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def summary_line(record: RunRecord, outcome: str) -> str:
    findings = record.findings
    if outcome == PROBLEM:
        failed = sorted((f for f in findings if f.status == FAIL), key=_naming_order)
        first = failed[0]
        more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
        where = "" if first.subject in ("machine", "gpu") else f"{first.subject} "
        return ascii_line(f"{PREFIX} {where}{first.check}{more}: {first.summary}")
    if outcome == HEALTHY:
        gpus = len(record.machine.gpus)
        warned = [f for f in findings if f.status == WARN]
        warning = f", {len(warned)} warning(s): {warned[0].subject} {warned[0].check}" if warned else ""
        return ascii_line(f"{PREFIX} healthy, {gpus} GPU(s){warning}")
    unknown = next((f for f in findings if f.check == "gpu.reachable" and f.status == SKIP), None)
    return ascii_line(f"{PREFIX} cannot tell: {unknown.summary if unknown else 'no GPU facts'}")


def detail_lines(record: RunRecord, verbose: bool = False) -> list[str]:
    """The problems (every finding with -v), each with its evidence and remedy, and the kernel-log
    events before gpu.xid's window (history a reset GPU leaves: shown, not failing), then the timing."""
    shown = [f for f in record.findings if verbose or f.status in (FAIL, WARN) or f.check == "health.probe"
             or (f.check == "gpu.xid" and f.status == MEASURED)]
    lines: list[str] = []
    for f in sorted(shown, key=_order):
        lines.append(f"  {f.status.upper():<5} {f.check:<18} {f.subject:<8} {f.summary}")
        if f.evidence.measured or f.evidence.expected:
            lines.append(f"        measured {f.evidence.measured or '?'} · expected {f.evidence.expected or '?'}")
        if f.remedy and f.status in (FAIL, WARN):
            lines.append(f"        fix/confirm: {f.remedy}")
    counts = {s: sum(f.status == s for f in record.findings) for s in (FAIL, WARN, SKIP)}
    passed = len(record.findings) - sum(counts.values())
    lines.append(f"  {counts[FAIL]} failed, {counts[WARN]} warning(s), {passed} passed, {counts[SKIP]} not checked "
                 f"in {record.duration_s:.2f} s")
    return lines


def _order(f: Finding) -> int:
    return {FAIL: 0, WARN: 1, SKIP: 2}.get(f.status, 3)
