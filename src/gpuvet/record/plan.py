"""The benchmark plan as types: what `gpuvet run --plan --json` (and `inspect --plan`) prints, each
step with the GPUs it loads, its budget, what runs alongside and why it is skipped; bench/schedule.py
makes it, `gpuvet schema plan` publishes it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class PlanStep:
    name: str  # a benchmark, or "facts" / "worker"
    where: str  # "host", "cpu", "gpu0-7", "gpu0", "machine"
    budget_s: float  # the step's wall time in the plan
    how: str  # one line: what runs, and how (side by side, one GPU at a time ...)
    alongside: list[str] = field(default_factory=list)  # host benchmarks held within this step
    skipped: str | None = None  # why it will not run here


@dataclass
class BenchPlan:
    profile: str  # "default", "bench", "soak", "quick"
    device: str
    gpus: list[int]  # the GPUs that will be loaded
    steps: list[PlanStep]
    notes: list[str] = field(default_factory=list)  # GPUs left alone, and why
    target_s: float | None = None  # the wall time a default run aims at (None for other profiles)

    @property
    def total_s(self) -> float:
        return round(sum(s.budget_s for s in self.steps if not s.skipped), 1)

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "device": self.device, "gpus": self.gpus, "total_s": self.total_s,
                "target_s": self.target_s, "steps": [asdict(s) for s in self.steps], "notes": self.notes}
