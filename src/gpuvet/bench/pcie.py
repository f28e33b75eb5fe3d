"""B3: host<->device copy bandwidth of one GPU, pinned and pageable.

A narrow, downshifted or virtualised PCIe link shows here first: an H200 on Gen5 x16 moves about
55 GB/s each way with pinned memory (nvbandwidth's figure; the link carries 63). Copies use one
256 MiB buffer (less when memory is short), the median of repeats is reported, and GB are 1e9
bytes, as nvbandwidth counts them.

- pinned: `non_blocking` copies queued on a side stream, each timed with CUDA events (the copy
  engine's own time, as nvbandwidth's CE copies).
- pageable: the driver stages through its own pinned buffer on the calling thread, so the figure
  is what a plain `tensor.to("cuda")` costs: a blocking copy timed by the wall clock.

The orchestrator reads the link's generation and width with NVML while the copies run (an idle
link downshifts and must not be judged). `LOAD_PHASE` is announced through `ctx.progress` just
before the pinned host-to-device copies start, and they then keep the link busy for at least
`load_window_s(params)` seconds.

When `params["cpu_affinity"]` lists the CPUs of the GPU's NUMA node, the calling thread is bound to
them before the host buffers are allocated and touched, so that the kernel's first-touch policy
places the buffers on that node; the previous affinity is restored afterwards. Only the calling
thread is bound, because the worker runs other jobs in other threads of the same process.
"""

from __future__ import annotations

import ctypes
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from .common import BenchContext, Skip, free_memory_bytes, measurement, summary

MiB = 1024 * 1024
DEFAULT_BUFFER_BYTES = 256 * MiB
MIN_BUFFER_BYTES = 8 * MiB
DEFAULT_MIN_LOAD_S = 1.0
LOAD_PHASE = "pcie.h2d_pinned"
PHASE_CAP_S = 0.5  # per phase beyond the load window: enough for a stable median
MIN_REPEATS = 3
MAX_REPEATS = 5000  # a cap for small buffers on fast links (256 MiB on Gen5: ~200 per second)
MAX_PAGEABLE_REPEATS = 100


def load_window_s(params: dict[str, Any]) -> float:
    """Seconds the pinned host-to-device copies keep the link busy after `LOAD_PHASE` is announced
    (less only when the benchmark's budget runs out first)."""
    return float(params.get("min_load_s", DEFAULT_MIN_LOAD_S))


def run(ctx: BenchContext) -> list[dict]:
    if not ctx.is_cuda:
        raise Skip("host<->device copies need a CUDA GPU")
    nbytes = buffer_bytes(
        requested=int(ctx.params.get("bytes", DEFAULT_BUFFER_BYTES)),
        gpu_free=free_memory_bytes(ctx.device),
        host_available=free_memory_bytes("cpu"),
    )
    with bound_to_cpus(ctx.params.get("cpu_affinity")) as numa:
        try:
            return _measure(ctx, nbytes, numa)
        finally:
            # Pinned blocks stay cached in PyTorch's host allocator; the next GPU's run must get
            # fresh pages on its own NUMA node, not these.
            _release_cached_pinned_memory()


def buffer_bytes(requested: int, gpu_free: int, host_available: int) -> int:
    """The copy size: as requested, but at most a quarter of the free GPU memory and an eighth of
    the available host memory (two host buffers), in whole MiB."""
    nbytes = min(requested, gpu_free // 4, host_available // 8)
    nbytes -= nbytes % MiB
    if nbytes < MIN_BUFFER_BYTES:
        raise Skip(f"not enough free memory for a {MIN_BUFFER_BYTES // MiB} MiB copy buffer "
                   f"({gpu_free // MiB} MiB free on the GPU, {host_available // MiB} MiB available on the host)")
    return nbytes


@contextmanager
def bound_to_cpus(cpus: list[int] | None) -> Iterator[dict[str, Any]]:
    """Bind the calling thread to `cpus` while the block runs; yields what to record in details."""
    if not cpus:
        yield {"numa_bound": False, "numa_note": "no CPU list for this GPU's NUMA node"}
        return
    if not hasattr(os, "sched_setaffinity"):
        yield {"numa_bound": False, "numa_note": "CPU affinity is not supported on this OS"}
        return
    previous = os.sched_getaffinity(0)  # pid 0: the calling thread
    try:
        os.sched_setaffinity(0, [int(c) for c in cpus])
    except OSError as err:  # CPUs outside this container's cpuset, or offline
        yield {"numa_bound": False, "numa_note": f"could not bind to CPUs {list(cpus)}: {err}"}
        return
    try:
        yield {"numa_bound": True, "cpu_affinity": sorted(cpus)}
    finally:
        os.sched_setaffinity(0, previous)


@dataclass
class _Phase:
    name: str
    copy: Callable[[], Any]
    pinned: bool


def _measure(ctx: BenchContext, nbytes: int, numa: dict[str, Any]) -> list[dict]:
    device = torch.device(ctx.device)
    with torch.cuda.device(device):
        stream = torch.cuda.Stream(device)
        gpu_buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        pageable = _touched(torch.empty(nbytes, dtype=torch.uint8))
        pinned, pinned_error = _pinned_buffer(nbytes)
        phases = [
            _Phase("pcie.h2d_pageable", lambda: gpu_buffer.copy_(pageable), pinned=False),
            _Phase("pcie.d2h_pageable", lambda: pageable.copy_(gpu_buffer), pinned=False),
        ]
        if pinned is not None:
            phases[:0] = [
                _Phase("pcie.h2d_pinned", lambda: gpu_buffer.copy_(pinned, non_blocking=True), pinned=True),
                _Phase("pcie.d2h_pinned", lambda: pinned.copy_(gpu_buffer, non_blocking=True), pinned=True),
            ]
        results = []
        with torch.cuda.stream(stream):
            for left, phase in zip(range(len(phases), 0, -1), phases):
                if ctx.budget.expired():
                    results.append(measurement(phase.name, None, "GB/s", ctx.subject, bytes=nbytes,
                                               reason="the time budget ran out before this copy", **numa))
                    continue
                results.append(_run_phase(ctx, phase, stream, nbytes, left, numa))
        if pinned is None:
            for name in ("pcie.h2d_pinned", "pcie.d2h_pinned"):
                results.append(measurement(name, None, "GB/s", ctx.subject, bytes=nbytes,
                                           reason=f"pinned host memory could not be allocated: {pinned_error}", **numa))
        return results


def _run_phase(ctx: BenchContext, phase: _Phase, stream: torch.cuda.Stream, nbytes: int,
               phases_left: int, numa: dict[str, Any]) -> dict:
    timer = _time_on_stream if phase.pinned else _time_blocking
    timer(stream, phase.copy, 1)  # warm-up: first use of the buffers and of this copy path
    (one,) = timer(stream, phase.copy, 1)
    seconds = min(PHASE_CAP_S, ctx.budget.remaining() / phases_left)
    is_load_phase = phase.name == LOAD_PHASE
    if is_load_phase:
        seconds = min(max(seconds, load_window_s(ctx.params)), max(ctx.budget.remaining(), 0.0))
        ctx.progress(LOAD_PHASE)
    at_most = MAX_REPEATS if phase.pinned else MAX_PAGEABLE_REPEATS
    started = time.perf_counter()
    times = timer(stream, phase.copy, repeats_for(seconds, one, at_most))
    # Steady copies can beat the calibration copy: top up until the load window is really held.
    while is_load_phase and len(times) < at_most and not ctx.budget.expired():
        short = seconds - (time.perf_counter() - started)
        if short <= 0:
            break
        times += timer(stream, phase.copy, min(at_most - len(times), repeats_for(short, one, at_most)))
    extra = {"load_s": round(time.perf_counter() - started, 3)} if is_load_phase else {}
    rates = [nbytes / t / 1e9 for t in times if t > 0]
    stats = summary(rates)
    return measurement(
        phase.name, stats.get("median"), "GB/s", ctx.subject,
        bytes=nbytes, iterations=len(times), summary=stats,
        timing="CUDA events on a side stream" if phase.pinned else "wall clock around a blocking copy",
        **numa, **extra,
    )


def repeats_for(seconds: float, one_copy_s: float, at_most: int) -> int:
    """How many copies of `one_copy_s` fill `seconds`, at least MIN_REPEATS for a median."""
    if one_copy_s <= 0:
        return at_most
    return max(MIN_REPEATS, min(at_most, math.ceil(seconds / one_copy_s)))


def _time_on_stream(stream: torch.cuda.Stream, copy: Callable[[], Any], repeats: int) -> list[float]:
    """Queue all copies with an event pair each, then wait once: the link never idles between them."""
    pairs = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        copy()
        end.record(stream)
        pairs.append((start, end))
    stream.synchronize()
    return [start.elapsed_time(end) / 1000.0 for start, end in pairs]


def _time_blocking(stream: torch.cuda.Stream, copy: Callable[[], Any], repeats: int) -> list[float]:
    times = []
    stream.synchronize()
    for _ in range(repeats):
        t0 = time.perf_counter()
        copy()  # blocking: PyTorch synchronises the stream before returning
        times.append(time.perf_counter() - t0)
    return times


def _touched(host: torch.Tensor) -> torch.Tensor:
    """Write every page from this thread (not PyTorch's thread pool, which is not bound), so the
    kernel places the pages on this thread's NUMA node."""
    ctypes.memset(host.data_ptr(), 1, host.numel() * host.element_size())
    return host


def _pinned_buffer(nbytes: int) -> tuple[torch.Tensor | None, str | None]:
    _release_cached_pinned_memory()  # a cached block could sit on another GPU's node
    try:
        return _touched(torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)), None
    except RuntimeError as err:  # containers can cap locked memory
        return None, str(err).splitlines()[0]


def _release_cached_pinned_memory() -> None:
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None)  # torch >= 2.9
    if empty is None:
        empty = getattr(torch._C, "_host_emptyCache", None)  # older releases
    if empty is not None:
        try:
            empty()
        except RuntimeError:
            pass
