"""Naming the runs of a comparison as a user wrote them: the entry a stored run or record file
makes, unique column names, "8 h on RUN" jobs, and "REF=USD" prices found by id, file or label."""

from __future__ import annotations

import os
import re
from collections import Counter

from ..record import RunRecord

def entry(record: RunRecord, ref: str) -> tuple[str, RunRecord, float | None]:
    """What `compare` takes for a stored run or a record file: named "REF label" (REF the id or file
    the user gave, so `--job "8 h on REF"` finds it), priced from the record's options."""
    label = record.options.get("label")
    price = record.options.get("price")
    return (f"{ref} {label}" if label else ref), record, (float(price) if price is not None else None)


def unique_names(names: list[str]) -> list[str]:
    seen: Counter[str] = Counter()
    unique = []
    for name in names:
        seen[name] += 1
        unique.append(name if seen[name] == 1 else f"{name} ({seen[name]})")
    return unique


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
    names = unique_names([name for name, _, _ in entries])
    labels = [record.options.get("label") for _, record, _ in entries]
    priced = list(entries)
    for reference, price in prices:
        i = find_run(reference, names, labels, what="--price")
        priced[i] = (priced[i][0], priced[i][1], price)
    return priced
