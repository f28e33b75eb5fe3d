"""The sentences a comparison and a trend say: is the cheapest per hour the cheapest per result,
what the ranking cannot claim, and how a figure differs by day and by night.

Pure: rows, rankings and medians in, text out.
"""

from __future__ import annotations

from ..record import RunRecord
from .cost import speed_ratio
from .data import COST_BASES
from .money import USD, Currency
from .shapes import JobEstimate, Ranked, Row

NOISE_PCT = 3.0  # differences below this are run-to-run noise, not a day/night effect
NOISE_POINTS = 1.0  # a share (CPU steal, %) moves in points: 0% vs 2% is no "infinitely higher"


def verdict_sentence(ranking: list[Ranked], unit: str | None, names: list[str], runs: list[RunRecord],
                     prices: list[float | None], basis: str | None, job: JobEstimate | None, money: Currency = USD) -> str:
    best = ranking[0]
    if len(ranking) == 1:
        return f"Only {best.name} has both a price and a measured throughput; give prices for more runs to rank them."
    cheapest_hour = min(ranking, key=lambda r: (r.price_per_hour, r.cost))
    what = _unit_words(basis, unit, money)
    if cheapest_hour.name == best.name:
        runner_up = ranking[1]
        speed = speed_ratio(runner_up.name, best.name, names, runs, basis, job)
        both = (f"{best.name} is both the cheapest per hour ({money.per_hour(best.price_per_hour)}) and the cheapest "
                f"per result ({money.amount(best.cost)} {what})")
        compared = _next_best(runner_up.price_per_hour / best.price_per_hour, speed)
        return f"{both}: the next best, {runner_up.name}, {compared}." if compared else f"{both}."
    speed = speed_ratio(best.name, cheapest_hour.name, names, runs, basis, job)
    price_ratio = best.price_per_hour / cheapest_hour.price_per_hour
    for_price = "about the same price" if _same(price_ratio) else f"{_times(price_ratio)} the price"
    because = f", because it does the work {_times(speed)} as fast for {for_price}" if speed else ""
    return (f"{cheapest_hour.name} is the cheapest per hour ({money.per_hour(cheapest_hour.price_per_hour)} vs "
            f"{money.per_hour(best.price_per_hour)}) but not per result: {best.name} costs {money.amount(best.cost)} "
            f"{what} against {money.amount(cheapest_hour.cost)}{because}.")


def noise_caveat(basis: str | None, rows: list[Row], names: list[str], ranking: list[Ranked],
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


def _unit_words(basis: str | None, label: str | None, money: Currency = USD) -> str:
    if basis == "job":
        return "for the job"
    return (label or "").removeprefix(f"{money.code} ")


def _times(ratio: float) -> str:
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.1f}x"


def day_night_sentence(label: str, unit: str, day: float | None, day_runs: int, night: float | None,
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
