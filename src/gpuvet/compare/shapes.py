"""The types a comparison and a trend are made of: pure data, no logic."""

from __future__ import annotations

from dataclasses import dataclass, field

@dataclass
class Figure:
    """One measured quantity of a run: the median over its subjects (GPUs, or cpu/machine)."""

    name: str
    unit: str
    value: float
    subjects: list[str]


@dataclass
class MachineRate:
    """A per-GPU throughput as the whole machine's: every GPU's own rate added up (GPUs that were
    not measured counted at the median of those that were), and the rate of a synchronous
    data-parallel job, where every GPU waits for the slowest: slowest x GPUs."""

    total: float
    slowest_paced: float
    note: str | None  # an assumption the figure makes


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
    currency: str = "USD"  # the prices' currency (ISO 4217): the unit of every cost row
    currency_symbol: str = "$"  # how its amounts are written
    platforms: list[str] = field(default_factory=list)  # per platform (a label's group): its cheapest machine


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
