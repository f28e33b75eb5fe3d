"""A clock that moves only when the test says so, for benchmarks whose budget the tests check:
what a benchmark does with its time is then the same on an idle laptop and a loaded CI machine."""

from __future__ import annotations

import time
from typing import Any


class FakeClock:
    """Stands in for the `time` module of the modules given to install(): monotonic, perf_counter
    and process_time read `now`, which only advance() moves; anything else is the real time's."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def monotonic(self) -> float:
        return self.now

    perf_counter = process_time = monotonic

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def install(self, monkeypatch: Any, *modules: Any) -> FakeClock:
        for module in modules:
            monkeypatch.setattr(module, "time", self)
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)
