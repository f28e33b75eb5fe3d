"""`gpuvet health` for schedulers and people: one summary line first (it becomes a Slurm drain
reason and a Kubernetes node condition's message), then the problems, plain text.

node-problem-detector keeps the first `max_output_length` bytes of a plugin's trimmed stdout
(80 by default, pkg/custompluginmonitor/types/config.go), so the summary is ASCII and at most
SUMMARY_MAX bytes: what matters comes first in it."""

from __future__ import annotations

from .. import actions
from ..record import FAIL, MEASURED, SKIP, WARN, Finding, RunRecord
from ..record.verdict import EXIT_CODES, HEALTH_SCHEMA, HEALTHY, PROBLEM, AffectedGpu, HealthVerdict, Unread, VerdictFinding

SUMMARY_MAX = 80
PREFIX = "gpuvet:"  # every summary starts with it
# A Slurm drain reason is the summary with the check and its action first (`sinfo -R` shows 20
# characters of it), marked at its end as gpuvet's: only a drain gpuvet made is resumed by it.
DRAIN_MARK = "(gpuvet)"


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


def _named(findings: list[Finding]) -> tuple[Finding, int]:
    """The failure a summary names (the one asking for the most disruptive action, a GPU gone or
    wedged before its symptoms), and how many failed."""
    failed = sorted((f for f in findings if f.status == FAIL),
                    key=lambda f: (-actions.rank(f.action or actions.NONE), *_naming_order(f)))
    return failed[0], len(failed)


def summary_line(record: RunRecord, outcome: str) -> str:
    """One line of at most 80 bytes: "gpuvet: CHECK ACTION GPU (+N more): what failed" on a problem."""
    findings = record.findings
    if outcome == PROBLEM:
        first, count = _named(findings)
        more = f" (+{count - 1} more)" if count > 1 else ""
        where = "" if first.subject in ("machine", "gpu") else f" {first.subject}"
        return ascii_line(f"{PREFIX} {first.check} {first.action or actions.NONE}{where}{more}: {first.summary}")
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


def drain_reason(summary: str) -> str:
    """The Slurm drain reason for a problem's summary: its check and action first, gpuvet's mark last."""
    return f"{summary.removeprefix(PREFIX).strip()} {DRAIN_MARK}"


def is_gpuvet_reason(reason: str | None) -> bool:
    """Whether a drain reason is gpuvet's (this one's mark, or an older gpuvet's "gpuvet:" prefix)."""
    return bool(reason) and (str(reason).endswith(DRAIN_MARK) or str(reason).startswith(PREFIX))


def verdict(record: RunRecord, outcome: str) -> HealthVerdict:
    """`gpuvet health --json`: the run as one verdict object (record/verdict.py says its shape)."""
    by_subject = {f"gpu{g.index}": g for g in record.machine.gpus}
    findings = [VerdictFinding(check=f.check, subject=f.subject,
                               gpu_uuid=by_subject[f.subject].uuid if f.subject in by_subject else None,
                               status=f.status, action=f.action or actions.NONE, summary=f.summary, remedy=f.remedy)
                for f in record.findings]
    affected: list[AffectedGpu] = []
    for subject, gpu in by_subject.items():
        own = [f for f in findings if f["subject"] == subject and f["status"] in (FAIL, WARN)]
        if own:
            affected.append(AffectedGpu(index=gpu.index, uuid=gpu.uuid, bus_id=gpu.pcie.bus_id, name=gpu.name,
                                        status=FAIL if any(f["status"] == FAIL for f in own) else WARN,
                                        action=actions.worst([f["action"] for f in own]),
                                        checks=sorted({f["check"] for f in own})))
    unread = [Unread(check=f.check, subject=f.subject, reason=f.summary) for f in record.findings if f.status == SKIP]
    return HealthVerdict(schema=HEALTH_SCHEMA, tool=f"gpuvet {record.tool.get('version', '')}".strip(),
                         node=record.machine.host.hostname if record.machine.host else None,
                         checked_at=record.started_at, duration_s=round(record.duration_s, 3), status=outcome,
                         exit_code=EXIT_CODES[outcome], action=record.action, summary=record.options.get("summary") or "",
                         gpus=affected, findings=findings, unread=unread)
