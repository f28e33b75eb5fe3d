"""Each benchmark's wall time against its budget, on an idle machine and under a CPU hog.

A renter's node is often busy; a benchmark's budget must hold there too (issue 18). For each
benchmark that runs without a GPU (the host ones, and the GPU ones on PyTorch's CPU build) this
runs `gpuvet bench NAME --device cpu` once idle and once with one busy-looping process per core,
and prints the budget (bench/schedule.py), the allowed slack (starting gpuvet, reading the facts,
starting the benchmark worker: schedule's FACTS_S + WORKER_START_S, plus PROCESS_SLACK_S for the
Python processes a loaded machine starts slowly) and the wall time of the whole command.

    .venv/bin/python benchmarks/budget_under_load.py [--only cpu,net] [--no-hog]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpuvet.bench.schedule import FACTS_S, WORKER_START_S, gpu_budget_s, host_budget_s  # noqa: E402

HOST = ("disk", "net", "cpu")
ON_CPU = ("gemm", "membw", "sustained", "allreduce")  # the workload (60 s) is left out: run it with --only
PROCESS_SLACK_S = 10.0


def budget_s(name: str) -> float:
    return host_budget_s(name) if name in HOST else gpu_budget_s(name, device="cpu")


def slack_s(name: str) -> float:
    return FACTS_S + PROCESS_SLACK_S + (0.0 if name in HOST else WORKER_START_S)


def timed(name: str) -> tuple[float, str]:
    """Wall seconds of `gpuvet bench NAME --device cpu`, and what its record says it measured."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    with tempfile.TemporaryDirectory(prefix="gpuvet-budget-") as scratch:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "gpuvet", "bench", name, "--device", "cpu", "--json", "--no-save"],
                              cwd=scratch, env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
    try:
        record = json.loads(done.stdout)
        notes = [m["details"].get("reason", "") for m in record["measurements"] if m["value"] is None and m.get("details")]
        what = "; ".join(n for n in notes if n)[:70] or f"{len(record['measurements'])} measurements"
    except (ValueError, KeyError):
        what = f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
    return wall, what


def _spin() -> None:
    while True:
        pass


def hog() -> list[multiprocessing.Process]:
    """One busy process per core the hog may use."""
    workers = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(os.cpu_count() or 1)]
    for w in workers:
        w.start()
    return workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated benchmark names")
    parser.add_argument("--no-hog", action="store_true", help="idle only")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else [*HOST, *ON_CPU]
    print(f"{os.cpu_count()} cores; load average before: {os.getloadavg()[0]:.1f}")
    print(f"{'benchmark':<10} {'budget':>7} {'slack':>6} {'idle':>7} {'hog':>7}  within?  notes")
    over = 0
    for name in names:
        budget, slack = budget_s(name), slack_s(name)
        idle, note = timed(name)
        loaded = None
        if not args.no_hog:
            hogs = hog()
            try:
                loaded, note_hog = timed(name)
                note = note_hog if note_hog != note else note
            finally:
                for h in hogs:
                    h.terminate()
                for h in hogs:
                    h.join()
        worst = max(idle, loaded or 0.0)
        ok = worst <= budget + slack
        over += not ok
        print(f"{name:<10} {budget:>6.1f}s {slack:>5.1f}s {idle:>6.1f}s "
              + (f"{loaded:>6.1f}s" if loaded is not None else f"{'-':>7}") + f"  {'yes' if ok else 'NO':<7}  {note}")
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
