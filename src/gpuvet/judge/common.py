"""What every rule needs: building findings, and the context a judgement runs in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import actions, catalog
from ..facts import Gpu, Machine
from ..wording import NOT_IN_PLAY, subject_range  # noqa: F401 (words the report shares: kept below both)
from ..occupancy import NO_CONTEXT_MIB, holds_no_context  # noqa: F401 (whether a CUDA context is on a GPU: run's rule too)
from ..record import FAIL, PASS, SKIP, WARN, Evidence, Finding, Measurement
from ..specs import reference
from ..specs.reference import Reference

__all__ = ["PASS", "WARN", "FAIL", "SKIP", "Context", "finding", "why_missing", "gib", "pct", "holds_no_context", "NO_CONTEXT_MIB", "NOT_IN_PLAY"]



@dataclass
class Context:
    machine: Machine
    measurements: list[Measurement] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)

    def ref(self, gpu: Gpu) -> Reference | None:
        return reference.match(gpu.name, gpu.memory_total_mib)


def finding(
    check: str,
    subject: str,
    status: str,
    summary: str,
    measured: str | None = None,
    expected: str | None = None,
    source: str | None = None,
    remedy: str | None = None,
    action: str | None = None,
) -> Finding:
    """A finding, with the action a remediator takes: the rule's `action`, else the catalogue's
    default for the check, kept only where it failed or warned (actions.for_status)."""
    return Finding(check, subject, status, summary, Evidence(measured, expected, source), remedy,
                   settled_action(check, status, action))


def settled_action(check: str, status: str, action: str | None = None) -> str:
    """The action a finding of this check and status carries (see finding())."""
    entry = catalog.BY_ID.get(check)
    return actions.for_status(action or (entry.action if entry else actions.NONE), status)


def why_missing(obj: Any, path: str, default: str = "not reported") -> str:
    """The recorded reason a fact is missing (`obj.unavailable[path]`), or `default`."""
    return (getattr(obj, "unavailable", None) or {}).get(path, default)


def gib(mib: float | None) -> str:
    return "?" if mib is None else f"{mib / 1024:.1f} GiB"


def pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.0f}%"


def subject(gpu: Gpu) -> str:
    return f"gpu{gpu.index}"
