"""gpuvet's built-in loopback TCP throughput against iperf3's, in the same run.

Target (issue 8): the built-in figure within 10% of iperf3's (one stream over 127.0.0.1 with
iperf3's defaults on both sides: 128 KiB writes, Nagle on, kernel-tuned buffers, the same
duration, counted at the receiver). Each round runs both, alternating which goes first, because
a shared machine drifts; the ratio reported is the median of the per-round ratios, with the
medians of the rounds each engine began. Loopback TCP on a small shared VM swings by tens of
percent from run to run (where the scheduler puts sender, receiver and the softirq work), so
use many rounds. The loopback latency gpuvet reports is printed too (iperf3 has no latency
test). Prints figures, not pass/fail.

    .venv/bin/python benchmarks/net_vs_iperf3.py [--rounds 15] [--budget 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from gpuvet.bench import net  # noqa: E402
from paired import by_order  # noqa: E402

TARGET = 0.10


def loopback(engine: str, budget: float) -> dict[str, dict]:
    results = {m["name"]: m for m in net.run_loopback(engine=engine, budget_s=budget)}
    if "bench.net" in results:
        sys.exit(f"{engine}: {results['bench.net']['details']['reason']}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--budget", type=float, default=5.0, help="run_loopback budget, seconds (throughput: half)")
    args = parser.parse_args()
    if net.find_iperf3() is None:
        sys.exit("iperf3 is not installed: apt-get install -y iperf3")
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    ratios, latencies, firsts = [], [], []
    for round_number in range(args.rounds):
        order = ("builtin", "iperf3") if round_number % 2 == 0 else ("iperf3", "builtin")
        firsts.append(order[0])
        runs = {engine: loopback(engine, args.budget) for engine in order}
        builtin, iperf3 = (runs[e]["net.loopback_throughput"]["value"] for e in ("builtin", "iperf3"))
        ratios.append(builtin / iperf3)
        latencies += [runs[e]["net.loopback_latency"]["value"] for e in order]
        print(f"round {round_number + 1} ({order[0]} first): builtin {builtin:.2f} Gbit/s, iperf3 {iperf3:.2f} Gbit/s, "
              f"ratio {builtin / iperf3:.2f}")
    median = statistics.median(ratios)
    verdict = "within target" if abs(median - 1) <= TARGET else "OUTSIDE target"
    print(f"\nmedian built-in / iperf3 over {args.rounds} rounds: {median:.2f} (target within {TARGET:.0%}): {verdict}")
    print(f"  rounds: {', '.join(f'{r:.2f}' for r in ratios)}; {by_order(ratios, firsts)}")
    print(f"loopback TCP round trip (gpuvet, median of runs): {statistics.median(latencies):.1f} us")


if __name__ == "__main__":
    main()
