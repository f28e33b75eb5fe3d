"""Runs side by side: the rows, the costs, the ranking and its one sentence, put together.

Pure: run records in, a `Comparison` out.
"""

from __future__ import annotations

import math

from .. import run_noise
from ..record import RunRecord
from .cost import cost_rows, job_estimate, rank_runs
from .data import gpu_summary
from .money import USD, Currency
from .names import unique_names
from .rows import finding_rows, measurement_rows, workload_shapes_differ
from .sentences import noise_caveat, verdict_sentence
from .shapes import Comparison, RunColumn


def compare(records: list[tuple[str, RunRecord, float | None]], job: str | None = None,
            money: Currency = USD) -> Comparison:
    """Runs side by side: (name, record, price per hour in `money` or None) each, in the order given."""
    if not records:
        raise ValueError("nothing to compare: give at least one run")
    names = unique_names([name for name, _, _ in records])
    runs = [r for _, r, _ in records]
    prices = [p for _, _, p in records]
    for name, price in zip(names, prices):
        if price is not None and (not math.isfinite(price) or price <= 0):
            raise ValueError(f"{name}: a price per hour must be a positive finite number, not {price}")
    shapes_differ, shape_notes = workload_shapes_differ(names, runs)
    notes: list[str] = list(shape_notes)
    measured, single = measurement_rows(runs, shapes_differ)
    costs = cost_rows(runs, prices, notes, shapes_differ, money)
    estimate = job_estimate(job, names, runs, prices, notes, comparable_tokens=not shapes_differ) if job else None
    basis, unit, ranking, unranked = rank_runs(names, runs, prices, costs, estimate, money)
    shared = {name: why for name, r in zip(names, runs) if (why := run_noise.contended(r))}
    notes += [f"{name}: {why}, so its figures may be low for reasons other than the machine" for name, why in shared.items()]
    verdict = verdict_sentence(ranking, unit, names, runs, prices, basis, estimate, money) if ranking else None
    if verdict:
        verdict += noise_caveat(basis, measured, names, ranking, shared)
    return Comparison(
        runs=[_column(name, r, p) for name, r, p in zip(names, runs, prices)],
        measurements=measured,
        costs=costs,
        findings=finding_rows(runs),
        job=estimate,
        rank_basis=basis,
        rank_unit=unit,
        ranking=ranking,
        unranked=unranked,
        verdict=verdict,
        notes=list(dict.fromkeys(notes)),
        single_run_measurements=single,
        currency=money.code,
        currency_symbol=money.symbol,
    )


def _column(name: str, record: RunRecord, price: float | None) -> RunColumn:
    return RunColumn(name, record.started_at, gpu_summary(record.machine), len(record.machine.gpus),
                     record.verdict, price)
