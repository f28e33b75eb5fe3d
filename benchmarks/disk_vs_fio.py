"""gpuvet's built-in disk engine against fio, on the same file in the same run.

Targets (issue 8): the built-in engine within 10% of fio for sequential write, sequential read
and random 4 KiB read IOPS (the same jobs on both sides: 1 MiB x 8 in flight, 4 KiB x 32 at
uniform random offsets, same file, same cache policy, each request submitted alone as soon as
one completes, as fio's libaio engine does by default); the whole host suite (disk, loopback
network and CPU feed, as `gpuvet run` runs them: host_plan with its budgets) in under 30 s.

A shared or virtual disk drifts over seconds, so each pass runs on both engines back to back,
alternating which goes first from round to round, and the ratio reported is the median of the
per-round ratios; the medians of the rounds each engine began are printed too, since whichever
runs first right after the file is rewritten can be slower on a virtual disk (with an odd number
of rounds one order has one round more). Prints figures, not pass/fail.

    .venv/bin/python benchmarks/disk_vs_fio.py [--path DIR] [--rounds 7] [--seconds 2] [--suite-only]

Pick a directory on the disk you want to know about: /tmp is often tmpfs (RAM).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpuvet.bench import disk, host_plan  # noqa: E402
from paired import by_order  # noqa: E402

TARGET = 0.10
SUITE_TARGET_S = 30.0
PASSES = {"seq_write": "MB/s", "seq_read": "MB/s", "rand_read": "IOPS"}


def figure(result: disk.Pass, phase: str) -> float:
    return result.iops if phase == "rand_read" else result.mb_s


def one_round(target: disk.Target, engines: dict, order: tuple[str, str], seconds: float) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {phase: {} for phase in PASSES}
    written = target.size
    for name in order:  # each writes a fresh file, as in a real run; the reads use what both wrote
        if os.path.exists(target.file):
            os.unlink(target.file)
        result = engines[name].seq_write(target, seconds)
        figures["seq_write"][name] = figure(result, "seq_write")
        written = min(written, result.bytes // disk.SEQ_BLOCK * disk.SEQ_BLOCK)
    for name in order:
        figures["seq_read"][name] = figure(engines[name].seq_read(target, seconds, written), "seq_read")
    for name in order:
        figures["rand_read"][name] = figure(engines[name].rand_read(target, seconds, written), "rand_read")
    return figures


def compare(path: str, rounds: int, seconds: float) -> None:
    fio = disk.find_fio()
    if fio is None:
        sys.exit("fio is not installed: apt-get install -y fio")
    size = disk.allowed_bytes(disk.free_bytes(path))
    if size is None:
        sys.exit(f"not enough free space in {path}")
    workdir = tempfile.mkdtemp(prefix=disk.TEMP_PREFIX, dir=path)
    try:
        target = disk._target(path, workdir, size)
        storage = target.storage
        print(f"{path}: {storage.fs_type} on {storage.device} (kind {storage.kind}), cache {target.cache}, "
              f"file {target.size / 2**20:.0f} MiB, {seconds:g} s per pass, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
        engines = {"builtin": disk.BuiltinEngine(), "fio": disk.FioEngine(fio, unlink=False)}  # both read one file
        ratios: dict[str, list[float]] = {phase: [] for phase in PASSES}
        firsts: list[str] = []
        for round_number in range(rounds):
            order = ("builtin", "fio") if round_number % 2 == 0 else ("fio", "builtin")
            firsts.append(order[0])
            figures = one_round(target, engines, order, seconds)
            cells = []
            for phase, unit in PASSES.items():
                builtin, fio_figure = figures[phase]["builtin"], figures[phase]["fio"]
                ratios[phase].append(builtin / fio_figure)
                cells.append(f"{phase} {builtin:.0f}/{fio_figure:.0f} {unit}")
            print(f"round {round_number + 1} ({order[0]} first), builtin/fio: " + "; ".join(cells))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nmedian built-in / fio over {rounds} rounds (target within {TARGET:.0%}):")
    for phase, values in ratios.items():
        median = statistics.median(values)
        verdict = "within target" if abs(median - 1) <= TARGET else "OUTSIDE target"
        print(f"  {phase:10s} {median:5.2f}  (rounds: {', '.join(f'{v:.2f}' for v in values)}; {by_order(values, firsts)})"
              f"  {verdict}")


def host_suite(path: str) -> None:
    """The host suite as `gpuvet run` runs it: host_plan with its own budgets (disk + net + cpu),
    each benchmark timed, against the 30 s target."""
    timings: dict[str, float] = {}
    results: list[dict] = []
    start = time.perf_counter()
    for name in host_plan.HOST:  # one at a time, as host_plan.run takes them, to time each
        began = time.perf_counter()
        results += host_plan.run([name], [path])
        timings[name] = time.perf_counter() - began
    suite_s = time.perf_counter() - start
    engines = sorted({m["details"]["engine"] for m in results if m["value"] is not None and m["details"].get("engine")})
    verdict = "within target" if suite_s < SUITE_TARGET_S else "OUTSIDE target"
    each = ", ".join(f"{name} {seconds:.1f} s (budget {host_plan.BUDGET_S[name]:g} s)" for name, seconds in timings.items())
    print(f"\nhost suite (host_plan: {', '.join(host_plan.HOST)}, its default budgets; engines {', '.join(engines)}): "
          f"{suite_s:.1f} s against the target of under {SUITE_TARGET_S:.0f} s: {verdict}\n  {each}")
    for m in results:
        print(f"  {m['name']:24s} {m['value']} {m['unit']}" if m["value"] is not None else f"  {m['name']}: {m['details']}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", default=str(ROOT), help="directory to test (default: the project's)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=2.0, help="time limit of each pass")
    parser.add_argument("--suite-only", action="store_true", help="only time the host suite (no fio comparison)")
    args = parser.parse_args()
    if not args.suite_only:
        compare(args.path, args.rounds, args.seconds)
    host_suite(args.path)


if __name__ == "__main__":
    main()
