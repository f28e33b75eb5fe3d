"""What a result costs on each run: price per unit of work, a job's time and cost scaled from the
run it was timed on, and the runs ranked cheapest first.

Pure: run records and prices in, cost rows and a ranking out. The formulas are in the package's
docstring and, for the reader, in the notes each row adds.
"""

from __future__ import annotations

from ..record import RunRecord
from .data import COST_BASES, JOB_METRICS, SHAPE_DEPENDENT, SLOWEST_SUFFIX, TOKENS, machine_rate, machine_rates, run_figures, unit_of
from .money import USD, Currency
from .names import find_run, parse_job
from .rows import make_row
from .shapes import JobEstimate, Ranked, Row


def cost_rows(runs: list[RunRecord], prices: list[float | None], notes: list[str],
              shapes_differ: str | None = None, money: Currency = USD) -> list[Row]:
    """Price per unit of work, for each basis some priced run measured: on the sum of the GPUs'
    rates, and, where some machine's GPUs differ, paced by its slowest GPU (a data-parallel job)."""
    if all(p is None for p in prices):
        return []
    rows = []
    for metric, key, label, per_second_to_unit in COST_BASES:
        label = label.replace("USD", money.code, 1)
        unit = unit_of(metric)
        totals: list[float | None] = []
        paced: list[float | None] = []
        for record, price in zip(runs, prices):
            rate = machine_rates(record, metric, unit)
            if rate and rate.note:
                notes.append(rate.note)
            if price is None or rate is None:
                totals.append(None)
                paced.append(None)
                continue
            totals.append(price / (rate.total * per_second_to_unit))
            paced.append(price / (rate.slowest_paced * per_second_to_unit) if rate.slowest_paced > 0 else None)
        if not any(v is not None for v in totals):
            continue
        not_comparable = shapes_differ if key in SHAPE_DEPENDENT else None
        rows.append(make_row(key, label, money.code, totals, lower=True, not_comparable=not_comparable))
        notes.append(_formula(key).replace("USD", money.code, 1))
        if any(t is not None and p is not None and p > t * 1.005 for t, p in zip(totals, paced)):
            rows.append(make_row(key + SLOWEST_SUFFIX, f"{label.removesuffix(')')}, paced by the slowest GPU)"
                                 if label.endswith(")") else f"{label} (paced by the slowest GPU)",
                                 money.code, paced, lower=True, not_comparable=not_comparable))
            notes.append(f"{label}, paced by the slowest GPU = price per hour / (slowest GPU's rate x GPUs): what a "
                         f"synchronous data-parallel job pays, since every step waits for the slowest GPU; the ranking "
                         f"uses the sum of the GPUs' rates (independent work on each GPU)")
    return rows


def _formula(key: str) -> str:
    if key == "usd_per_million_tokens":
        return ("USD per million tokens = price per hour / (sum of the GPUs' workload tokens/s x 3600 / 1e6); "
                "each GPU is assumed to train its own replica (ideal data-parallel scaling)")
    what = "sustained" if key.endswith("sustained") else "bf16 GEMM"
    return (f"USD per PFLOP-hour ({what}) = price per hour / (sum of the GPUs' {what} TFLOPS / 1000): "
            f"what one PFLOPS held for an hour costs")


def job_estimate(job: str, names: list[str], runs: list[RunRecord], prices: list[float | None],
                 notes: list[str], comparable_tokens: bool = True) -> JobEstimate:
    hours, reference = parse_job(job)
    ref = find_run(reference, names, [r.options.get("label") for r in runs])
    metric = _job_metric(runs, ref, comparable_tokens)
    if metric is None:
        notes.append(f"job: {names[ref]} has none of {', '.join(JOB_METRICS)}; its time cannot be scaled to other runs")
    ref_rate = machine_rate(runs[ref], metric, unit_of(metric))[0] if metric else None
    estimated: list[float | None] = []
    for i, record in enumerate(runs):
        rate = machine_rate(record, metric, unit_of(metric))[0] if metric else None
        estimated.append(hours if i == ref else hours * ref_rate / rate if ref_rate and rate else None)
    costs = [h * p if h is not None and p is not None else None for h, p in zip(estimated, prices)]
    if metric:
        notes.append(f"job time on a run = {hours:g} h x machine {metric} on {names[ref]} / machine {metric} on that run; "
                     f"cost = hours x price per hour")
    return JobEstimate(job.strip(), names[ref], hours, metric, estimated, costs)


def _job_metric(runs: list[RunRecord], ref: int, comparable_tokens: bool = True) -> str | None:
    """The most job-like throughput the reference run has, preferring one every run has; the
    workload's tokens/s only where every run trained the same shape."""
    has = [{name for name, _ in run_figures(r)} for r in runs]
    metrics = JOB_METRICS if comparable_tokens else tuple(m for m in JOB_METRICS if m != TOKENS)
    candidates = [m for m in metrics if m in has[ref]]
    shared = [m for m in candidates if all(m in h for h in has)]
    return (shared or candidates)[0] if shared or candidates else None


# -- ranking ----------------------------------------------------------------------------------

def rank_runs(names: list[str], runs: list[RunRecord], prices: list[float | None], costs: list[Row],
              job: JobEstimate | None, money: Currency = USD) -> tuple[str | None, str | None, list[Ranked], dict[str, str]]:
    """Runs by cost per unit of work, cheapest first, on the first basis every priced run has (or
    the one most of them have)."""
    bases: list[tuple[str, str, list[float | None]]] = []
    if job and any(c is not None for c in job.cost_usd):
        bases.append(("job", f"{money.code} for the job ({job.description})", job.cost_usd))
    # Not the slowest-GPU rows (the sum is the basis, the notes say so), nor figures of different shapes.
    bases += [(row.name, row.label, row.values) for row in costs
              if not row.not_comparable and not row.name.endswith(SLOWEST_SUFFIX)]
    priced = [i for i, p in enumerate(prices) if p is not None]
    if not bases or not priced:
        why = ("no price per hour" if not priced else
               "different workload shapes: tokens/s not comparable" if costs else "none of the throughput figures a cost needs")
        return None, None, [], {n: why for n in names}
    key, label, values = max(bases, key=lambda b: sum(b[2][i] is not None for i in priced))
    ranked = sorted((Ranked(names[i], cost, price) for i in priced
                     if (cost := values[i]) is not None and (price := prices[i]) is not None),
                    key=lambda r: r.cost)
    unranked = {names[i]: "no price per hour" if prices[i] is None else f"not measured for {label}"
                for i in range(len(names)) if prices[i] is None or values[i] is None}
    return key, label, ranked, unranked


def speed_ratio(fast: str, slow: str, names: list[str], runs: list[RunRecord], basis: str | None,
                job: JobEstimate | None) -> float | None:
    """How many times as fast run `fast` does the work as run `slow`, on the ranking's basis."""
    if basis == "job" and job:
        a, b = job.hours[names.index(fast)], job.hours[names.index(slow)]
        return b / a if a and b else None
    metric = next((m for m, key, _, _ in COST_BASES if key == basis), None)
    if metric is None:
        return None
    a = machine_rate(runs[names.index(fast)], metric, unit_of(metric))[0]
    b = machine_rate(runs[names.index(slow)], metric, unit_of(metric))[0]
    return a / b if a and b else None
