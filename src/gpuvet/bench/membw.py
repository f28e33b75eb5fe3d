"""B2: memory bandwidth by device-to-device copy.

`dst.copy_(src)` of a large buffer (1 GiB on a GPU, far beyond any cache; 256 MiB on the CPU),
warmed up, then timed call by call (CUDA events on a GPU, a synchronised wall clock on the CPU)
for as many calls as the budget holds. Each copy reads the buffer once and writes it once, and
both are counted (2 x buffer bytes per copy), as spec sheets count memory bandwidth. The value is
the median per-copy rate in GB/s (1e9 bytes). On the CPU device it measures host RAM.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from .common import (BenchContext, OutOfTime, Skip, calibrate_repeats, device_details, free_memory_bytes, measurement, summary,
                     synchronize, time_each)

CUDA_BUFFER_BYTES = 2**30
CPU_BUFFER_BYTES = 256 * 2**20
MIN_BUFFER_BYTES = 2**20
BYTES_COUNTED = "read + write (2 x buffer per copy)"
WARM_UP_COPIES = 2
MAX_COPIES = 1000
BUDGET_FRACTION = 0.8  # of what is left after the warm-up: the timed copies


def buffer_bytes(device: str, requested: int | None = None) -> int:
    """Size of each of the two buffers: source and destination together stay within a quarter of
    free memory. params["buffer_bytes"] may ask for less (tests)."""
    wanted = requested or (CUDA_BUFFER_BYTES if device.startswith("cuda") else CPU_BUFFER_BYTES)
    size = min(wanted, free_memory_bytes(device) // 8)
    return size // 4096 * 4096  # whole pages


def run(ctx: BenchContext) -> list[dict]:
    if ctx.budget.expired():
        raise OutOfTime("no time left to measure the memory bandwidth")
    size = buffer_bytes(ctx.device, ctx.params.get("buffer_bytes"))
    if size < MIN_BUFFER_BYTES:
        raise Skip(f"not enough free memory on {ctx.device} for two copy buffers ({size} bytes each)")
    # No torch.cuda.empty_cache() here: it frees the cached blocks of every GPU, and the other
    # GPUs' jobs run side by side in other threads, so their timed copies would wait on cudaFree.
    # The worker empties the caches once every job of the group is done (worker._release_cached_memory).
    with torch.cuda.device(ctx.device) if ctx.is_cuda else nullcontext():
        times = time_copies(ctx, size)
    rates = [2 * size / t / 1e9 for t in times if t > 0]
    if not rates:
        raise OutOfTime("no copy could be timed")
    stats = summary(rates)
    return [measurement(
        "membw.copy", stats["median"], "GB/s", ctx.subject,
        buffer_bytes=size,
        bytes_per_copy=2 * size,
        bytes_counted=BYTES_COUNTED,
        iterations=len(rates),
        summary=stats,
        memory="host RAM (CPU device)" if not ctx.is_cuda else "GPU memory",
        method="dst.copy_(src), uint8 buffers; value = median of the per-copy rates",
        timing="CUDA events around each copy" if ctx.is_cuda else "wall clock around each copy (synchronised)",
        **device_details(ctx.device),
    )]


def time_copies(ctx: BenchContext, size: int) -> list[float]:
    """Seconds taken by each timed copy of `size` bytes."""
    # Filled, so that every page of the source is really there (the OS maps CPU pages on first touch).
    src = torch.ones(size, dtype=torch.uint8, device=ctx.device)
    dst = torch.empty_like(src)

    def copy() -> Any:
        return dst.copy_(src)

    for _ in range(WARM_UP_COPIES):  # also touches every page of the destination
        copy()
    synchronize(ctx.device)
    repeats = calibrate_repeats(ctx.device, copy, ctx.budget.remaining() * BUDGET_FRACTION, at_most=MAX_COPIES)
    times = time_each(ctx.device, copy, repeats)
    return times
