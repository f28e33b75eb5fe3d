"""A `gpuvet watch --log` file judged: the time each GPU spent in each diagnosis, the followed
job's CPU and IO, and what the log could not hold. Pure: the loader (runner.load_watch_log) reads
the file, this turns its series into findings."""

from __future__ import annotations

from typing import Any

from ..catalog import checked
from ..record import Finding
from .common import SKIP, finding
from .diagnose import watch_findings, watch_job_finding, watch_without_gpus

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
WATCH_DIAGNOSIS = checked("watch.diagnosis")
WATCH_JOB = checked("watch.job")
WATCH_LOG = checked("watch.log")


def judge_watch_log(series: list[dict[str, Any]], sessions: dict[Any, float], gpus_watched: bool,
                    gpu_error: str | None, notes: list[str], path: str) -> list[Finding]:
    """`sessions`: each session's t0 -> the seconds it covers; `notes`: lines the log could not hold."""
    findings = []
    diagnosed = {s["subject"] for s in series if s["name"] == WATCH_DIAGNOSIS and s["subject"].startswith("gpu")}
    for subject in sorted(diagnosed, key=gpu_order):
        own = [s for s in series if s["name"] == WATCH_DIAGNOSIS and s["subject"] == subject]
        changes = [(s["rows"], sessions[s["t0"]]) for s in own]
        t0 = own[0]["t0"] if len(own) == 1 else None  # one session: its states go on the clock
        findings += watch_findings(subject, [([tuple(r) for r in rows], end) for rows, end in changes], t0)
    if not gpus_watched:
        findings.append(watch_without_gpus(gpu_error))
    jobs = [s for s in series if s["name"] == WATCH_JOB]
    for pid in dict.fromkeys(s.get("pid") for s in jobs):
        job = watch_job_finding(pid if pid is not None else "?",
                                [(s["columns"], s["rows"]) for s in jobs if s.get("pid") == pid])
        findings += [job] if job is not None else []
    return findings + watch_log_notes(notes, path)


def watch_log_notes(notes: list[str], path: str) -> list[Finding]:
    """watch.log: a SKIP for each part of the log that could not be read (a line cut off mid-write)."""
    return [finding(WATCH_LOG, "log", SKIP, note, measured=note, source=path,
                    expected="whole JSON lines, as `gpuvet watch --log` writes them") for note in notes]


def gpu_order(subject: str) -> tuple[int, str]:
    digits = subject[3:]
    return (int(digits), subject) if digits.isdigit() else (1 << 30, subject)
