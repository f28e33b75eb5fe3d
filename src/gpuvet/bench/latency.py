"""B4: CUDA context creation in a fresh process, and kernel launch latency.

Context creation is what every new CUDA process pays before its first kernel. The seeds saw about
95 ms with a passed-through GPU and about 850 ms under vGPU, so it exposes virtualisation that the
GPU's name hides. It is measured in fresh child processes that call the driver API through ctypes
(no PyTorch import: the figure is the driver's and the hypervisor's, not Python's), from just
before cuInit to a synchronised primary context, the one the CUDA runtime and PyTorch use.

Kernel launch latency is the host time per launch of a tiny kernel (a 1-element `add_`, PyTorch's
dispatch included) when launches are queued back to back, plus the round trip of a launch followed
by a synchronize of the current stream. Both are host-side figures of PyTorch calls: not comparable
with GPU-side event timings of an empty CUDA kernel such as SuperBench's kernel-launch benchmark.
Everything runs with the GPU as the current device, so no call pays a device switch.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from .common import BenchContext, Budget, Skip, measurement, summary
from .context_child import (CHILD_SCRIPT, CHILD_TIMEOUT_S, CONTEXT_INIT_WHAT, ERROR_HINTS, LIBCUDA, ContextInitError,  # noqa: F401
                            InitTiming, parse_child_output, run_child)

DEFAULT_CONTEXT_RUNS = 5
LAUNCHES_PER_ROUND = 2000
LAUNCH_ROUNDS = 5
ROUNDTRIPS = 300

def run(ctx: BenchContext) -> list[dict]:
    if not ctx.is_cuda:
        raise Skip("CUDA context and kernel launch latency need a CUDA GPU")
    ordinal = torch.device(ctx.device).index or 0
    ctx.progress("latency.context_init")
    results = [_context_init_or_reason(ctx, ordinal)]
    ctx.progress("latency.kernel_launch")
    results.append(measure_kernel_launch(ctx.device, ctx.subject, ctx.budget))
    return results


def _context_init_or_reason(ctx: BenchContext, ordinal: int) -> dict:
    """The context measurement; when it cannot be had, a measurement without a value that says why,
    so the kernel launch figure is still reported."""
    try:
        return measure_context_init(
            ordinal, ctx.subject,
            runs=int(ctx.params.get("context_runs", DEFAULT_CONTEXT_RUNS)),
            libcuda=ctx.params.get("libcuda", LIBCUDA),
            budget=ctx.budget.share(0.7),
        )
    except Skip as why:
        return measurement("latency.context_init", None, "ms", ctx.subject, gpu=ordinal, skipped=str(why))
    except ContextInitError as err:
        return measurement("latency.context_init", None, "ms", ctx.subject, gpu=ordinal, error=str(err))


# --- context creation ------------------------------------------------------------------------


def measure_context_init(ordinal: int, subject: str, runs: int = DEFAULT_CONTEXT_RUNS, libcuda: str = LIBCUDA,
                         budget: Budget | None = None, timeout_s: float = CHILD_TIMEOUT_S,
                         python: str = sys.executable) -> dict:
    """Median over `runs` fresh processes (fewer when the budget runs out, at least one).
    Raises Skip without a CUDA driver, ContextInitError when a child fails."""
    timings: list[InitTiming] = []
    for _ in range(max(1, runs)):
        if timings and budget is not None and budget.remaining() < _expected_s(timings):
            break
        timings.append(run_child(ordinal, libcuda=libcuda, timeout_s=timeout_s, python=python))
    context = [round(t.context_ms, 3) for t in timings]
    cuinit = [round(t.cuinit_ms, 3) for t in timings]
    loads = [t.load_ms for t in timings if t.load_ms is not None]
    return measurement(
        "latency.context_init", statistics.median(context), "ms", subject,
        runs=context, summary=summary(context), gpu=ordinal, requested_runs=runs,
        cuinit_ms=statistics.median(cuinit), cuinit_runs=cuinit,
        libcuda_load_ms=round(statistics.median(loads), 3) if loads else None,
        measures=CONTEXT_INIT_WHAT,
    )


def _expected_s(timings: list[InitTiming]) -> float:
    """A generous guess at one more child: its context time plus a Python start."""
    return max(t.context_ms for t in timings) / 1e3 + 0.2


# --- kernel launch ---------------------------------------------------------------------------


def measure_kernel_launch(device: str, subject: str, budget: Budget | None = None) -> dict:
    if not device.startswith("cuda"):
        raise Skip("kernel launch latency needs a CUDA GPU")
    # The GPU current for the whole measurement: on cuda:1, launches outside this block would switch
    # the current device, and torch.cuda.synchronize(device) would enter a device context each time.
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream()
        x = torch.zeros(1, device=device)
        launches, rounds = LAUNCHES_PER_ROUND, LAUNCH_ROUNDS
        _queued_launch_seconds(x, stream, 200)  # warm-up: the add kernel loaded, the caches hot
        if budget is not None:  # a slow virtualised launch (50 us) must still fit
            one = _queued_launch_seconds(x, stream, 200) / 200
            launches = max(100, min(LAUNCHES_PER_ROUND, int(budget.remaining() * 0.3 / rounds / max(one, 1e-7))))
        per_launch_us = [_queued_launch_seconds(x, stream, launches) / launches * 1e6 for _ in range(rounds)]
        roundtrip_us = _roundtrip_us(x, stream, ROUNDTRIPS)
    dispatch_us = _queued_launch_seconds(torch.zeros(1), None, launches) / launches * 1e6
    return measurement(
        "latency.kernel_launch", statistics.median(per_launch_us), "us", subject,
        summary=summary(per_launch_us), launches_per_round=launches, rounds=rounds,
        sync_roundtrip_us=round(statistics.median(roundtrip_us), 3), sync_roundtrip_summary=summary(roundtrip_us),
        cpu_dispatch_us=round(dispatch_us, 3),
        measures="host time per launch of a 1-element add_ queued back to back (PyTorch dispatch included; "
                 "cpu_dispatch_us is the same call on a CPU tensor); sync_roundtrip_us: one launch plus a "
                 "synchronize of the current stream, wall clock; the GPU is the current device throughout",
    )


def _queued_launch_seconds(x: torch.Tensor, stream, launches: int) -> float:
    """Host time to queue `launches` tiny kernels; the final synchronize is outside the clock so the
    figure is the launch cost, not the GPU's execution. `stream`: the current CUDA stream (None for
    a CPU tensor)."""
    if stream is not None:
        stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(launches):
        x.add_(1)
    elapsed = time.perf_counter() - t0
    if stream is not None:
        stream.synchronize()
    return elapsed


def _roundtrip_us(x: torch.Tensor, stream, count: int) -> list[float]:
    """One launch and a synchronize of the stream it went to, each timed on the wall clock."""
    times = []
    stream.synchronize()
    for _ in range(count):
        t0 = time.perf_counter()
        x.add_(1)
        stream.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return times
