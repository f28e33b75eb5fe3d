"""Answering a symptom from a run record, and finding the symptom a user's words name."""

from __future__ import annotations

import re

from ..wording import subject_range
from ..record import FAIL, PASS, SKIP, WARN, Finding, RunRecord
from .shapes import CONFIRMED, RULED_OUT, UNKNOWN, Cause, CauseResult, Diagnosis, FactVerdict, Symptom
from . import vocabulary
from .symptoms import SYMPTOMS

# -- answering from a record -----------------------------------------------------------------------

_ORDER = {CONFIRMED: 0, UNKNOWN: 1, RULED_OUT: 2}


def diagnose(symptom: Symptom, record: RunRecord | None = None, source: str | None = None,
             source_note: str | None = None) -> Diagnosis:
    """Every cause of the symptom, confirmed first, then unknown, then ruled out."""
    results = [_answer(cause, record) for cause in symptom.causes]
    if record is not None and symptom.by_time_of_day:
        results = [_one_time_of_day(r, record) for r in results]
    if record is not None:
        results.sort(key=lambda r: _ORDER[r.state])
    return Diagnosis(symptom, record, results, source, source_note)


def _one_time_of_day(result: CauseResult, record: RunRecord) -> CauseResult:
    """A pass at one time of day says nothing about another: what looked fine stays open."""
    if result.state != RULED_OUT:
        return result
    from ..store import (
        machine_identity,  # the key `gpuvet history --machine` groups runs by
    )

    key = machine_identity(record.machine).key
    when = record.started_at.replace("T", " ")[:16]
    figures = [f"not tested: one run at one time of day cannot rule out a day-time cause; compare runs at "
               f"different times with `gpuvet history --machine {key}`"]
    figures += [f"seen at {when} UTC: {figure}" for figure in result.figures]
    return CauseResult(result.cause, UNKNOWN, figures,
                       f"run `{result.cause.measure or 'gpuvet run'}` by day and at night, then `gpuvet history --machine {key}`")


def _to_measure(cause: Cause) -> str:
    by_hand = f"by hand: {'; '.join(cause.commands)}" if cause.commands else ""
    if not cause.measure or (not cause.rules_out and not cause.checks and cause.facts is None):
        return by_hand
    return f"`{cause.measure}`" + (f"; {by_hand}" if by_hand else "")


def _answer(cause: Cause, record: RunRecord | None) -> CauseResult:
    if record is None:
        return CauseResult(cause, UNKNOWN, [], _to_measure(cause))
    if not cause.rules_out and not cause.checks and cause.facts is None:
        return CauseResult(cause, UNKNOWN, ["a run record cannot show this; check it by hand"], _to_measure(cause))
    found = [f for f in record.findings if f.check in cause.rules_out or f.check in cause.checks]
    if not record.machine.gpus and found and all(f.check.startswith("gpu.") for f in found):
        return _no_gpu_to_tell(cause, record)
    problems = [f for f in found if f.status in (FAIL, WARN)]
    tests = [f for f in found if f.status == PASS and f.check in cause.rules_out]
    fact = cause.facts(record) if cause.facts else None
    if problems:
        figures = _figures(problems) + ([fact[1]] if fact and fact[0] == CONFIRMED else [])
        return CauseResult(cause, CONFIRMED, figures, problems[0].remedy or _to_measure(cause))
    if fact and fact[0] == CONFIRMED:
        return CauseResult(cause, CONFIRMED, [fact[1]], "; ".join(cause.commands))
    if tests or (fact and fact[0] == RULED_OUT):
        figures = _figures(tests) + ([fact[1]] if fact else [])
        return CauseResult(cause, RULED_OUT, figures)
    return CauseResult(cause, UNKNOWN, _open_figures(cause, found, fact), _to_measure(cause))


def _no_gpu_to_tell(cause: Cause, record: RunRecord) -> CauseResult:
    """A run that saw no GPU can neither confirm nor rule out a cause that lives in the GPU: its
    "no GPU visible" is a different problem (`gpuvet doctor container-no-gpu`)."""
    why = record.machine.gpu_error or "no NVIDIA GPU found"
    return CauseResult(cause, UNKNOWN, [f"not tested: this run saw no NVIDIA GPU ({why}), so it cannot tell"],
                       f"where the GPU is visible: {_to_measure(cause)}; if it should be visible here: "
                       f"`gpuvet doctor container-no-gpu`")


def _open_figures(cause: Cause, found: list[Finding], fact: FactVerdict | None) -> list[str]:
    """Why a cause stays open: what would test it, and what the run saw that bears on it."""
    bearing = [f for f in found if f.status == PASS]  # passes of checks that cannot rule it out
    skipped = list(dict.fromkeys(f.summary for f in found if f.status == SKIP))
    if bearing or (fact and cause.untested):
        figures = [f"not tested by this run: {cause.untested}" if cause.untested else "not tested by this run"]
        # why the check that tests it could not: its skip's words
        why = list(dict.fromkeys(f.summary for f in found if f.status == SKIP and f.check in cause.rules_out))
        seen = [line if line.startswith("...") else f"seen: {line}" for line in _figures(bearing, limit=2)]
        return figures + ([fact[1]] if fact else []) + why[:1] + seen
    return ([fact[1]] if fact else []) + skipped[:2] or ["not measured in this run"]


def _figures(findings: list[Finding], limit: int = 3) -> list[str]:
    """ "subjects: summary" per distinct summary, worst first."""
    by_text: dict[tuple[str, str], list[str]] = {}
    for f in sorted(findings, key=lambda f: f.status != FAIL):
        by_text.setdefault((f.check, f.summary), []).append(f.subject)
    lines = [f"{subject_range(list(dict.fromkeys(subjects)))}: {summary}" for (_, summary), subjects in by_text.items()]
    return lines[:limit] + ([f"... {len(lines) - limit} more"] if len(lines) > limit else [])



# -- finding a symptom from what the user typed ----------------------------------------------------

_STOP = {"the", "a", "an", "is", "are", "my", "it", "its", "gpu", "gpus", "and", "or", "to", "of", "in", "on", "for", "with",
         "than", "from", "after", "but", "very", "too", "when", "i", "me", "this", "that", "be", "at", "by", "not"}


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "er", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def _words(text: str) -> set[str]:
    return {_stem(w) for w in re.findall(r"[a-z0-9_]+", text.lower())} - _STOP


def find_symptom(text: str) -> Symptom | None:
    """The symptom a short name, a phrase, an error message or the seed's Chinese words describe."""
    query = text.strip().lower()
    if not query:
        return None
    for symptom in SYMPTOMS:
        if query.replace(" ", "-").replace("_", "-") == symptom.name:
            return symptom
    named = vocabulary.matches(query)
    # The vocabulary's words weigh double: a reader's own word ("功耗墙", "xid") says more than the
    # words a sentence shares with a row's description.
    scored = [(_score(query, symptom) + 2 * len(named.get(symptom.name, ())), n, symptom) for n, symptom in enumerate(SYMPTOMS)]
    best = max(scored, key=lambda item: (item[0], -item[1]))
    return best[2] if best[0] > 0 else None


def known_symptoms() -> str:
    """What doctor knows, for the line that says nothing matched."""
    return vocabulary.known_symptoms([(s.name, s.description) for s in SYMPTOMS])


def _score(query: str, symptom: Symptom) -> int:
    phrases = [p.lower() for p in symptom.aliases + (symptom.seed, symptom.description)]
    # A whole phrase (an error message, the seed's row) weighs more than shared words.
    score = sum(3 for p in phrases if p in query or (len(query) >= 2 and query in p))
    vocabulary = _words(" ".join((symptom.name.replace("-", " "), symptom.description) + symptom.aliases))
    return score + len(_words(query) & vocabulary)
