"""Telemetry samples and what is made of them, apart from the NVML sampler that reads them.

Pure data and arithmetic: the judge (watch diagnoses, sustained-load verdicts) and the report read
samples and their summaries from a record, on machines without a GPU or pynvml, so this module
imports nothing that touches the machine. `telemetry.Sampler` makes the samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from .facts import CLOCK_EVENT_REASONS
from .record.details import TelemetrySummary


@dataclass(slots=True)  # slots: a watch keeps tens of thousands of these per GPU
class Sample:
    t: float  # time.time() when read
    power_w: float | None = None
    power_limit_w: float | None = None  # enforced limit, read at most once per second
    sm_mhz: int | None = None
    mem_mhz: int | None = None
    temp_c: float | None = None
    util_pct: int | None = None
    mem_used_mib: int | None = None
    reasons: int | None = None  # clock-event reason bitmask, all flags together
    pcie_gen: int | None = None
    pcie_width: int | None = None
    violation_power_ns: int | None = None  # cumulative since driver load
    violation_thermal_ns: int | None = None


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Sample))


def next_tick(previous: float, now: float, interval_s: float) -> float:
    """The next tick on the grid previous + k * interval that is still ahead of `now`. A pass that
    overran skips the ticks it missed instead of bursting to catch up, so the cadence stays steady."""
    missed = max(0, math.floor((now - previous) / interval_s))
    return previous + (missed + 1) * interval_s


# -- for the run record and the judge --------------------------------------------------------------

def _json_safe(value: Any, digits: int = 3) -> Any:
    if isinstance(value, float):
        return round(value, digits) if math.isfinite(value) else None
    return value


def to_series(samples: list[Sample], name: str, subject: str, interval_s: float) -> dict:
    """Columnar samples for the run record; t is seconds since the first sample (t0, epoch seconds)."""
    rows = []
    for sample in samples:
        row = [_json_safe(getattr(sample, column)) for column in COLUMNS]
        row[0] = round(sample.t - samples[0].t, 3)
        rows.append(row)
    return {
        "name": name,
        "subject": subject,
        "interval_s": interval_s,
        "t0": samples[0].t if samples else None,
        "columns": list(COLUMNS),
        "rows": rows,
    }


def _known(samples: list[Sample], field: str) -> list[Any]:
    return [value for value in (getattr(s, field) for s in samples) if value is not None]


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 2) if values else None


def _max(values: list[Any]) -> Any:
    return max(values) if values else None


def _min(values: list[Any]) -> Any:
    return min(values) if values else None


def _reason_shares(samples: list[Sample]) -> dict[str, float] | None:
    """{reason: share of the samples whose mask was read that had it set}; None when no mask was read.
    Bits facts.CLOCK_EVENT_REASONS does not name (pynvml's 0x200 board limit...) appear as hex."""
    masks = _known(samples, "reasons")
    if not masks:
        return None
    seen = 0
    for mask in masks:
        seen |= mask
    shares = {}
    for bit in (1 << i for i in range(seen.bit_length())):
        if seen & bit:
            name = CLOCK_EVENT_REASONS.get(bit, f"0x{bit:x}")
            shares[name] = round(sum(1 for mask in masks if mask & bit) / len(masks), 3)
    return shares


def _violation_s(samples: list[Sample], field: str) -> float | None:
    """Seconds the counter grew over the window; None when unread or reset (driver reload)."""
    counts = _known(samples, field)
    if not counts or counts[-1] < counts[0]:
        return None
    return round((counts[-1] - counts[0]) / 1e9, 3)


def summarize(samples: list[Sample]) -> TelemetrySummary:
    """What a judge needs from a window of samples. Every key is always present; None: not known."""
    power = _known(samples, "power_w")
    pct_of_limit = [
        100.0 * s.power_w / s.power_limit_w for s in samples
        if s.power_w is not None and s.power_limit_w  # a 0 W limit is a bogus reading
    ]
    sm = _known(samples, "sm_mhz")
    return {
        "count": len(samples),
        "duration_s": round(samples[-1].t - samples[0].t, 3) if samples else None,
        "power": {"mean_w": _mean(power), "max_w": _max(power), "mean_pct_of_limit": _mean(pct_of_limit)},
        "sm_mhz": {"mean": _mean(sm), "min": _min(sm), "max": _max(sm)},
        "temp_c": {"max": _max(_known(samples, "temp_c"))},
        "util_pct": {"mean": _mean(_known(samples, "util_pct"))},
        "reasons": _reason_shares(samples),
        "violation_s": {
            "power": _violation_s(samples, "violation_power_ns"),
            "thermal": _violation_s(samples, "violation_thermal_ns"),
        },
        "pcie": {"max_gen": _max(_known(samples, "pcie_gen")), "max_width": _max(_known(samples, "pcie_width"))},
    }


def quantile(values: list[float] | list[int], q: float) -> float:
    """The q-quantile (0..1) of `values`, linear between the two nearest ranks: NumPy's default and
    statistics.quantiles(method="inclusive"), so p10 of 1..10 is 1.9 and p50 is the median. The one
    definition every benchmark's p10/p50/p90/p99 uses."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    position = min(max(q, 0.0), 1.0) * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return float(ordered[below] + (ordered[above] - ordered[below]) * (position - below))
