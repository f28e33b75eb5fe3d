"""The run record: the single source of truth of a gpuvet run.

Every report is rendered from it, and an old record can be judged again with newer rules,
because it keeps the facts and measurements separate from the findings made of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from . import __version__
from .facts import Machine, from_dict, to_dict
from .untrusted_text import clean_strings

SCHEMA = "gpuvet.run/1"

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
# Measured, not judged: a figure was taken but there is nothing real to hold it against (no
# reference for this workload, both ends of a network test on one machine). Never a PASS.
MEASURED = "measured"
STATUSES = (PASS, WARN, FAIL, SKIP, MEASURED)
_SEVERITY = {PASS: 0, SKIP: 0, MEASURED: 0, WARN: 1, FAIL: 2}


@dataclass
class Evidence:
    measured: str | None = None
    expected: str | None = None
    source: str | None = None  # where the expectation comes from


@dataclass
class Finding:
    check: str  # stable id, e.g. "gpu.power_limit"
    subject: str  # "gpu0", "host", "machine", ...
    status: str  # pass / warn / fail / skip / measured
    summary: str  # one line a person reads
    evidence: Evidence = field(default_factory=Evidence)
    remedy: str | None = None  # the command that fixes or confirms it


@dataclass
class Measurement:
    name: str  # "gemm.bf16", "pcie.h2d_pinned", ...
    value: float | None
    unit: str
    subject: str  # "gpu0", "cpu", "host"
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunRecord:
    machine: Machine
    started_at: str
    duration_s: float = 0.0
    measurements: list[Measurement] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)  # what the user asked for (--expect ...)
    # Time series (telemetry, throughput): {"name", "subject", "interval_s", "columns", "rows"}.
    series: list[dict[str, Any]] = field(default_factory=list)
    tool: dict[str, str] = field(default_factory=lambda: {"name": "gpuvet", "version": __version__})

    @property
    def verdict(self) -> str:
        return verdict_of(self.findings)

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
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        data = clean_strings(data)  # a record file or store row may hold escape sequences (a hostname, a label)
        schema = data.get("schema")
        if schema != SCHEMA:
            raise ValueError(f"not a gpuvet run record (schema {schema!r}, expected {SCHEMA!r})")
        return cls(
            machine=from_dict(Machine, data.get("machine") or {}),
            started_at=data.get("started_at", ""),
            duration_s=float(data.get("duration_s") or 0.0),
            measurements=[from_dict(Measurement, m) for m in data.get("measurements") or []],
            findings=[from_dict(Finding, f) for f in data.get("findings") or []],
            options=dict(data.get("options") or {}),
            series=list(data.get("series") or []),
            tool=dict(data.get("tool") or {}),
        )


def verdict_of(findings: list[Finding]) -> str:
    """The worst status among pass/warn/fail (skips do not count)."""
    worst = PASS
    for f in findings:
        if _SEVERITY.get(f.status, 0) > _SEVERITY[worst]:
            worst = f.status
    return worst


def exit_code(findings: list[Finding]) -> int:
    return 1 if verdict_of(findings) == FAIL else 0
