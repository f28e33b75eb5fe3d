"""What every rule needs: building findings, and the context a judgement runs in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..facts import Gpu, Machine
from ..record import FAIL, PASS, SKIP, WARN, Evidence, Finding, Measurement
from . import reference
from .reference import Reference

__all__ = ["PASS", "WARN", "FAIL", "SKIP", "Context", "finding", "why_missing", "gib", "pct"]


@dataclass
class Context:
    machine: Machine
    measurements: list[Measurement] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)

    def ref(self, gpu: Gpu) -> Reference | None:
        return reference.match(gpu.name)


def finding(
    check: str,
    subject: str,
    status: str,
    summary: str,
    measured: str | None = None,
    expected: str | None = None,
    source: str | None = None,
    remedy: str | None = None,
) -> Finding:
    return Finding(check, subject, status, summary, Evidence(measured, expected, source), remedy)


def why_missing(obj: Any, path: str, default: str = "not reported") -> str:
    """The recorded reason a fact is missing (`obj.unavailable[path]`), or `default`."""
    return (getattr(obj, "unavailable", None) or {}).get(path, default)


def gib(mib: float | None) -> str:
    return "?" if mib is None else f"{mib / 1024:.1f} GiB"


def pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.0f}%"


def subject(gpu: Gpu) -> str:
    return f"gpu{gpu.index}"
