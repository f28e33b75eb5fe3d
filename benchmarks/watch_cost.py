"""What `gpuvet watch` costs the machine it watches: CPU at 1 Hz and 10 Hz, and /metrics latency.

Targets (issue 6): under 1% of one core at 1 Hz; /metrics answered in under 50 ms.

CPU: the watch runs in a child process on a pseudo-terminal (the real rich Live view, drawn and
drained), and its CPU time (user + system, from /proc) is divided by the wall time of the measured
period, after a warm-up that excludes start-up (imports, the facts probe). The GPU part uses the
real NVML where a driver exists; `--stand-in-gpus N` replaces NVML by a stand-in answering N
GPUs instantly, which measures gpuvet's own work for N GPU blocks (drawing, diagnosis, processes)
but not the driver's time.

/metrics: an exporter serves the snapshot of a watch over N GPUs (stand-in NVML), and is asked
`--requests` times over loopback, a new connection each time like a first scrape.

    .venv/bin/python benchmarks/watch_cost.py                      # this machine's NVML (or none)
    .venv/bin/python benchmarks/watch_cost.py --stand-in-gpus 8    # 8 GPU blocks, no driver time
"""

from __future__ import annotations

import argparse
import os
import pty
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

# Runs in the child: optionally a stand-in NVML, then the watch itself.
_CHILD = r"""
import os, sys, types
sys.path.insert(0, {src!r})
gpus = {gpus}
if gpus:
    sys.path.insert(0, {bench!r})
    from watch_cost import install_stand_in_nvml
    install_stand_in_nvml(gpus)
from gpuvet.watch import watch
sys.exit(watch(interval_s={interval}, ui={ui}))
"""


def install_stand_in_nvml(count: int) -> None:
    """Replace NVML by instant answers for `count` busy GPUs (for measuring gpuvet's own cost)."""
    import types

    import pynvml

    ns = types.SimpleNamespace
    answers = {
        "nvmlDeviceGetCount": count,
        "nvmlDeviceGetHandleByIndex": lambda i: f"h{i}",
        "nvmlDeviceGetPowerUsage": 612_000,
        "nvmlDeviceGetEnforcedPowerLimit": 700_000,
        "nvmlDeviceGetClockInfo": lambda h, kind: 1980,
        "nvmlDeviceGetTemperatureV": lambda h, sensor: 70,
        "nvmlDeviceGetUtilizationRates": ns(gpu=97, memory=40),
        "nvmlDeviceGetMemoryInfo": ns(total=80 * 2**30, used=20 * 2**30, free=60 * 2**30),
        "nvmlDeviceGetCurrentClocksEventReasons": 0x4,
        "nvmlDeviceGetCurrPcieLinkGeneration": 5,
        "nvmlDeviceGetCurrPcieLinkWidth": 16,
        "nvmlDeviceGetViolationStatus": lambda h, policy: ns(referenceTime=0, violationTime=0),
        "nvmlDeviceGetPcieThroughput": lambda h, counter: 1000,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [ns(pid=os.getpid(), usedGpuMemory=20 * 2**30)],
        "nvmlSystemGetProcessName": lambda pid: "python",
    }

    def refuse(*_args):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def answer(value):
        return value if callable(value) else (lambda *_args: value)

    for name in dir(pynvml):
        if name.startswith(("nvmlDevice", "nvmlSystem")):
            setattr(pynvml, name, answer(answers[name]) if name in answers else refuse)
    pynvml.nvmlInit = lambda: None
    pynvml.nvmlShutdown = lambda: None


def _drain(fd: int, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            if not os.read(fd, 65536):
                return
        except OSError:
            return


def cpu_cost(interval_s: float, gpus: int, warmup_s: float, period_s: float, ui: bool = True) -> float:
    """% of one core the watch uses at `interval_s`, measured over `period_s` after `warmup_s`."""
    code = _CHILD.format(src=str(ROOT / "src"), bench=str(Path(__file__).parent), gpus=gpus, interval=interval_s, ui=ui)
    master, slave = pty.openpty()
    os.system(f"stty -F {os.ttyname(slave)} cols 160 rows 60 2>/dev/null")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    stop = threading.Event()
    threading.Thread(target=_drain, args=(master, stop), daemon=True).start()
    try:
        proc = psutil.Process(child.pid)
        time.sleep(warmup_s)
        if child.poll() is not None:
            raise RuntimeError(f"the watch exited early with code {child.returncode}")
        before, t0 = proc.cpu_times(), time.monotonic()
        time.sleep(period_s)
        after, t1 = proc.cpu_times(), time.monotonic()
        used = (after.user - before.user) + (after.system - before.system)
        return 100.0 * used / (t1 - t0)
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
        stop.set()
        os.close(master)


def metrics_latency(gpus: int, requests: int) -> list[float]:
    """Milliseconds per GET /metrics (new connection each) of an exporter holding a watch's snapshot."""
    from gpuvet import watch
    from gpuvet.watch import exporter
    from gpuvet.facts import Host, Machine

    install_stand_in_nvml(gpus)
    monitor = watch.Monitor(1.0, machine=Machine(host=Host(hostname="bench")), threaded=False, slow_every_s=0.0)
    monitor.start()
    snap = None
    for _ in range(3):
        snap = monitor.tick()
    monitor.close()
    served = exporter.Exporter()
    served.update(snap)
    port = served.serve("127.0.0.1", 0)
    times = []
    try:
        for _ in range(requests):
            t0 = time.perf_counter()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
                body = answer.read()
            times.append(1000.0 * (time.perf_counter() - t0))
    finally:
        served.close()
    lines = body.count(b"\n")
    print(f"  /metrics body: {len(body)} bytes, {lines} lines for {len(snap.gpus)} GPU(s)")
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stand-in-gpus", type=int, default=0, metavar="N", help="stand-in NVML with N GPUs (0: real NVML)")
    parser.add_argument("--period", type=float, default=20.0, help="seconds measured at each rate")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of start-up left out")
    parser.add_argument("--requests", type=int, default=200, help="GETs of /metrics")
    parser.add_argument("--metrics-gpus", type=int, default=8, help="GPUs in the snapshot /metrics serves")
    args = parser.parse_args()

    from gpuvet.probe import nvml

    nvml_state = "stand-in NVML, %d GPU(s)" % args.stand_in_gpus if args.stand_in_gpus else (nvml.init_error() or "real NVML")
    print(f"gpuvet watch cost on {psutil.cpu_count()} CPU(s), {nvml_state}; warm-up {args.warmup:g} s, period {args.period:g} s")
    failed = False
    for interval, label in ((1.0, "1 Hz"), (0.1, "10 Hz")):
        for ui in (True, False):
            pct = cpu_cost(interval, args.stand_in_gpus, args.warmup, args.period, ui=ui)
            target = " (target < 1%)" if interval == 1.0 and ui else ""
            print(f"  {label:>5} {'live view' if ui else 'headless ':9}: {pct:5.2f}% of one core{target}")
            failed |= bool(target) and pct >= 1.0
    times = metrics_latency(args.metrics_gpus, args.requests)
    times.sort()
    p50, p95 = statistics.median(times), times[int(0.95 * (len(times) - 1))]
    print(f"  /metrics ({args.metrics_gpus} GPUs, {len(times)} requests): median {p50:.1f} ms, p95 {p95:.1f} ms, "
          f"max {times[-1]:.1f} ms (target < 50 ms)")
    failed |= p95 >= 50.0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
