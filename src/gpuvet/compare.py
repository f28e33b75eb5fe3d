"""Runs side by side, and what a result costs on each (D2); one machine over time (D1).

Pure: run records in, a `Comparison` or a `Trend` out; no I/O. The seed's point (5.2) is that a
machine cheap per hour is often dear per result, so next to the measurements this module prices
the work itself:

* USD per PFLOP-hour achieved = price_per_hour / (sum of the GPUs' TFLOPS / 1000), i.e. the
  price of one hour divided by the PFLOP-hours the machine delivers in that hour; a GPU that was
  not measured counts as the median of those that were. A synchronous data-parallel job waits
  for its slowest GPU, so where the GPUs differ a second row prices the machine at the slowest
  GPU's rate x GPUs;
* USD per million training tokens = price_per_hour / (machine tokens/s x 3600 / 1e6), from the
  reference workload's `workload.tokens_per_s`, only between runs of the same workload shape
  (model, batch, dtype): tokens of a 2-layer model say nothing about a 12-layer one;
* a job the user describes ("8 h on RUN") is scaled to every other run by the ratio of machine
  throughput (workload tokens/s of the same shape, else sustained TFLOPS, else bf16 GEMM TFLOPS),
  and costs hours x price.
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
from . import run_noise
from .record import FAIL, MEASURED, PASS, SKIP, WARN, Finding, RunRecord

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
SLOWEST_SUFFIX = "_slowest_gpu"  # the cost row of a data-parallel job, paced by the slowest GPU

# More figures for one machine over time (`gpuvet history --machine`): what moves with the time
# of day on a shared host (storage, network, CPU steal, the CPU's feed rate) next to the GPU's.
STEAL = "host.steal_pct"  # from the host facts, not a measurement
TREND_FIGURES = KEY_FIGURES + (
    ("disk.seq_read", "disk seq read", "MB/s"),
    ("disk.rand_read_iops", "disk random read", "IOPS"),
    ("net.loopback_throughput", "net loopback", "Gbit/s"),
    ("net.tcp_throughput", "net node-to-node", "Gbit/s"),
    ("cpu.feed_rate", "CPU feed", "samples/s"),
    (STEAL, "CPU steal", "%"),
)

# The workload's tokens/s (and what follows from it) only compare between runs of one shape.
SHAPE_DEPENDENT = {TOKENS, "workload.step_time_ms", "usd_per_million_tokens"}

LOWER_IS_BETTER_UNITS = {"ms", "us", "µs", "s", "count"}
# Signed figures whose size, not sign, is bad: a throughput that fell 5% or rose 5% over a
# sustained load is equally unsteady (the CPU's warm-up shows as a large negative decay).
CLOSER_TO_ZERO_NAMES = {"sustained.decay_pct"}
LOWER_IS_BETTER_NAMES = CLOSER_TO_ZERO_NAMES | {STEAL}
_STATUS_RANK = {PASS: 0, SKIP: 0, MEASURED: 0, WARN: 1, FAIL: 2}


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


def trend_values(record: RunRecord) -> dict[str, float]:
    """The TREND_FIGURES a run has, by name: measurements (median over subjects) and the CPU
    steal its host facts measured."""
    figures = run_figures(record)
    values = {name: figures[(name, unit)].value for name, _, unit in TREND_FIGURES if (name, unit) in figures}
    host = record.machine.host
    if host is not None and host.steal_pct is not None:
        values[STEAL] = float(host.steal_pct)
    return values


def gpu_summary(machine: Machine) -> str:
    """"8 x NVIDIA H100 80GB HBM3"; a CPU-only machine says so."""
    if not machine.gpus:
        cpu = machine.host.cpu_model if machine.host and machine.host.cpu_model else "unknown CPU"
        return f"no GPU ({cpu})"
    names = Counter(g.name or "unknown GPU" for g in machine.gpus)
    return ", ".join(f"{n} x {name}" for name, n in names.items())


def _per_subject(record: RunRecord, name: str, unit: str) -> dict[str, float]:
    """A figure's value per subject (the median where a subject measured it more than once)."""
    values: dict[str, list[float]] = {}
    for m in record.measurements:
        if m.name == name and m.unit == unit and m.value is not None:
            values.setdefault(m.subject, []).append(float(m.value))
    return {subject: statistics.median(v) for subject, v in values.items()}


@dataclass
class MachineRate:
    """A per-GPU throughput as the whole machine's: every GPU's own rate added up (GPUs that were
    not measured counted at the median of those that were), and the rate of a synchronous
    data-parallel job, where every GPU waits for the slowest: slowest x GPUs."""

    total: float
    slowest_paced: float
    note: str | None  # an assumption the figure makes


def machine_rates(record: RunRecord, name: str, unit: str) -> MachineRate | None:
    """The whole machine's throughput for a figure (None: not measured). A cpu or machine figure
    already is the machine's."""
    per_subject = _per_subject(record, name, unit)
    gpu_values = [v for s, v in per_subject.items() if re.fullmatch(r"gpu\d+", s)]
    if not gpu_values:
        value = statistics.median(per_subject.values()) if per_subject else 0.0
        return MachineRate(value, value, None) if value > 0 else None
    units = max(len(gpu_values), len(record.machine.gpus))
    missing = units - len(gpu_values)
    median = statistics.median(gpu_values)
    total = sum(gpu_values) + missing * median
    if total <= 0:
        return None
    note = (f"{name}: measured on {len(gpu_values)} of {units} GPUs; the others are assumed to match their median"
            if missing else None)
    return MachineRate(total, min(gpu_values) * units, note)


def machine_rate(record: RunRecord, name: str, unit: str) -> tuple[float | None, str | None]:
    """The whole machine's throughput for a per-GPU figure: the sum over its GPUs (None: not measured)."""
    rate = machine_rates(record, name, unit)
    return (rate.total, rate.note) if rate else (None, None)


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
    closer_to_zero: bool = False  # a signed figure judged by its size (lower_is_better of |value|)
    not_comparable: str | None = None  # why the values are shown but not ranked (no best, no difference)
    within_spread: list[bool] = field(default_factory=list)  # differs from the best by less than the runs' own noise


@dataclass
class FindingRow:
    check: str
    statuses: list[str | None]  # worst status per run over its subjects; None: not checked
    summaries: list[str | None]  # the worst finding's summary, per run
    differs: bool = False  # the runs that could check it disagree (a skip is no disagreement)
    subjects: list[str | None] = field(default_factory=list)  # the worst finding's subject, per run
    problem: bool = False  # some run failed or warned: always shown, whatever the others say

    @property
    def shown(self) -> bool:
        """Listed without -v: a problem on any run, or runs that disagree."""
        return self.problem or self.differs


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
    shapes_differ, shape_notes = _shapes_differ(names, runs)
    notes: list[str] = list(shape_notes)
    measurement_rows, single = _measurement_rows(runs, shapes_differ)
    costs = _cost_rows(runs, prices, notes, shapes_differ)
    estimate = _job_estimate(job, names, runs, prices, notes, comparable_tokens=not shapes_differ) if job else None
    basis, unit, ranking, unranked = _ranking(names, runs, prices, costs, estimate)
    shared = {name: why for name, r in zip(names, runs) if (why := run_noise.contended(r))}
    notes += [f"{name}: {why}, so its figures may be low for reasons other than the machine" for name, why in shared.items()]
    verdict = _verdict_sentence(ranking, unit, names, runs, prices, basis, estimate) if ranking else None
    if verdict:
        verdict += _noise_caveat(basis, measurement_rows, names, ranking, shared)
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
        verdict=verdict,
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


def _row(name: str, label: str, unit: str, values: list[float | None], lower: bool,
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


def _measurement_rows(runs: list[RunRecord], shapes_differ: str | None) -> tuple[list[Row], int]:
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
        row = _row(name, name, unit, values, lower_is_better(name, unit), shapes_differ if name in SHAPE_DEPENDENT else None)
        row.within_spread = run_noise.within_spread(values, [run_noise.spread(r, name) for r in runs], row.best)
        rows.append(row)
        if name == STEP_TIME:
            rows += _step_time_spread(runs, shapes_differ)
    return rows, single


STEP_TIME = "workload.step_time_ms"


def workload_shape(record: RunRecord) -> str | None:
    """The reference workload's shape as one comparable text ("d_model 768 x 12 layers, ..."), from
    the details of its tokens/s; None where the run has no workload figure or no shape."""
    shapes = []
    for m in record.measurements:
        if m.name != TOKENS or m.value is None:
            continue
        shape = m.details.get("shape") if isinstance(m.details.get("shape"), dict) else {}
        if not shape:
            continue
        parts = [f"d_model {shape.get('d_model')} x {shape.get('layers')} layers", f"{shape.get('heads')} heads",
                 f"seq {shape.get('seq_len')}", f"batch {shape.get('batch')}", f"vocab {shape.get('vocab')}"]
        shapes.append(", ".join(parts) + f", {m.details.get('dtype', 'dtype unknown')}")
    return shapes[0] if len(set(shapes)) == 1 else ("; ".join(dict.fromkeys(shapes)) or None)


def _shapes_differ(names: list[str], runs: list[RunRecord]) -> tuple[str | None, list[str]]:
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
            rows.append(_row(f"{STEP_TIME}.{key}", f"{STEP_TIME} {key}", "ms", values, lower=True,
                             not_comparable=shapes_differ))
    return rows


def _cost_rows(runs: list[RunRecord], prices: list[float | None], notes: list[str],
               shapes_differ: str | None = None) -> list[Row]:
    """Price per unit of work, for each basis some priced run measured: on the sum of the GPUs'
    rates, and, where some machine's GPUs differ, paced by its slowest GPU (a data-parallel job)."""
    if all(p is None for p in prices):
        return []
    rows = []
    for metric, key, label, per_second_to_unit in COST_BASES:
        unit = _unit_of(metric)
        totals: list[float | None] = []
        paced: list[float | None] = []
        for record, price in zip(runs, prices):
            rate = machine_rates(record, metric, unit)
            if rate and rate.note:
                notes.append(rate.note)
            priced = price is not None and rate is not None
            totals.append(price / (rate.total * per_second_to_unit) if priced else None)
            paced.append(price / (rate.slowest_paced * per_second_to_unit) if priced and rate.slowest_paced > 0 else None)
        if not any(v is not None for v in totals):
            continue
        not_comparable = shapes_differ if key in SHAPE_DEPENDENT else None
        rows.append(_row(key, label, "USD", totals, lower=True, not_comparable=not_comparable))
        notes.append(_formula(key))
        if any(t is not None and p is not None and p > t * 1.005 for t, p in zip(totals, paced)):
            rows.append(_row(key + SLOWEST_SUFFIX, f"{label.removesuffix(')')}, paced by the slowest GPU)"
                             if label.endswith(")") else f"{label} (paced by the slowest GPU)",
                             "USD", paced, lower=True, not_comparable=not_comparable))
            notes.append(f"{label}, paced by the slowest GPU = price per hour / (slowest GPU's rate x GPUs): what a "
                         f"synchronous data-parallel job pays, since every step waits for the slowest GPU; the ranking "
                         f"uses the sum of the GPUs' rates (independent work on each GPU)")
    return rows


def _unit_of(metric: str) -> str:
    return {TOKENS: "tokens/s", SUSTAINED: "TFLOPS", GEMM_BF16: "TFLOPS"}[metric]


def _formula(key: str) -> str:
    if key == "usd_per_million_tokens":
        return ("USD per million tokens = price per hour / (sum of the GPUs' workload tokens/s x 3600 / 1e6); "
                "each GPU is assumed to train its own replica (ideal data-parallel scaling)")
    what = "sustained" if key.endswith("sustained") else "bf16 GEMM"
    return (f"USD per PFLOP-hour ({what}) = price per hour / (sum of the GPUs' {what} TFLOPS / 1000): "
            f"what one PFLOPS held for an hour costs")


# -- job: "8 h on RUN" ------------------------------------------------------------------------

_DURATION_UNITS = {"s": 1 / 3600, "sec": 1 / 3600, "m": 1 / 60, "min": 1 / 60, "mins": 1 / 60, "minute": 1 / 60,
                   "minutes": 1 / 60, "h": 1.0, "hr": 1.0, "hrs": 1.0, "hour": 1.0, "hours": 1.0,
                   "d": 24.0, "day": 24.0, "days": 24.0}
_JOB = re.compile(r"^\s*(?P<amount>\d+(?:\.\d+)?)\s*(?P<unit>[a-z]+)\s+on\s+(?P<run>.+?)\s*$", re.IGNORECASE)


def parse_job(job: str) -> tuple[float, str]:
    """"8 h on 12" -> (8.0, "12"); "90 min on provider A" -> (1.5, "provider A")."""
    match = _JOB.match(job)
    unit = _DURATION_UNITS.get(match["unit"].lower()) if match else None
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
                  notes: list[str], comparable_tokens: bool = True) -> JobEstimate:
    hours, reference = parse_job(job)
    ref = find_run(reference, names, [r.options.get("label") for r in runs])
    metric = _job_metric(runs, ref, comparable_tokens)
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


def _job_metric(runs: list[RunRecord], ref: int, comparable_tokens: bool = True) -> str | None:
    """The most job-like throughput the reference run has, preferring one every run has; the
    workload's tokens/s only where every run trained the same shape."""
    has = [{name for name, _ in run_figures(r)} for r in runs]
    metrics = JOB_METRICS if comparable_tokens else tuple(m for m in JOB_METRICS if m != TOKENS)
    candidates = [m for m in metrics if m in has[ref]]
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
    # Not the slowest-GPU rows (the sum is the basis, the notes say so), nor figures of different shapes.
    bases += [(row.name, row.label, row.values) for row in costs
              if not row.not_comparable and not row.name.endswith(SLOWEST_SUFFIX)]
    priced = [i for i, p in enumerate(prices) if p is not None]
    if not bases or not priced:
        why = ("no price per hour" if not priced else
               "different workload shapes: tokens/s not comparable" if costs else "none of the throughput figures a cost needs")
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
        both = (f"{best.name} is both the cheapest per hour (${best.price_per_hour:.2f}/h) and the cheapest per result "
                f"({_money(best.cost)} {what})")
        compared = _next_best(runner_up.price_per_hour / best.price_per_hour, speed)
        return f"{both}: the next best, {runner_up.name}, {compared}." if compared else f"{both}."
    speed = _speed_ratio(best.name, cheapest_hour.name, names, runs, basis, job)
    price_ratio = best.price_per_hour / cheapest_hour.price_per_hour
    for_price = "about the same price" if _same(price_ratio) else f"{_times(price_ratio)} the price"
    because = f", because it does the work {_times(speed)} as fast for {for_price}" if speed else ""
    return (f"{cheapest_hour.name} is the cheapest per hour (${cheapest_hour.price_per_hour:.2f}/h vs "
            f"${best.price_per_hour:.2f}/h) but not per result: {best.name} costs {_money(best.cost)} {what} against "
            f"{_money(cheapest_hour.cost)}{because}.")


def _noise_caveat(basis: str | None, rows: list[Row], names: list[str], ranking: list[Ranked],
                  shared: dict[str, str]) -> str:
    """What the ranking cannot claim: a throughput difference inside the runs' own spread, or a
    ranked run whose CPUs were shared."""
    metric = next((m for m, key, _, _ in COST_BASES if key == basis), None)
    row = next((r for r in rows if r.name == metric), None)
    ranked = {r.name for r in ranking}
    words = []
    noisy = [names[i] for i, inside in enumerate(row.within_spread if row else []) if inside and names[i] in ranked]
    if noisy:
        words.append(f"{' and '.join(noisy)} differ{'s' if len(noisy) == 1 else ''} from the best {metric} by less than "
                     "the runs' own run-to-run spread: that difference is not shown to be the machines'")
    contended = [n for n in shared if n in ranked]
    if contended:
        words.append(f"{' and '.join(contended)} ran with contended CPUs")
    return f" Caveat: {'; '.join(words)}; measure again before choosing." if words else ""


def _next_best(price_ratio: float, speed: float | None) -> str:
    """How the runner-up compares with the cheapest: its price per hour and speed, ties in words."""
    price = "costs the same per hour" if _same(price_ratio) else f"costs {_times(price_ratio)} as much per hour"
    if not speed:
        return "" if _same(price_ratio) else price
    if _same(speed):
        return f"{price} and does the work at the same speed"
    return f"{price} and does the work {_times(speed)} as fast" if _same(price_ratio) else \
        f"{price} but does the work only {_times(speed)} as fast"


def _same(ratio: float) -> bool:
    """A ratio that prints as 1.0x is a tie, and is worded as one."""
    return round(ratio, 1) == 1.0


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
        rows.append(FindingRow(check, statuses, [f.summary if f else None for f in worst], differs=len(judged) > 1,
                               subjects=[f.subject if f else None for f in worst],
                               problem=bool(judged & {FAIL, WARN})))
    # stable: failures first, then warnings, then other differences
    rows.sort(key=lambda row: (not row.shown, -max(_STATUS_RANK.get(s or SKIP, 0) for s in row.statuses)))
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
    values = [(when, trend_values(r)) for when, r in dated]
    for name, label, unit in TREND_FIGURES:
        points = [(when, v) for when, figures in values if (v := figures.get(name)) is not None]
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
        sentence=_day_night_sentence(label, unit, day_median, len(day), night_median, len(night), clock,
                                     in_points=unit == "%"),
    )


NOISE_POINTS = 1.0  # a share (CPU steal, %) moves in points: 0% vs 2% is no "infinitely higher"


def _day_night_sentence(label: str, unit: str, day: float | None, day_runs: int, night: float | None,
                        night_runs: int, clock: str, in_points: bool = False) -> str:
    if day is None or night is None:
        when = "by day" if night is None else "at night"
        return f"{label}: {_runs(day_runs or night_runs)}, all {when} ({clock}); run it at the other time of day to compare"
    base = (f"{label}: day median {day:.4g} {unit} ({_runs(day_runs)}) vs night {night:.4g} {unit} "
            f"({_runs(night_runs)}, {clock})")
    if in_points:
        points = day - night
        if abs(points) < NOISE_POINTS:
            return f"{base}: no day/night difference beyond {NOISE_POINTS:g} point"
        return f"{base}: {abs(points):.1f} points {'lower' if points < 0 else 'higher'} by day"
    diff = (day - night) / night * 100 if night > 0 else 0.0
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
