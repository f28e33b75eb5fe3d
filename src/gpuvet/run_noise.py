"""How far a run's own figures wander, so a comparison does not read noise as a difference.

Pure: run records in, fractions and sentences out. Two runs of one machine minutes apart gave
375 and 801 tokens/s; "0.5x as fast" said nothing about the machines when each run's step times
spread that wide, or when the CPUs were busy with something else (the CPU feed benchmark measures
the share of its cores' time its workers got).
"""

from __future__ import annotations

import statistics
from typing import Any, TypeGuard

from .specs.cpu_share import LOW_CPU_SHARE
from .record import Measurement, RunRecord

TOKENS = "workload.tokens_per_s"
STEP_TIME = "workload.step_time_ms"


def spread(record: RunRecord, name: str) -> float | None:
    """The run's own relative spread of a figure: half its p10-p90 range (or min-max, or the range
    of repeated runs) over its median; None when the record keeps no repeated readings of it."""
    source = STEP_TIME if name == TOKENS else name  # tokens/s is the step time turned over
    found = [s for m in record.measurements if m.name == source and m.value is not None
             for s in [_relative_spread(m)] if s is not None]
    return max(found) if found else None


def _relative_spread(m: Measurement) -> float | None:
    d: dict[str, Any] = m.details or {}
    centre = float(m.value) if m.value else None
    for low_key, high_key in (("p10", "p90"), ("min", "max")):
        low, high = d.get(low_key), d.get(high_key)
        if _number(low) and _number(high) and centre:
            return abs(float(high) - float(low)) / 2 / abs(centre)
    runs = [float(v) for v in d.get("runs") or [] if _number(v)]
    if len(runs) >= 3 and statistics.median(runs):
        return (max(runs) - min(runs)) / 2 / abs(statistics.median(runs))
    return None


def within_spread(values: list[float | None], spreads: list[float | None], best: int | None) -> list[bool]:
    """For each value: does it differ from the best one (index `best`) by less than the wider of
    the two runs' own spreads? Then the difference is not shown to be the machines'."""
    if best is None or values[best] is None or not values[best]:
        return [False] * len(values)
    top, top_spread = float(values[best] or 0.0), spreads[best]
    out = []
    for i, (v, s) in enumerate(zip(values, spreads)):
        widest = max(x for x in (s, top_spread, 0.0) if x is not None)
        out.append(v is not None and i != best and v != top and abs(top - v) / abs(top) <= widest)
    return out


def contended(record: RunRecord) -> str | None:
    """Why the run's CPUs were not its own, or None: the CPU feed workers got under 80% of their
    cores' time (other load, or the hypervisor's steal)."""
    for m in record.measurements:
        share = (m.details or {}).get("cpu_share")  # the CPU feed benchmark's (cpu.feed_rate)
        if _number(share) and float(share) < LOW_CPU_SHARE:
            return f"its CPU feed workers got only {100 * float(share):.0f}% of their cores' time (the CPUs were shared)"
    return None


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
