"""How long `gpuvet run --quick` and `gpuvet inspect` take, against a bare Python start.

Targets (issue 2): run --quick under 3 s on a 2-core machine without GPU; inspect of the largest
capture under 1 s. Prints the median of N runs of each, and the ratio to `python -c pass`
measured in the same run, so figures from different machines can be compared.

    .venv/bin/python benchmarks/cli_speed.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def timed(argv: list[str], repeat: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat
    largest = max((p for p in FIXTURES.rglob("*") if p.is_file() and p.suffix in (".txt", ".xml")), key=lambda p: p.stat().st_size)
    python = sys.executable
    baseline = timed([python, "-c", "pass"], repeat)
    cases = {
        "python -c pass (baseline)": baseline,
        "gpuvet run --quick": timed([python, "-m", "gpuvet", "run", "--quick", "--json"], repeat),
        f"gpuvet inspect {largest.name} ({largest.stat().st_size // 1024} KiB)": timed(
            [python, "-m", "gpuvet", "inspect", str(largest), "--json"], repeat),
    }
    print(f"median of {repeat} runs on {os.cpu_count()} CPUs")
    for label, seconds in cases.items():
        print(f"  {seconds:6.3f} s  {seconds / baseline:6.1f} x baseline  {label}")


if __name__ == "__main__":
    main()
