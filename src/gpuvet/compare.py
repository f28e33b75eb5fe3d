"""Runs side by side, and what a result costs on each (D2); one machine over time (D1).

Pure: run records in, a `Comparison` or a `Trend` out; no I/O. The seed's point (5.2) is that a
machine cheap per hour is often dear per result, so next to the measurements this module prices
the work itself:

* USD per PFLOP-hour achieved = price_per_hour / (median TFLOPS per GPU x GPUs / 1000), i.e.
  the price of one hour divided by the PFLOP-hours the machine delivers in that hour;
* USD per million training tokens = price_per_hour / (tokens/s x GPUs x 3600 / 1e6), from the
  reference workload's `workload.tokens_per_s`;
* a job the user describes ("8 h on RUN") is scaled to every other run by the ratio of machine
  throughput (workload tokens/s, else sustained TFLOPS, else bf16 GEMM TFLOPS), and costs
  hours x price.
"""

from __future__ import annotations

import math
import os
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from .facts import Machine
from .record import FAIL, PASS, SKIP, WARN, Finding, RunRecord

TOKENS = "workload.tokens_per_s"
SUSTAINED = "sustained.tflops"
GEMM_BF16 = "gemm.bf16"

# The figures a listing shows for every run: (measurement name, short label, unit).
KEY_FIGURES = (
    (GEMM_BF16, "bf16 GEMM", "TFLOPS"),
    (SUSTAINED, "sustained", "TFLOPS"),
    ("membw.copy", "mem copy", "GB/s"),
    ("pcie.h2d_pinned", "H2D", "GB/s"),
    (TOKENS, "workload", "tokens/s"),
)

# What "one unit of work" is priced in, in the order the ranking prefers them: the real training
# loop says most about a training job, the sustained load next, a short GEMM least.
COST_BASES = (
    (TOKENS, "usd_per_million_tokens", "USD per million training tokens", 3600 / 1e6),
    (SUSTAINED, "usd_per_pflop_hour_sustained", "USD per PFLOP-hour (sustained)", 1 / 1000),
    (GEMM_BF16, "usd_per_pflop_hour_bf16", "USD per PFLOP-hour (bf16 GEMM)", 1 / 1000),
)
JOB_METRICS = (TOKENS, SUSTAINED, GEMM_BF16)

LOWER_IS_BETTER_UNITS = {"ms", "us", "µs", "s", "count"}
LOWER_IS_BETTER_NAMES = {"sustained.decay_pct"}
_STATUS_RANK = {PASS: 0, SKIP: 0, WARN: 1, FAIL: 2}


# -- one run's figures ------------------------------------------------------------------------

@dataclass
class Figure:
    """One measured quantity of a run: the median over its subjects (GPUs, or cpu/machine)."""

    name: str
    unit: str
    value: float
    subjects: list[str]


def run_figures(record: RunRecord) -> dict[tuple[str, str], Figure]:
    """Every measured quantity of a run, keyed by (name, unit). Measurements without a value or
    unit (notes of skipped benchmarks) are left out, as the terminal report does."""
    values: dict[tuple[str, str], list[float]] = {}
    subjects: dict[tuple[str, str], list[str]] = {}
    for m in record.measurements:
        if m.value is None or not m.unit:
            continue
        values.setdefault((m.name, m.unit), []).append(float(m.value))
        subjects.setdefault((m.name, m.unit), []).append(m.subject)
    return {key: Figure(key[0], key[1], statistics.median(v), list(dict.fromkeys(subjects[key])))
            for key, v in values.items()}


def key_figures(record: RunRecord) -> dict[str, float]:
    """The KEY_FIGURES a run has, by name (median over GPUs)."""
    figures = run_figures(record)
    return {name: figures[(name, unit)].value for name, _, unit in KEY_FIGURES if (name, unit) in figures}


def gpu_summary(machine: Machine) -> str:
    """"8 x NVIDIA H100 80GB HBM3"; a CPU-only machine says so."""
    if not machine.gpus:
        cpu = machine.host.cpu_model if machine.host and machine.host.cpu_model else "unknown CPU"
        return f"no GPU ({cpu})"
    names = Counter(g.name or "unknown GPU" for g in machine.gpus)
    return ", ".join(f"{n} x {name}" for name, n in names.items())


def _machine_units(record: RunRecord, figure: Figure) -> tuple[int, str | None]:
    """How many times a per-subject figure counts towards the whole machine, and a note when
    that is an assumption. A per-GPU figure counts once per GPU of the machine (you pay for all
    of them, measured or not); a cpu or machine figure already is the machine's."""
    gpu_subjects = [s for s in figure.subjects if re.fullmatch(r"gpu\d+", s)]
    if not gpu_subjects:
        return 1, None
    units = max(len(gpu_subjects), len(record.machine.gpus))
    if len(gpu_subjects) < units:
        return units, (f"{figure.name}: measured on {len(gpu_subjects)} of {units} GPUs; "
                       f"the others are assumed to match their median")
    return units, None


def machine_rate(record: RunRecord, name: str, unit: str) -> tuple[float | None, str | None]:
    """The whole machine's throughput for a per-GPU figure: median x GPUs (None: not measured)."""
    figure = run_figures(record).get((name, unit))
    if figure is None or figure.value <= 0:
        return None, None
    units, note = _machine_units(record, figure)
    return figure.value * units, note


# -- comparison -------------------------------------------------------------------------------

@dataclass
class RunColumn:
    name: str
    started_at: str
    gpus: str
    gpu_count: int
    verdict: str
    price_per_hour: float | None


@dataclass
class Row:
    """One quantity across the runs. `relative_pct[i]` = (value_i - best) / |best| x 100: 0 for
    the best, negative for less throughput, positive for more latency or cost."""

    name: str
    label: str
    unit: str
    lower_is_better: bool
    values: list[float | None]
    best: int | None = None  # index of the best run (the first of `best_runs`)
    relative_pct: list[float | None] = field(default_factory=list)
    best_runs: list[int] = field(default_factory=list)  # every run with the best value (ties)


@dataclass
class FindingRow:
    check: str
    statuses: list[str | None]  # worst status per run over its subjects; None: not checked
    summaries: list[str | None]  # the worst finding's summary, per run
    differs: bool = False  # the runs that could check it disagree (a skip is no disagreement)


@dataclass
class JobEstimate:
    description: str  # as the user wrote it
    reference: str  # the run it was timed on
    hours_on_reference: float
    metric: str | None  # the throughput it was scaled by
    hours: list[float | None]
    cost_usd: list[float | None]


@dataclass
class Ranked:
    name: str
    cost: float
    price_per_hour: float


@dataclass
class Comparison:
    runs: list[RunColumn]
    measurements: list[Row]
    costs: list[Row]
    findings: list[FindingRow]
    job: JobEstimate | None
    rank_basis: str | None  # the cost row the ranking uses ("job" for the job's cost)
    rank_unit: str | None
    ranking: list[Ranked]
    unranked: dict[str, str]  # run -> why it could not be ranked
    verdict: str | None  # the one sentence: is the cheapest per hour the cheapest per result?
    notes: list[str]  # formulas and assumptions
    single_run_measurements: int = 0  # quantities only one run has (not compared)


def entry(record: RunRecord, ref: str) -> tuple[str, RunRecord, float | None]:
    """What `compare` takes for a stored run or a record file: named "REF label" (REF the id or file
    the user gave, so `--job "8 h on REF"` finds it), priced from the record's options."""
    label = record.options.get("label")
    price = record.options.get("price")
    return (f"{ref} {label}" if label else ref), record, (float(price) if price is not None else None)


def compare(records: list[tuple[str, RunRecord, float | None]], job: str | None = None) -> Comparison:
    """Runs side by side: (name, record, price per hour in USD or None) each, in the order given."""
    if not records:
        raise ValueError("nothing to compare: give at least one run")
    names = _unique_names([name for name, _, _ in records])
    runs = [r for _, r, _ in records]
    prices = [p for _, _, p in records]
    for name, price in zip(names, prices):
        if price is not None and (not math.isfinite(price) or price <= 0):
            raise ValueError(f"{name}: a price per hour must be a positive finite number, not {price}")
    notes: list[str] = []
    measurement_rows, single = _measurement_rows(runs)
    costs = _cost_rows(runs, prices, notes)
    estimate = _job_estimate(job, names, runs, prices, notes) if job else None
    basis, unit, ranking, unranked = _ranking(names, runs, prices, costs, estimate)
    return Comparison(
        runs=[_column(name, r, p) for name, r, p in zip(names, runs, prices)],
        measurements=measurement_rows,
        costs=costs,
        findings=_finding_rows(runs),
        job=estimate,
        rank_basis=basis,
        rank_unit=unit,
        ranking=ranking,
        unranked=unranked,
        verdict=_verdict_sentence(ranking, unit, names, runs, prices, basis, estimate) if ranking else None,
        notes=list(dict.fromkeys(notes)),
        single_run_measurements=single,
    )


def _unique_names(names: list[str]) -> list[str]:
    seen: Counter[str] = Counter()
    unique = []
    for name in names:
        seen[name] += 1
        unique.append(name if seen[name] == 1 else f"{name} ({seen[name]})")
    return unique


def _column(name: str, record: RunRecord, price: float | None) -> RunColumn:
    return RunColumn(name, record.started_at, gpu_summary(record.machine), len(record.machine.gpus),
                     record.verdict, price)


def lower_is_better(name: str, unit: str) -> bool:
    return unit in LOWER_IS_BETTER_UNITS or name in LOWER_IS_BETTER_NAMES


def _row(name: str, label: str, unit: str, values: list[float | None], lower: bool) -> Row:
    row = Row(name, label, unit, lower, values)
    known = [v for v in values if v is not None]
    if not known:
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


def _measurement_rows(runs: list[RunRecord]) -> tuple[list[Row], int]:
    """Every quantity at least two runs measured (all of them when there is one run); how many
    quantities only one run has."""
    per_run = [run_figures(r) for r in runs]
    keys = list(dict.fromkeys(key for figures in per_run for key in figures))
    needed = min(2, len(runs))
    rows, single = [], 0
    for name, unit in keys:
        values = [figures[(name, unit)].value if (name, unit) in figures else None for figures in per_run]
        if sum(v is not None for v in values) < needed:
            single += 1
            continue
        rows.append(_row(name, name, unit, values, lower_is_better(name, unit)))
        if name == STEP_TIME:
            rows += _step_time_spread(runs)
    return rows, single


STEP_TIME = "workload.step_time_ms"


def _step_time_spread(runs: list[RunRecord]) -> list[Row]:
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
            rows.append(_row(f"{STEP_TIME}.{key}", f"{STEP_TIME} {key}", "ms", values, lower=True))
    return rows


def _cost_rows(runs: list[RunRecord], prices: list[float | None], notes: list[str]) -> list[Row]:
    """Price per unit of work, for each basis some priced run measured."""
    if all(p is None for p in prices):
        return []
    rows = []
    for metric, key, label, per_second_to_unit in COST_BASES:
        unit = _unit_of(metric)
        values: list[float | None] = []
        for record, price in zip(runs, prices):
            rate, note = machine_rate(record, metric, unit)
            if note:
                notes.append(note)
            values.append(price / (rate * per_second_to_unit) if price is not None and rate else None)
        if any(v is not None for v in values):
            rows.append(_row(key, label, "USD", values, lower=True))
            notes.append(_formula(key))
    return rows


def _unit_of(metric: str) -> str:
    return {TOKENS: "tokens/s", SUSTAINED: "TFLOPS", GEMM_BF16: "TFLOPS"}[metric]


def _formula(key: str) -> str:
    if key == "usd_per_million_tokens":
        return ("USD per million tokens = price per hour / (workload tokens/s per GPU x GPUs x 3600 / 1e6); "
                "each GPU is assumed to train its own replica (ideal data-parallel scaling)")
    what = "sustained" if key.endswith("sustained") else "bf16 GEMM"
    return (f"USD per PFLOP-hour ({what}) = price per hour / (median {what} TFLOPS per GPU x GPUs / 1000): "
            f"what one PFLOPS held for an hour costs")


# -- job: "8 h on RUN" ------------------------------------------------------------------------

_DURATION_UNITS = {"s": 1 / 3600, "sec": 1 / 3600, "m": 1 / 60, "min": 1 / 60, "mins": 1 / 60, "minute": 1 / 60,
                   "minutes": 1 / 60, "h": 1.0, "hr": 1.0, "hrs": 1.0, "hour": 1.0, "hours": 1.0,
                   "d": 24.0, "day": 24.0, "days": 24.0}
_JOB = re.compile(r"^\s*(?P<amount>\d+(?:\.\d+)?)\s*(?P<unit>[a-z]+)\s+on\s+(?P<run>.+?)\s*$", re.IGNORECASE)


def parse_job(job: str) -> tuple[float, str]:
    """"8 h on 12" -> (8.0, "12"); "90 min on provider A" -> (1.5, "provider A")."""
    match = _JOB.match(job)
    unit = match and _DURATION_UNITS.get(match["unit"].lower())
    if not match or unit is None:
        raise ValueError(f'job {job!r}: write it as "DURATION on RUN", e.g. "8 h on 12" or "90 min on 3"')
    hours = float(match["amount"]) * unit
    if hours <= 0:
        raise ValueError(f"job {job!r}: the duration must be more than zero")
    return hours, match["run"]


def find_run(reference: str, names: list[str], labels: list[str | None] | None = None, what: str = "job") -> int:
    """The run a reference names, as a user would write it: the run's exact name, then
    case-insensitively, then the id or file it was given as ("12" or "#12" for "#12 provider A",
    "runs.json" or "runs" for "/tmp/runs.json"), then its label ("provider A"). `labels` are the
    runs' labels where known (a name is "REF LABEL"); without them the first word is the REF."""
    labels = labels or [None] * len(names)
    wanted = reference.strip().casefold()
    refs = [_reference_aliases(name, label) for name, label in zip(names, labels)]
    given_labels = [_label_aliases(name, label) for name, label in zip(names, labels)]
    for matches in (lambda i: names[i] == reference.strip(), lambda i: names[i].casefold() == wanted,
                    lambda i: wanted.lstrip("#") in refs[i], lambda i: wanted in given_labels[i]):
        hits = [i for i in range(len(names)) if matches(i)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise ValueError(f"{what}: {reference!r} names several runs of this comparison "
                             f"({', '.join(names[i] for i in hits)}); use one's id or file")
    raise ValueError(f"{what}: {reference!r} names no single run of this comparison ({', '.join(names)})")


def _reference_aliases(name: str, label: str | None) -> set[str]:
    """How a user may name the id or file a run was given as (casefolded, without "#")."""
    words = name.split()
    refs = {words[0]} if words else set()
    if label and name.endswith(f" {label}"):
        refs.add(name[: -len(label) - 1])
    aliases = set()
    for ref in refs:
        ref = ref.casefold().lstrip("#")
        base = os.path.basename(ref)
        aliases |= {ref, base, os.path.splitext(base)[0]}
    return aliases - {""}


def _label_aliases(name: str, label: str | None) -> set[str]:
    rest = name.split(None, 1)[1] if len(name.split(None, 1)) == 2 else ""
    return {text.casefold() for text in (label, rest) if text}


def with_prices(entries: list[tuple[str, RunRecord, float | None]],
                prices: list[tuple[str, float]]) -> list[tuple[str, RunRecord, float | None]]:
    """The entries with prices the user gave for this comparison only ("REF=USD"), each REF
    found as `find_run` finds a job's run."""
    names = _unique_names([name for name, _, _ in entries])
    labels = [record.options.get("label") for _, record, _ in entries]
    priced = list(entries)
    for reference, price in prices:
        i = find_run(reference, names, labels, what="--price")
        priced[i] = (priced[i][0], priced[i][1], price)
    return priced


def _job_estimate(job: str, names: list[str], runs: list[RunRecord], prices: list[float | None],
                  notes: list[str]) -> JobEstimate:
    hours, reference = parse_job(job)
    ref = find_run(reference, names, [r.options.get("label") for r in runs])
    metric = _job_metric(runs, ref)
    if metric is None:
        notes.append(f"job: {names[ref]} has none of {', '.join(JOB_METRICS)}; its time cannot be scaled to other runs")
    ref_rate = machine_rate(runs[ref], metric, _unit_of(metric))[0] if metric else None
    estimated: list[float | None] = []
    for i, record in enumerate(runs):
        rate = machine_rate(record, metric, _unit_of(metric))[0] if metric else None
        estimated.append(hours if i == ref else hours * ref_rate / rate if ref_rate and rate else None)
    costs = [h * p if h is not None and p is not None else None for h, p in zip(estimated, prices)]
    if metric:
        notes.append(f"job time on a run = {hours:g} h x machine {metric} on {names[ref]} / machine {metric} on that run; "
                     f"cost = hours x price per hour")
    return JobEstimate(job.strip(), names[ref], hours, metric, estimated, costs)


def _job_metric(runs: list[RunRecord], ref: int) -> str | None:
    """The most job-like throughput the reference run has, preferring one every run has."""
    has = [{name for name, _ in run_figures(r)} for r in runs]
    candidates = [m for m in JOB_METRICS if m in has[ref]]
    shared = [m for m in candidates if all(m in h for h in has)]
    return (shared or candidates or [None])[0]


# -- ranking ----------------------------------------------------------------------------------

def _ranking(names: list[str], runs: list[RunRecord], prices: list[float | None], costs: list[Row],
             job: JobEstimate | None) -> tuple[str | None, str | None, list[Ranked], dict[str, str]]:
    """Runs by cost per unit of work, cheapest first, on the first basis every priced run has (or
    the one most of them have)."""
    bases: list[tuple[str, str, list[float | None]]] = []
    if job and any(c is not None for c in job.cost_usd):
        bases.append(("job", f"USD for the job ({job.description})", job.cost_usd))
    bases += [(row.name, row.label, row.values) for row in costs]
    priced = [i for i, p in enumerate(prices) if p is not None]
    if not bases or not priced:
        why = "no price per hour" if not priced else "none of the throughput figures a cost needs"
        return None, None, [], {n: why for n in names}
    key, label, values = max(bases, key=lambda b: sum(b[2][i] is not None for i in priced))
    ranked = sorted((Ranked(names[i], values[i], prices[i]) for i in priced if values[i] is not None),
                    key=lambda r: r.cost)
    unranked = {names[i]: "no price per hour" if prices[i] is None else f"not measured for {label}"
                for i in range(len(names)) if prices[i] is None or values[i] is None}
    return key, label, ranked, unranked


def _verdict_sentence(ranking: list[Ranked], unit: str | None, names: list[str], runs: list[RunRecord],
                      prices: list[float | None], basis: str | None, job: JobEstimate | None) -> str:
    best = ranking[0]
    if len(ranking) == 1:
        return f"Only {best.name} has both a price and a measured throughput; give prices for more runs to rank them."
    cheapest_hour = min(ranking, key=lambda r: (r.price_per_hour, r.cost))
    what = _unit_words(basis, unit)
    if cheapest_hour.name == best.name:
        runner_up = ranking[1]
        speed = _speed_ratio(runner_up.name, best.name, names, runs, basis, job)
        return (f"{best.name} is both the cheapest per hour (${best.price_per_hour:.2f}/h) and the cheapest per result "
                f"({_money(best.cost)} {what}): the next best, {runner_up.name}, costs "
                f"{_times(runner_up.price_per_hour / best.price_per_hour)} as much per hour but does the work only "
                f"{_times(speed)} as fast." if speed else
                f"{best.name} is both the cheapest per hour (${best.price_per_hour:.2f}/h) and the cheapest per result "
                f"({_money(best.cost)} {what}).")
    speed = _speed_ratio(best.name, cheapest_hour.name, names, runs, basis, job)
    price_ratio = best.price_per_hour / cheapest_hour.price_per_hour
    because = f", because it does the work {_times(speed)} as fast for {_times(price_ratio)} the price" if speed else ""
    return (f"{cheapest_hour.name} is the cheapest per hour (${cheapest_hour.price_per_hour:.2f}/h vs "
            f"${best.price_per_hour:.2f}/h) but not per result: {best.name} costs {_money(best.cost)} {what} against "
            f"{_money(cheapest_hour.cost)}{because}.")


def _speed_ratio(fast: str, slow: str, names: list[str], runs: list[RunRecord], basis: str | None,
                 job: JobEstimate | None) -> float | None:
    """How many times as fast run `fast` does the work as run `slow`, on the ranking's basis."""
    if basis == "job" and job:
        a, b = job.hours[names.index(fast)], job.hours[names.index(slow)]
        return b / a if a and b else None
    metric = next((m for m, key, _, _ in COST_BASES if key == basis), None)
    if metric is None:
        return None
    a = machine_rate(runs[names.index(fast)], metric, _unit_of(metric))[0]
    b = machine_rate(runs[names.index(slow)], metric, _unit_of(metric))[0]
    return a / b if a and b else None


def _unit_words(basis: str | None, label: str | None) -> str:
    if basis == "job":
        return "for the job"
    return (label or "").removeprefix("USD ")


def _times(ratio: float) -> str:
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.1f}x"


def _money(usd: float) -> str:
    return f"${usd:,.2f}" if usd >= 0.1 else f"${usd:.4f}"


# -- findings side by side --------------------------------------------------------------------

def _finding_rows(runs: list[RunRecord]) -> list[FindingRow]:
    """Per check, the worst status each run got over its subjects; checks whose status differs
    between runs come first."""
    per_run = [_worst_by_check(r.findings) for r in runs]
    checks = list(dict.fromkeys(check for worst in per_run for check in worst))
    rows = []
    for check in checks:
        worst = [w.get(check) for w in per_run]
        statuses = [f.status if f else None for f in worst]
        judged = {s for s in statuses if s not in (None, SKIP)}
        rows.append(FindingRow(check, statuses, [f.summary if f else None for f in worst], differs=len(judged) > 1))
    rows.sort(key=lambda row: not row.differs)  # stable: differing checks first
    return rows


def _worst_by_check(findings: list[Finding]) -> dict[str, Finding]:
    worst: dict[str, Finding] = {}
    for f in findings:
        current = worst.get(f.check)
        if current is None or _STATUS_RANK.get(f.status, 0) > _STATUS_RANK.get(current.status, 0):
            worst[f.check] = f
    return worst


# -- one machine over time --------------------------------------------------------------------

DAY_HOURS = range(8, 20)  # 08:00-19:59 is "day", the rest "night"
NOISE_PCT = 3.0  # differences below this are run-to-run noise, not a day/night effect


@dataclass
class TrendFigure:
    name: str
    label: str
    unit: str
    points: list[tuple[str, float]]  # (started_at, value), oldest first
    first: float
    last: float
    change_pct: float | None  # last vs first
    day_median: float | None
    day_runs: int
    night_median: float | None
    night_runs: int
    sentence: str


@dataclass
class Trend:
    runs: int
    first_at: str | None
    last_at: str | None
    figures: list[TrendFigure]
    clock: str  # which clock "day" and "night" are on


def history_trend(records: list[RunRecord], utc_offset_hours: float = 0.0, zone: str | None = None) -> Trend:
    """How one machine's key figures moved over time, and day vs night. Run records keep their
    start time in UTC and not the machine's time zone, so hours are UTC unless the caller gives
    the offset of the local time that matters (the user's, the data centre's); `zone` names that
    time for the reader ("local time, CET")."""
    dated = sorted(((_parse_time(r.started_at), r) for r in records), key=lambda pair: pair[0])
    shift = timedelta(hours=utc_offset_hours)
    offset = "UTC" if not utc_offset_hours else f"UTC{utc_offset_hours:+g} h"
    clock = f"{zone} ({offset})" if zone and zone != offset else offset
    figures = []
    for name, label, unit in KEY_FIGURES:
        points = [(when, v) for when, r in dated if (v := key_figures(r).get(name)) is not None]
        if points:
            figures.append(_trend_figure(name, label, unit, points, shift, clock))
    return Trend(
        runs=len(dated),
        first_at=dated[0][1].started_at if dated else None,
        last_at=dated[-1][1].started_at if dated else None,
        figures=figures,
        clock=f"day = {DAY_HOURS.start:02d}:00-{DAY_HOURS.stop:02d}:00 {clock}, night the rest "
              f"(run records keep start times in UTC)",
    )


def _trend_figure(name: str, label: str, unit: str, points: list[tuple[datetime, float]], shift: timedelta,
                  clock: str) -> TrendFigure:
    day = [v for when, v in points if (when + shift).hour in DAY_HOURS]
    night = [v for when, v in points if (when + shift).hour not in DAY_HOURS]
    first, last = points[0][1], points[-1][1]
    day_median = statistics.median(day) if day else None
    night_median = statistics.median(night) if night else None
    return TrendFigure(
        name=name, label=label, unit=unit,
        points=[(_format_time(when), v) for when, v in points],
        first=first, last=last,
        change_pct=(last - first) / first * 100 if first > 0 and len(points) > 1 else None,
        day_median=day_median, day_runs=len(day), night_median=night_median, night_runs=len(night),
        sentence=_day_night_sentence(label, unit, day_median, len(day), night_median, len(night), clock),
    )


def _day_night_sentence(label: str, unit: str, day: float | None, day_runs: int, night: float | None,
                        night_runs: int, clock: str) -> str:
    if day is None or night is None:
        when = "by day" if night is None else "at night"
        return f"{label}: {_runs(day_runs or night_runs)}, all {when} ({clock}); run it at the other time of day to compare"
    diff = (day - night) / night * 100 if night > 0 else 0.0
    base = (f"{label}: day median {day:.4g} {unit} ({_runs(day_runs)}) vs night {night:.4g} {unit} "
            f"({_runs(night_runs)}, {clock})")
    if abs(diff) < NOISE_PCT:
        return f"{base}: no day/night difference beyond {NOISE_PCT:g}%"
    return f"{base}: {abs(diff):.0f}% {'lower' if diff < 0 else 'higher'} by day"


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _parse_time(text: str) -> datetime:
    """An ISO start time as UTC ("...Z" too, which Python 3.10 does not read)."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"run started at {text!r}: not an ISO 8601 time") from None
    return when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when.astimezone(timezone.utc)


def _format_time(when: datetime) -> str:
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")
