"""The rows of a comparison: each quantity across the runs with its best run and the others'
distance from it, and each check's worst status per run.

Pure: run records in, rows out.
"""

from __future__ import annotations

import statistics

from .. import run_noise
from ..record import FAIL, SEVERITY, SKIP, WARN, Finding, RunRecord
from .data import CLOSER_TO_ZERO_NAMES, SHAPE_DEPENDENT, STEP_TIME, TOKENS, lower_is_better, run_figures, workload_shape
from .shapes import FindingRow, Row

def make_row(name: str, label: str, unit: str, values: list[float | None], lower: bool,
             not_comparable: str | None = None) -> Row:
    closer_to_zero = name in CLOSER_TO_ZERO_NAMES
    row = Row(name, label, unit, lower, values, closer_to_zero=closer_to_zero, not_comparable=not_comparable)
    known = [v for v in values if v is not None]
    if not known or not_comparable:
        row.relative_pct = [None] * len(values)
        return row
    if closer_to_zero:  # judged by size; a relative difference means nothing around zero
        best_value = min(known, key=abs)
        row.best_runs = [i for i, v in enumerate(values) if v is not None and abs(v) == abs(best_value)]
        row.best = row.best_runs[0]
        row.relative_pct = [None] * len(values)
        return row
    best_value = min(known) if lower and unit != "bool" else max(known)  # bool: 1 = yes is best
    row.best_runs = [i for i, v in enumerate(values) if v == best_value]  # a tie is best for all of them
    row.best = row.best_runs[0]
    # bool: a "-100%" would say nothing more than yes/no
    row.relative_pct = [None if unit == "bool" else _relative(v, best_value) for v in values]
    return row


def _relative(value: float | None, best: float) -> float | None:
    # A relative difference means nothing around zero (a decay of -3% vs +1%, 0 failures).
    if value is None or best <= 0 or value < 0:
        return None
    return (value - best) / best * 100


def measurement_rows(runs: list[RunRecord], shapes_differ: str | None) -> tuple[list[Row], int]:
    """Every quantity at least two runs measured (all of them when there is one run); how many
    quantities only one run has. `shapes_differ`: why the workload's figures are not ranked."""
    per_run = [run_figures(r) for r in runs]
    keys = list(dict.fromkeys(key for figures in per_run for key in figures))
    needed = min(2, len(runs))
    rows, single = [], 0
    for name, unit in keys:
        values = [figures[(name, unit)].value if (name, unit) in figures else None for figures in per_run]
        if sum(v is not None for v in values) < needed:
            single += 1
            continue
        row = make_row(name, name, unit, values, lower_is_better(name, unit), shapes_differ if name in SHAPE_DEPENDENT else None)
        row.within_spread = run_noise.within_spread(values, [run_noise.spread(r, name) for r in runs], row.best)
        rows.append(row)
        if name == STEP_TIME:
            rows += _step_time_spread(runs, shapes_differ)
    return rows, single


def workload_shapes_differ(names: list[str], runs: list[RunRecord]) -> tuple[str | None, list[str]]:
    """Why the runs' workload figures cannot be ranked (None: one shape, or none), and a note per
    shape saying which run trained what."""
    by_shape: dict[str, list[str]] = {}
    for name, record in zip(names, runs):
        shape = workload_shape(record)
        if shape:
            by_shape.setdefault(shape, []).append(name)
    unknown = [n for n, r in zip(names, runs) if TOKENS in {m.name for m in r.measurements} and not workload_shape(r)]
    if len(by_shape) + (1 if unknown and by_shape else 0) < 2:
        return None, []
    notes = [f"workload shape on {', '.join(runs_)}: {shape}" for shape, runs_ in by_shape.items()]
    if unknown:
        notes.append(f"workload shape on {', '.join(unknown)}: not recorded")
    return "different workload shapes: not comparable", notes


def _step_time_spread(runs: list[RunRecord], shapes_differ: str | None = None) -> list[Row]:
    """The workload's step-time p10 and p90 (kept in the measurement's details): a jittery
    machine shows a wide spread behind a fair median."""
    rows = []
    for key in ("p10", "p90"):
        values: list[float | None] = []
        for record in runs:
            found = [float(m.details[key]) for m in record.measurements
                     if m.name == STEP_TIME and m.value is not None and isinstance(m.details.get(key), (int, float))]
            values.append(statistics.median(found) if found else None)
        if sum(v is not None for v in values) >= min(2, len(runs)):
            rows.append(make_row(f"{STEP_TIME}.{key}", f"{STEP_TIME} {key}", "ms", values, lower=True,
                                 not_comparable=shapes_differ))
    return rows


# -- findings side by side --------------------------------------------------------------------

def finding_rows(runs: list[RunRecord]) -> list[FindingRow]:
    """Per check, the worst status each run got over its subjects; checks whose status differs
    between runs come first."""
    per_run = [_worst_by_check(r.findings) for r in runs]
    checks = list(dict.fromkeys(check for worst in per_run for check in worst))
    rows = []
    for check in checks:
        worst = [w.get(check) for w in per_run]
        statuses = [f.status if f else None for f in worst]
        judged = {s for s in statuses if s not in (None, SKIP)}
        rows.append(FindingRow(check, statuses, [f.summary if f else None for f in worst], differs=len(judged) > 1,
                               subjects=[f.subject if f else None for f in worst],
                               problem=bool(judged & {FAIL, WARN})))
    # stable: failures first, then warnings, then other differences
    rows.sort(key=lambda row: (not row.shown, -max(SEVERITY.get(s or SKIP, 0) for s in row.statuses)))
    return rows


def _worst_by_check(findings: list[Finding]) -> dict[str, Finding]:
    worst: dict[str, Finding] = {}
    for f in findings:
        current = worst.get(f.check)
        if current is None or SEVERITY.get(f.status, 0) > SEVERITY.get(current.status, 0):
            worst[f.check] = f
    return worst
