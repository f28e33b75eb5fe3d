"""What every benchmark shares: its contract, a time budget, device timing, and statistics.

A benchmark module exposes

    def run(ctx: BenchContext) -> list[dict]

and returns measurement dicts (see `measurement()`). It runs inside the benchmark worker process
(`bench/worker.py`), which has imported torch, so modules import torch at module level. The same
code runs on "cpu" and "cuda:N": timing uses CUDA events on a GPU and a synchronised wall clock
on the CPU. A benchmark that cannot run on the device raises `Skip` with the reason.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable


# Work a benchmark left on a GPU that will not finish (a hung copy): its buffers, kept for the life
# of the worker so they are never freed or reused. The worker exits after such a job: nothing more
# can run on that GPU's streams, and freeing memory there would wait for ever.
STUCK_ON_GPU: list[Any] = []


class Skip(Exception):
    """This benchmark does not apply here (no CUDA, dtype unsupported...); the message says why."""


class OutOfTime(Exception):
    """The benchmark's time budget ran out before it could measure anything."""


@dataclass
class Budget:
    """A wall-clock allowance. Benchmarks size their loops to it and stop when it is spent."""

    seconds: float
    start: float = field(default_factory=lambda: time.monotonic())  # looked up at each start: a test's clock

    def remaining(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def expired(self) -> bool:
        return self.remaining() <= 0

    def share(self, fraction: float) -> Budget:
        """A sub-budget: `fraction` of what remains."""
        return Budget(max(0.0, self.remaining() * fraction))


@dataclass
class BenchContext:
    device: str  # "cpu" or "cuda:N"
    subject: str  # "gpu0" ... or "cpu": the subject of the measurements
    budget: Budget
    params: dict[str, Any] = field(default_factory=dict)
    progress: Callable[[str], None] = lambda message: None
    # Time series a benchmark records (e.g. throughput per window), as telemetry.to_series makes them.
    series: list[dict[str, Any]] = field(default_factory=list)

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")


def measurement(name: str, value: float | None, unit: str, subject: str, **details: Any) -> dict[str, Any]:
    """A measurement as the run record stores it (record.Measurement fields)."""
    return {"name": name, "value": value, "unit": unit, "subject": subject, "details": details}


def device_details(device: str) -> dict[str, Any]:
    """{"device": {...}}: the CUDA device's SMs and memory as the benchmark saw them (a MIG slice
    shows its share, which the judge scales the model's figures by); {} on the CPU."""
    import torch

    if not device.startswith("cuda"):
        return {}
    try:
        props = torch.cuda.get_device_properties(device)
    except (RuntimeError, AssertionError):  # no CUDA in this build: nothing to describe
        return {}
    return {"device": {"name": props.name, "sm_count": props.multi_processor_count,
                       "memory_total_mib": props.total_memory // 2**20}}


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


# A GPU's timed calls are queued in chunks, each behind a GPU-side wait (torch.cuda._sleep) long
# enough for the host to enqueue the whole chunk first: the CUDA events then time the GPU, not the
# host. Without it, eight GPUs' threads sharing one interpreter lock can take longer to launch a
# call than a small shape takes to run (H100 bf16 2048x2048x13312: ~141 us), and the gaps between
# launches were timed as GPU time.
ASSUMED_GPU_CLOCK_HZ = 2.0e9  # about the fastest boost clock: a slower GPU only waits longer
TIMED_CHUNK = 32  # calls per wait: ~130 queue entries with the flush and the events
HOST_AHEAD_MARGIN = 3.0  # the wait covers this many times the host's last enqueue time
FIRST_ENQUEUE_GUESS_S = 100e-6  # per call, before one has been measured
MAX_HOST_AHEAD_S = 0.25


def host_ahead_wait(device: str) -> Callable[[float], None] | None:
    """A function that queues a GPU-side wait of about `seconds` on `device`'s current stream;
    None on the CPU or where this PyTorch lacks the (private) torch.cuda._sleep."""
    import torch

    sleep = getattr(torch.cuda, "_sleep", None) if device.startswith("cuda") else None
    if sleep is None:
        return None

    def wait(seconds: float) -> None:
        with torch.cuda.device(device):
            sleep(int(min(seconds, MAX_HOST_AHEAD_S) * ASSUMED_GPU_CLOCK_HZ))
    return wait


def time_each(device: str, fn: Callable[[], Any], repeats: int, before: Callable[[], Any] | None = None) -> list[float]:
    """Seconds taken by each of `repeats` calls of `fn`. `before` runs ahead of every call, outside
    the timed region (e.g. flushing the L2 cache so each call starts cold)."""
    import torch

    times = []
    if device.startswith("cuda"):
        stream = torch.cuda.current_stream(device)
        wait = host_ahead_wait(device)
        pairs: list[tuple[Any, Any]] = []
        per_call_s = FIRST_ENQUEUE_GUESS_S
        while len(pairs) < repeats:
            chunk = min(TIMED_CHUNK, repeats - len(pairs))
            if wait is not None:
                wait(HOST_AHEAD_MARGIN * per_call_s * chunk)
            queued = time.perf_counter()
            for _ in range(chunk):
                if before is not None:
                    before()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(stream)
                fn()
                end.record(stream)
                pairs.append((start, end))
            per_call_s = (time.perf_counter() - queued) / chunk
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) / 1000.0 for s, e in pairs]
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def calibrate_repeats(device: str, fn: Callable[[], Any], target_s: float, at_most: int = 1000, at_least: int = 3) -> int:
    """How many calls of `fn` fit in `target_s` (one timed call, after it has run once)."""
    fn()
    synchronize(device)
    (one,) = time_each(device, fn, 1)
    if one <= 0:
        return at_most
    return max(at_least, min(at_most, int(target_s / one)))


def summary(values: list[float]) -> dict[str, float]:
    """Median, min, max and the spread a reader needs to trust a figure."""
    if not values:
        return {}
    med = statistics.median(values)
    return {
        "median": med,
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "spread_pct": 100.0 * (max(values) - min(values)) / med if med else math.nan,
    }


def free_memory_bytes(device: str) -> int:
    """Memory a benchmark may use on `device` (CUDA: free now; CPU: available RAM)."""
    import torch

    if device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)
