"""The local vet (runner.run_live) in a thread, under a deadline: a vet that outlives it is
reported, not waited for."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from .. import runner
from ..record import RunRecord
from .options import Options, pause


@dataclass
class VetOutcome:
    record: RunRecord | None = None
    error: str | None = None
    hung: bool = False  # the vet thread is still running: the process must not wait for it


def vet_with_deadline(options: Options, timeout_s: float, on_step: Callable[[str], None]) -> VetOutcome:
    """runner.run_live in a thread; a vet that outlives `timeout_s` is reported, not waited for."""
    outcome = VetOutcome()
    last_step = ["starting"]

    def progress(message: str) -> None:
        last_step[0] = message
        on_step(f"local vet: {message}")

    def work() -> None:
        try:
            if options.test_pause_at == "vet":
                pause("vet")
            outcome.record = runner.run_live(
                quick=options.quick, expect=options.expect, workdir=options.workdir, benchmarks=options.benchmarks,
                device=options.device, soak_minutes=options.soak_minutes, force=options.force,
                preemptible=options.preemptible, progress=progress)
        except Exception as err:  # reported to rank 0 by name, with the others' results
            outcome.error = f"the local vet crashed: {type(err).__name__}: {err}"

    thread = threading.Thread(target=work, name="gpuvet-vet", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        outcome.hung = True
        outcome.error = f"the local vet did not finish in {timeout_s:.0f} s (last step: {last_step[0]})"
    return outcome
