"""Machines and platforms as a renter compares them: a machine's runs merged into one column (the
median of each figure, with their spread said), and a platform (the part of a label before its
first "/": "autodl" of "autodl/4090-A") named by its cheapest machine.

Pure: entries (name, record, price) in; which machine a record is on is the caller's key function
(store.machine_identity), so this package stays below the store."""

from __future__ import annotations

import copy
import statistics
from typing import Callable

from ..record import Measurement, RunRecord
from .data import KEY_FIGURES, run_figures
from .money import Currency
from .shapes import Comparison

Entry = tuple[str, RunRecord, "float | None"]


def platform_of(label: str | None) -> str | None:
    """"autodl/4090-A" -> "autodl"; a label without "/" names no platform."""
    if not label or "/" not in label.strip("/"):
        return None
    return label.strip().split("/", 1)[0].strip() or None


def merge_machines(entries: list[Entry], machine_of: Callable[[RunRecord], str]) -> tuple[list[Entry], list[str]]:
    """One entry per machine, in first-seen order: a machine's several runs become one, each
    figure the median of its runs, and a note gives their spread (two runs of one machine are
    one machine measured twice, not two machines to rank)."""
    groups: dict[str, list[Entry]] = {}
    for item in entries:
        groups.setdefault(machine_of(item[1]), []).append(item)
    merged, notes = [], []
    for same in groups.values():
        if len(same) == 1:
            merged.append(same[0])
            continue
        entry, note = _merged(same)
        merged.append(entry)
        notes.append(note)
    return merged, notes


def _merged(same: list[Entry]) -> tuple[Entry, str]:
    latest = max(same, key=lambda e: e[1].started_at)
    record = copy.deepcopy(latest[1])
    values: dict[tuple[str, str, str], list[float]] = {}
    for _, run, _ in same:
        for m in run.measurements:
            if m.value is not None and m.unit:
                values.setdefault((m.name, m.unit, m.subject), []).append(float(m.value))
    kept = {(m.name, m.unit, m.subject): m for _, run, _ in same for m in run.measurements}
    record.measurements = [Measurement(name, statistics.median(v), unit, subject, kept[(name, unit, subject)].details)
                           for (name, unit, subject), v in values.items()]
    refs = "+".join(name.split()[0] for name, _, _ in same)
    label = record.options.get("label")
    name = f"{refs} {label}" if label else refs
    prices = [p for _, run, p in sorted(same, key=lambda e: e[1].started_at) if p is not None]
    return (name, record, prices[-1] if prices else None), f"{name}: {len(same)} runs of one machine, merged: {_spread(same)}"


def _spread(same: list[Entry]) -> str:
    """Each key figure's range over the runs, and that range as a share of its median."""
    parts = []
    per_run = [run_figures(run) for _, run, _ in same]
    for name, label, unit in KEY_FIGURES:
        values = [f[(name, unit)].value for f in per_run if (name, unit) in f]
        if len(values) < 2:
            continue
        middle = statistics.median(values)
        pct = (max(values) - min(values)) / middle * 100 if middle else 0.0
        parts.append(f"{label} {min(values):.4g}-{max(values):.4g} {unit} (spread {pct:.1f}%)")
    figures = "; ".join(parts) or "no figure measured in more than one of them"
    return f"each figure is the median of the runs; {figures}"


def platform_sentences(comparison: Comparison, platform_of_run: dict[str, str], money: Currency) -> list[str]:
    """Per platform, its cheapest ranked machine and what it costs; the cheapest platform first."""
    if not comparison.ranking or len(set(platform_of_run.values())) < 2:
        return []
    best: dict[str, tuple[str, float]] = {}
    for ranked in comparison.ranking:  # cheapest first: the first of each platform is its best
        platform = platform_of_run.get(ranked.name)
        if platform and platform not in best:
            best[platform] = (ranked.name, ranked.cost)
    what = (comparison.rank_unit or "").removeprefix(f"{money.code} ")
    machines = {p: sum(1 for q in platform_of_run.values() if q == p) for p in set(platform_of_run.values())}
    lines = [f"{platform}: cheapest machine {name} at {money.amount(cost)} {what} "
             f"({machines[platform]} machine{'s' if machines[platform] > 1 else ''} compared)"
             for platform, (name, cost) in best.items()]
    unranked = sorted(set(platform_of_run.values()) - set(best))
    lines += [f"{platform}: no machine could be ranked (no price or no throughput)" for platform in unranked]
    return lines
