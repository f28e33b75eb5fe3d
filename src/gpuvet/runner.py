"""Putting a run together: probe (or read captures) -> judge -> one run record.

The CLI stays thin; this is where the stages meet. Judge and report never import probe.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

from . import judge
from .probe import capture, live
from .probe.errors import CaptureError
from .record import SCHEMA, RunRecord


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def run_live(quick: bool = True, expect: str | None = None, workdir: str | None = None) -> RunRecord:
    started, t0 = _now(), time.monotonic()
    options: dict[str, Any] = {"profile": "quick" if quick else "default"}
    if expect:
        options["expect"] = expect
    machine = live.collect(workdir=workdir)
    judge.annotate_references(machine)
    record = RunRecord(machine=machine, started_at=started, options=options)
    record.findings = judge.judge(machine, record.measurements, options)
    record.duration_s = time.monotonic() - t0
    return record


def inspect(paths: list[str], expect: str | None = None) -> RunRecord:
    """Judge captures taken elsewhere (several files of one machine merge into one record),
    or judge a stored run record again with the current rules."""
    started, t0 = _now(), time.monotonic()
    options: dict[str, Any] = {"expect": expect} if expect else {}
    records = [p for p in paths if _is_record(p)]
    if records:
        if len(paths) > 1:
            raise CaptureError(f"{records[0]}: a gpuvet run record is judged on its own; give it without other captures")
        return rejudge(load_record(records[0]), expect)
    captures = []
    for path in paths:
        captures += capture.read_captures(path)
    machine = capture.merge(captures)
    judge.annotate_references(machine)
    record = RunRecord(machine=machine, started_at=started, options=options)
    record.findings = judge.judge(machine, record.measurements, options)
    record.duration_s = time.monotonic() - t0
    return record


def rejudge(record: RunRecord, expect: str | None = None) -> RunRecord:
    """The same facts and measurements, judged by this version's rules."""
    options = dict(record.options)
    if expect:
        options["expect"] = expect
    judge.annotate_references(record.machine)
    record.options = options
    record.findings = judge.judge(record.machine, record.measurements, options)
    return record


def _is_record(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and SCHEMA.encode() in head


def load_record(path: str) -> RunRecord:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return RunRecord.from_dict(data)
    except OSError as err:
        raise CaptureError(f"{path}: cannot read it ({err.strerror or err})") from None
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise CaptureError(f"{path}: not a readable gpuvet run record ({err})") from None
