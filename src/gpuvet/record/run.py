"""The run record: the single source of truth of a gpuvet run.

Every report is rendered from it, and an old record can be judged again with newer rules,
because it keeps the facts and measurements separate from the findings made of them.
"""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Annotated, Any, TypedDict, TypeGuard

from .. import __version__
from ..actions import NAMES as ACTION_NAMES
from ..actions import worst
from ..facts import Machine, from_dict, to_dict
from ..untrusted_text import clean_strings
from .details import details_type
from .errors import RecordError
from .validate import OneOf, check, json_kind

SCHEMA = "gpuvet.run/1"

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
# Measured, not judged: a figure was taken but there is nothing real to hold it against (no
# reference for this workload, both ends of a network test on one machine). Never a PASS.
MEASURED = "measured"
STATUSES = (PASS, WARN, FAIL, SKIP, MEASURED)  # the one list: the validator and the JSON Schema read it
SEVERITY = {PASS: 0, SKIP: 0, MEASURED: 0, WARN: 1, FAIL: 2}  # how bad: the worst of several decides


def timestamp(when: datetime | None = None) -> str:
    """A record's time (started_at, a store row's import time): `when` (aware; default now) in UTC
    to the second, "2026-12-02T02:14:30Z"."""
    return (when or datetime.now(timezone.utc)).astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_timestamp(text: str) -> datetime:
    """The time a record's ISO 8601 field names ("Z" read on Python 3.10 too); ValueError when it is not one."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass
class Evidence:
    measured: str | None = None
    expected: str | None = None
    source: str | None = None  # where the expectation comes from


@dataclass
class Finding:
    check: str  # stable id, e.g. "gpu.power_limit"
    subject: str  # "gpu0", "host", "machine", ...
    status: Annotated[str, OneOf(STATUSES)]  # pass / warn / fail / skip / measured
    summary: str  # one line a person reads
    evidence: Evidence = field(default_factory=Evidence)
    remedy: str | None = None  # the command that fixes or confirms it
    # What a remediator does (gpuvet.actions): none unless it failed or warned; None in a record
    # written before gpuvet named actions.
    action: Annotated[str, OneOf(ACTION_NAMES)] | None = None


@dataclass
class Measurement:
    name: str  # "gemm.bf16", "pcie.h2d_pinned", ...
    value: float | None
    unit: str
    subject: str  # "gpu0", "cpu", "host"
    details: dict[str, Any] = field(default_factory=dict)


if TYPE_CHECKING:
    class Valued(Measurement):
        """A Measurement whose value was taken: what has_value() narrows one to. A static view for
        the type checker only; every object is a Measurement."""

        value: float
else:
    Valued = Measurement


def has_value(m: Measurement) -> TypeGuard[Valued]:
    """Whether the measurement has a figure (a None value is a benchmark that gave none)."""
    return m.value is not None


class _SeriesBase(TypedDict):
    name: str  # "sustained.telemetry", "watch.diagnosis", ...
    subject: str  # "gpu0", "host", ...
    columns: list[str]
    rows: list[list[float | str | bool | None]]  # one value per column; None: not read


class Series(_SeriesBase, total=False):
    """A time series, columnar (samples.to_series makes telemetry ones)."""

    interval_s: float | None
    t0: float | None  # epoch seconds of the first row; rows' t counts from it
    facts: dict[str, Any]  # a watch log's GPU series: the facts its header gave
    pid: int | None  # a watch log's job series: the followed process


class ClusterPlace(TypedDict, total=False):
    """A cluster node's place in its multi-node run (gpuvet cluster)."""

    id: str
    node: str
    rank: int
    world_size: int
    launcher: str


class RunOptions(TypedDict, total=False):
    """What the user asked for, as the run recorded it; the judge weighs some of it."""

    profile: str  # "quick", "full", "watch", "soak", ...
    benchmarks: list[str]
    device: str
    expect: str | None  # the model the user paid for (--expect)
    soak_minutes: float | None
    paths: list[str] | None
    workload_steps: int | None
    preemptible: bool | None
    dataset_gb: float | None
    checkpoint_gb: float | None
    multi_node: bool | None
    label: str | None  # gpuvet label / --label
    price: float | None  # USD per hour
    log: str  # a watch log's file
    redacted: bool
    cluster: ClusterPlace  # a cluster node's run: its cluster id, name and rank
    step_wall_s: dict[str, float]  # each benchmark's wall time, held against `run --plan`'s forecast
    probe_budgets_s: dict[str, float]  # gpuvet health: each passive probe's deadline
    expect_gpus: int | None  # gpuvet health --expect-gpus
    summary: str  # gpuvet health: its one summary line
    skip: list[str]  # gpuvet health --skip: the checks an admin left out
    xid_window_s: float | None  # --xid-window: gpu.xid judges kernel-log events this recent; None: since boot
    peer: str  # gpuvet net test: the other end, its port and the engine
    port: int
    engine: str


class _ToolInfo(TypedDict, total=False):
    name: str
    version: str


@dataclass
class RunRecord:
    machine: Machine
    started_at: str
    duration_s: float = 0.0
    measurements: list[Measurement] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    options: RunOptions = field(default_factory=lambda: RunOptions())  # what the user asked for (--expect ...)
    series: list[Series] = field(default_factory=list)  # time series (telemetry, throughput)
    tool: dict[str, str] = field(default_factory=lambda: {"name": "gpuvet", "version": __version__})

    @property
    def verdict(self) -> str:
        return verdict_of(self.findings)

    @property
    def action(self) -> str:
        """The most disruptive action any finding asks for (gpuvet.actions): what a remediator does
        about this run as a whole."""
        return worst_action(self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "tool": self.tool,
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 3),
            "source": self.machine.source,
            "options": self.options,
            "machine": to_dict(self.machine),
            "measurements": [to_dict(m) for m in self.measurements],
            "findings": [to_dict(f) for f in self.findings],
            "series": self.series,
            "verdict": self.verdict,
            "action": self.action,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_dict(cls, data: Any) -> RunRecord:
        """A record from JSON (a file, the store, a cluster node), its types checked first:
        RecordError names the first field that is not what gpuvet writes."""
        data = clean_strings(check_run(data))  # a record may hold escape sequences (a hostname, a label)
        return cls(
            machine=from_dict(Machine, data.get("machine") or {}),
            started_at=data.get("started_at", ""),
            duration_s=float(data.get("duration_s") or 0.0),
            measurements=[from_dict(Measurement, m) for m in data.get("measurements") or []],
            findings=[from_dict(Finding, f) for f in data.get("findings") or []],
            options=typing.cast(RunOptions, dict(data.get("options") or {})),
            series=list(data.get("series") or []),
            tool=dict(data.get("tool") or {}),
        )


class RunRecordDict(TypedDict, total=False):
    """A run record as JSON (RunRecord.to_dict()): what check_run() holds a loaded one to."""

    schema: str
    tool: _ToolInfo
    started_at: str
    duration_s: float | None
    source: str | None
    options: RunOptions
    machine: Machine
    measurements: list[Measurement]
    findings: list[Finding]
    series: list[Series]
    verdict: Annotated[str, OneOf(STATUSES)]
    action: Annotated[str, OneOf(ACTION_NAMES)]  # the worst of the findings' actions


def check_run(data: Any, path: str = "") -> dict[str, Any]:
    """`data` checked to be a run record this gpuvet can read (RecordError says where not), NaN
    and infinite numbers made None; each measurement's details against its benchmark's type."""
    if not isinstance(data, dict):
        raise RecordError(f"{path or 'the record'}: not a gpuvet run record ({json_kind(data)})")
    if data.get("schema") != SCHEMA:
        raise RecordError(f"{path or 'the record'}: not a gpuvet run record "
                          f"(schema {str(data.get('schema'))[:40]!r}, expected {SCHEMA!r})")
    checked: dict[str, Any] = check(data, RunRecordDict, path)
    for i, m in enumerate(checked.get("measurements") or []):
        shape = details_type(m.get("name", ""))
        if shape is not None and "details" in m:
            where = f"measurements[{i}].details"
            m["details"] = check(m["details"], shape, f"{path}.{where}" if path else where)
    return checked


def verdict_of(findings: list[Finding]) -> str:
    """The worst status among pass/warn/fail (skips do not count)."""
    worst = PASS
    for f in findings:
        if SEVERITY.get(f.status, 0) > SEVERITY[worst]:
            worst = f.status
    return worst


def worst_action(findings: list[Finding]) -> str:
    """The most disruptive action of the findings' (none when none asks for one; a finding of a
    record written before actions were named counts as none)."""
    return worst([f.action for f in findings if f.action])


def exit_code(findings: list[Finding]) -> int:
    return 1 if verdict_of(findings) == FAIL else 0
