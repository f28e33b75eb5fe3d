"""How long `gpuvet run --quick`, `gpuvet inspect` and the default `gpuvet run` take.

Targets: run --quick under 3 s on a 2-core machine without GPU and inspect of the largest capture
under 1 s (issue 2), printed as the median of N runs of each with the ratio to `python -c pass`
measured in the same run, so figures from different machines can be compared; the default
`gpuvet run` (facts and every benchmark) under 60 s on that machine (issue 3; 120 s on a GPU
machine), timed once since it takes a minute, in a scratch directory (its storage test writes
there) and without touching the history.

    .venv/bin/python benchmarks/cli_speed.py [--repeat 5] [--no-default-run]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
DEFAULT_RUN_TARGET_S = 60.0  # on a 2-core machine without GPU (issue 3)


def timed(argv: list[str], repeat: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def default_run() -> tuple[float, int]:
    """Seconds and exit code of one default `gpuvet run`, in a scratch directory, history untouched."""
    with tempfile.TemporaryDirectory(prefix="gpuvet-cli-speed-") as scratch:
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), GPUVET_DB=str(Path(scratch) / "history.sqlite"))
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "gpuvet", "run", "--json", "--no-save"], cwd=scratch, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        return time.perf_counter() - start, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-default-run", action="store_true", help="skip timing the default `gpuvet run` (about a minute)")
    args = parser.parse_args()
    repeat = args.repeat
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
    if not args.no_default_run:
        seconds, code = default_run()
        # exit 0 or 1 (a failed check) is a finished run; anything else is not a figure to compare
        state = "finished" if code in (0, 1) else f"DID NOT FINISH (exit {code})"
        print(f"default `gpuvet run`, one run: {seconds:.1f} s (target < {DEFAULT_RUN_TARGET_S:.0f} s on 2 CPUs "
              f"without GPU), {state}")


if __name__ == "__main__":
    main()
