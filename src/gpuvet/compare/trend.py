"""One machine over time (`gpuvet history --machine`): how its figures moved, and day vs night.

Pure: run records in, a `Trend` out.
"""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta, timezone

from ..record import RunRecord, parse_timestamp, timestamp
from .data import TREND_FIGURES, trend_values
from .sentences import day_night_sentence
from .shapes import Trend, TrendFigure

DAY_HOURS = range(8, 20)  # 08:00-19:59 is "day", the rest "night"


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
        points=[(timestamp(when), v) for when, v in points],
        first=first, last=last,
        change_pct=(last - first) / first * 100 if first > 0 and len(points) > 1 else None,
        day_median=day_median, day_runs=len(day), night_median=night_median, night_runs=len(night),
        sentence=day_night_sentence(label, unit, day_median, len(day), night_median, len(night), clock,
                                     in_points=unit == "%"),
    )


def _parse_time(text: str) -> datetime:
    """An ISO start time as UTC (a zone-less one read as UTC)."""
    try:
        when = parse_timestamp(text)
    except ValueError:
        raise ValueError(f"run started at {text!r}: not an ISO 8601 time") from None
    return when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when.astimezone(timezone.utc)

