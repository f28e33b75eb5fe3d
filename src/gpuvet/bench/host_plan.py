"""The host benchmarks: storage, network and CPU feed rate. They need no GPU and no torch, so they
run in gpuvet's own process (each with its own time budget) before the GPU benchmarks."""

from __future__ import annotations

from typing import Any, Callable

from .schedule import HOST_BENCHMARKS as HOST  # noqa: F401  (the names, for the runner and the CLI)
from .schedule import HOST_BUDGET_S as BUDGET_S
from .schedule import host_budget_s

# Where a benchmark's failure note goes: the subject its findings are about.
_SUBJECT = {"net": "loopback", "cpu": "cpu"}


def run(names: list[str], paths: list[str], engine: str = "auto",
        progress: Callable[[str], None] = lambda message: None) -> list[dict[str, Any]]:
    measurements: list[dict[str, Any]] = []
    for name in names:
        progress(f"benchmark {name}")
        try:
            measurements += _one(name, paths, engine, progress)
        except KeyboardInterrupt:
            raise
        except Exception as err:  # one broken benchmark must not stop the others
            subject = paths[0] if name == "disk" and paths else _SUBJECT.get(name, "host")
            measurements.append({"name": f"bench.{name}", "value": None, "unit": "", "subject": subject,
                                 "details": {"outcome": "failed", "reason": f"{type(err).__name__}: {err}"}})
    return measurements


def prepare(names: list[str]) -> None:
    """Start, in the background, what a benchmark among `names` would otherwise spend its own
    budget starting (the CPU feed's worker server, which imports torch), while the facts are read."""
    if "cpu" in names:
        from . import cpufeed

        cpufeed.warm_up()


def _one(name: str, paths: list[str], engine: str, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    if name == "disk":
        from . import disk

        return disk.run(paths, engine=engine, budget_s=host_budget_s("disk", len(paths)), progress=progress)
    if name == "net":
        from . import net

        return net.run_loopback(engine=engine, budget_s=BUDGET_S["net"], progress=progress)
    if name == "cpu":
        from . import cpufeed

        return cpufeed.run(budget_s=BUDGET_S["cpu"], progress=progress)
    raise ValueError(f"unknown host benchmark {name!r}")
