"""B5 sustained load: a steady matmul stream for `duration_s`, throughput per window.

The parent samples power, clocks, temperature and clock-event reasons (telemetry) meanwhile;
this side reports what the GPU delivered over time, so a decay from the first to the last fifth
(heat soaking in) shows.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from .common import BenchContext, free_memory_bytes, measurement, synchronize

WINDOW_S = 0.25  # one throughput point per window: fine enough to see a drop, cheap to record
# Each window's last product is compared with the first one (gpu-burn compares every product): the
# inputs never change, so a healthy GPU repeats it; corruption that shows only once the card is hot
# does not. Differences up to this share of the product's RMS are allowed, for a library that sums
# in a different order; a flipped exponent bit is far larger.
CHECK_TOLERANCE = 1e-2


def _dtype(ctx: BenchContext) -> torch.dtype:
    if not ctx.is_cuda:
        return torch.float32
    major, _minor = torch.cuda.get_device_capability(ctx.device)
    return torch.bfloat16 if major >= 8 else torch.float16


def _size(ctx: BenchContext, dtype: torch.dtype) -> int:
    """Square matrices big enough to keep the GPU saturated, small enough for free memory."""
    if not ctx.is_cuda:
        return int(ctx.params.get("size", 1024))
    size = int(ctx.params.get("size", 8192))
    element = torch.tensor([], dtype=dtype).element_size()
    while size > 1024 and 5 * size * size * element > free_memory_bytes(ctx.device) // 4:  # a, b, c, the first, a difference
        size //= 2
    return size


def run(ctx: BenchContext) -> list[dict]:
    asked = float(ctx.params.get("duration_s", 30.0 if ctx.is_cuda else 10.0))
    dtype = _dtype(ctx)
    n = _size(ctx, dtype)
    a = torch.randn(n, n, device=ctx.device, dtype=dtype)
    b = torch.randn(n, n, device=ctx.device, dtype=dtype)
    c = torch.empty(n, n, device=ctx.device, dtype=dtype)
    flops_per_mm = 2.0 * n * n * n

    batch = _batch_for_window(ctx, a, b, c)
    check = ProductCheck(c)
    # The load runs the whole time asked, counted from here: a first CUDA context and cuBLAS set-up
    # on 8 GPUs at once can take seconds, and must not shorten a 30 s test or a soak. The parent's
    # deadline (twice the budget plus slack) leaves room for that set-up.
    duration = asked
    ctx.progress(f"sustained load for {duration:.0f} s")
    windows: list[tuple[float, float]] = []  # (seconds since start, TFLOPS)
    start = time.time()
    end = start + duration
    while time.time() < end:
        t0 = time.perf_counter()
        window_end = min(end, time.time() + WINDOW_S)
        calls = 0  # counted here: a CPU window can stop before the batch is done
        while calls < batch:
            calls += 1
            torch.mm(a, b, out=c)
            # On a contended CPU a window sized a moment ago can take many times longer: each
            # window and the load end on time all the same (on a GPU the calls queue; the
            # re-aimed batch bounds the window there).
            if not ctx.is_cuda and time.time() >= window_end:
                break
        synchronize(ctx.device)
        elapsed = time.perf_counter() - t0
        windows.append((round(time.time() - start, 3), calls * flops_per_mm / elapsed / 1e12))
        check.compare(c, windows[-1][0])  # outside the timed window
        # Re-aim every window: one calibration call can run fast or slow (a preempted thread, a
        # clock ramping up), and a batch sized from it alone could fill the whole run; never
        # aim past the end of the load.
        left = max(0.0, end - time.time())
        batch = max(1, min(4 * batch, int(batch * min(WINDOW_S, left) / max(elapsed, 1e-6))))
    del a, b, c  # the worker empties torch's cache once every GPU's thread is done
    return _results(ctx, windows, dtype, n, start, check.details())


def _batch_for_window(ctx: BenchContext, a, b, c) -> int:
    """Calls that take about WINDOW_S, from the slowest of three timed calls (a first guess:
    the loop re-aims it every window)."""
    torch.mm(a, b, out=c)
    synchronize(ctx.device)
    slowest = 1e-6
    for _ in range(3):
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        synchronize(ctx.device)
        slowest = max(slowest, time.perf_counter() - t0)
    return max(1, int(WINDOW_S / slowest))


class ProductCheck:
    """The first product, and how later ones compared with it."""

    def __init__(self, first: torch.Tensor) -> None:
        self.first = first.clone()
        self.rms = float(self.first.float().pow(2).mean().sqrt()) or 1.0
        self.checked = self.wrong = 0
        self.first_wrong_at_s: float | None = None
        self.largest = 0.0

    def compare(self, product: torch.Tensor, at_s: float) -> None:
        difference = float((product - self.first).abs().amax()) / self.rms
        self.checked += 1
        if not math.isfinite(difference) or difference > CHECK_TOLERANCE:
            self.wrong += 1
            self.first_wrong_at_s = at_s if self.first_wrong_at_s is None else self.first_wrong_at_s
        self.largest = difference if not math.isfinite(difference) else max(self.largest, difference)

    def details(self) -> dict:
        return {"windows_checked": self.checked, "windows_wrong": self.wrong, "first_wrong_at_s": self.first_wrong_at_s,
                "largest_difference_of_rms": None if not math.isfinite(self.largest) else round(self.largest, 6),
                "how": f"each window's last product against the first, max |difference| / RMS > {CHECK_TOLERANCE:g} is wrong"}


def _results(ctx: BenchContext, windows: list[tuple[float, float]], dtype, n: int, start: float,
             check: dict) -> list[dict]:
    rates = [rate for _, rate in windows]
    fifth = max(1, len(rates) // 5)
    first, last = statistics.mean(rates[:fifth]), statistics.mean(rates[-fifth:])
    decay = 100.0 * (first - last) / first if first else 0.0
    ctx.series.append({
        "name": "sustained.throughput",
        "subject": ctx.subject,
        "interval_s": WINDOW_S,
        "start": start,
        "columns": ["t", "tflops"],
        "rows": [[t, round(r, 3)] for t, r in windows],
    })
    details = {"dtype": str(dtype).removeprefix("torch."), "shape": [n, n, n], "windows": len(rates),
               "duration_s": round(windows[-1][0], 1) if windows else 0.0}
    return [
        measurement("sustained.tflops", statistics.median(rates), "TFLOPS", ctx.subject,
                    first_fifth=round(first, 3), last_fifth=round(last, 3), min=round(min(rates), 3),
                    max=round(max(rates), 3), check=check, **details),
        measurement("sustained.decay_pct", round(decay, 2), "%", ctx.subject,
                    how="mean of the first fifth of the windows vs the last fifth", **details),
    ]
