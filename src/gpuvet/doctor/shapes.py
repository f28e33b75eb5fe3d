"""The shapes of doctor's table: a symptom, its causes, and what a run says of each."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..judge.doctor_facts import CONFIRMED, RULED_OUT, UNKNOWN, FactVerdict
from ..record import RunRecord

__all__ = ["CONFIRMED", "RULED_OUT", "UNKNOWN", "FactVerdict", "Cause", "Symptom", "CauseResult", "Diagnosis"]


@dataclass(frozen=True)
class Cause:
    name: str
    rules_out: tuple[str, ...] = ()  # checks that test it: a problem confirms it, a pass rules it out
    checks: tuple[str, ...] = ()  # checks that only bear on it: a problem confirms it, a pass rules nothing out
    measure: str = "gpuvet run"  # the gpuvet command that tests it
    commands: tuple[str, ...] = ()  # what a person runs to confirm it by hand
    facts: Callable[[RunRecord], FactVerdict | None] | None = None  # for causes no check covers
    untested: str = ""  # why the bearing checks cannot rule it out, for "not tested by this run"


@dataclass(frozen=True)
class Symptom:
    name: str  # short name typed on the command line
    description: str
    seed: str  # the seed's own words, to find the row there
    aliases: tuple[str, ...]  # other ways people say it: error messages, Chinese phrases
    causes: tuple[Cause, ...]
    advice: str = ""  # what the seed says to do whatever the cause
    # A symptom that comes and goes with the time of day: one run, taken at one time, can confirm
    # a cause it catches but cannot rule one out.
    by_time_of_day: bool = False


@dataclass
class CauseResult:
    cause: Cause
    state: str
    figures: list[str] = field(default_factory=list)  # what decided it
    next_step: str = ""  # remedy when confirmed, the command to measure it when unknown


@dataclass
class Diagnosis:
    symptom: Symptom
    record: RunRecord | None
    results: list[CauseResult]
    source: str | None = None  # which run answered ("run #4", a file)
    source_note: str | None = None  # why that run ("the latest full `gpuvet run` of this machine")

    def of(self, state: str) -> list[CauseResult]:
        return [r for r in self.results if r.state == state]
