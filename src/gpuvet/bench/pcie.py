"""B3: host<->device copy bandwidth of one GPU, pinned and pageable.

A narrow, downshifted or virtualised PCIe link shows here first: an H200 on Gen5 x16 moves about
55 GB/s each way with pinned memory (nvbandwidth's figure; the link carries 63). Copies use one
256 MiB buffer (less when memory is short), the median of repeats is reported, and GB are 1e9
bytes, as nvbandwidth counts them.

- pinned: `non_blocking` copies queued on a side stream, each timed with CUDA events (the copy
  engine's own time, as nvbandwidth's CE copies).
- bidirectional: half the pinned buffer each way at once, on two streams (GB/s of both together).
- together (`params["together"]`): the pinned copies while every GPU's job copies at once, named
  `pcie.h2d_pinned_together` / `pcie.d2h_pinned_together`: GPUs that share a switch's uplink to
  the host look fine one at a time and starve a data loader feeding them all.
- pageable: the driver stages through its own pinned buffer on the calling thread, so the figure
  is what a plain `tensor.to("cuda")` costs: a blocking copy timed by the wall clock.

The orchestrator reads the link's generation and width with NVML while the job runs (an idle link
downshifts and must not be judged). `LOAD_PHASE` is announced through `ctx.progress` just before
the pinned host-to-device copies start; they then keep the link busy for at least
`load_window_s(params)` seconds, and that measurement's details give the phase's span on the
host's clock as `load_window: [start, end]` (epoch seconds, time.time()), so the parent can keep
only the link readings taken under load.

When `params["cpu_affinity"]` lists the CPUs of the GPU's NUMA node, the calling thread is bound to
them for the whole job, and the previous affinity is restored afterwards. Only the calling thread is
bound, because the worker runs other jobs in other threads of the same process. Bound, the thread
makes the job's first CUDA call (creating the context when `gpuvet bench pcie` runs alone) and gets
its host buffers: fresh pages it writes first, which the kernel's first-touch policy places on its
node; the pinned one is then locked where it lies with cudaHostRegister (see `pinned_host_buffer`).
Pinning does not move pages, and writing to pages already pinned would not either: placement is
decided when the pages are first touched. The time budget counts the copies only: it starts once
the context and the buffers are ready.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from .common import BenchContext, Budget, Skip, free_memory_bytes, measurement, summary

MiB = 1024 * 1024
DEFAULT_BUFFER_BYTES = 256 * MiB
MIN_BUFFER_BYTES = 8 * MiB
DEFAULT_MIN_LOAD_S = 1.0
LOAD_PHASE = "pcie.h2d_pinned"
BIDIRECTIONAL = "pcie.bidir_pinned"
TOGETHER = "_together"  # params["together"]: every GPU copying at once (the orchestrator starts them side by side)
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
    copies_s = ctx.budget.remaining()
    setup_started = time.perf_counter()
    with bound_to_cpus(ctx.params.get("cpu_affinity"), ctx.params.get("cpu_affinity_source")) as numa:
        # The job's first CUDA call, made from the bound thread: when `gpuvet bench pcie` runs alone
        # it creates the GPU's context here, so the driver's own threads and buffers start near it.
        gpu_free = free_memory_bytes(ctx.device)
        nbytes = buffer_bytes(
            requested=int(ctx.params.get("bytes", DEFAULT_BUFFER_BYTES)),
            gpu_free=gpu_free,
            host_available=free_memory_bytes("cpu"),
        )
        try:
            return _measure(ctx, nbytes, numa, copies_s, setup_started)
        finally:
            # When the pinned buffer came from PyTorch's allocator (no cudaHostRegister), it went
            # back to PyTorch's cache as _measure returned: the next GPU's run must not get it.
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
def bound_to_cpus(cpus: list[int] | None, source: str | None = None) -> Iterator[dict[str, Any]]:
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
        yield {"numa_bound": True, "cpu_affinity": sorted(cpus), **({"cpu_affinity_source": source} if source else {})}
    finally:
        os.sched_setaffinity(0, previous)


@dataclass
class _Phase:
    name: str
    copy: Callable[[], Any]
    pinned: bool


@dataclass
class PinnedBuffer:
    """The pinned host buffer, or why there is none; `numa` overrides the binding's details for the
    pinned copies when the buffer's placement cannot be vouched for."""

    tensor: Any  # torch.Tensor | None
    via: str | None = None  # how it was pinned, for the details
    error: str | None = None
    numa: dict[str, Any] = field(default_factory=dict)


def _measure(ctx: BenchContext, nbytes: int, numa: dict[str, Any], copies_s: float, setup_started: float) -> list[dict]:
    device = torch.device(ctx.device)
    with torch.cuda.device(device), pinned_host_buffer(nbytes, numa) as pinned:
        stream = torch.cuda.Stream(device)
        gpu_buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        pageable = fresh_host_buffer(nbytes)
        pinned_details = {**numa, **pinned.numa, "pinned_via": pinned.via}
        host = pinned.tensor
        phases = [
            _Phase("pcie.h2d_pageable", lambda: gpu_buffer.copy_(pageable), pinned=False),
            _Phase("pcie.d2h_pageable", lambda: pageable.copy_(gpu_buffer), pinned=False),
        ]
        if host is not None:
            phases[:0] = [
                _Phase("pcie.h2d_pinned", lambda: gpu_buffer.copy_(host, non_blocking=True), pinned=True),
                _Phase("pcie.d2h_pinned", lambda: host.copy_(gpu_buffer, non_blocking=True), pinned=True),
                _Phase(BIDIRECTIONAL, both_ways(stream, torch.cuda.Stream(device), host, gpu_buffer), pinned=True),
            ]
        if ctx.params.get("together"):  # every GPU's job copies at once: the pinned directions only
            phases = [_Phase(p.name + TOGETHER, p.copy, p.pinned) for p in phases[:2] if p.pinned]
        # The budget is for the copies: it starts once the context and the buffers are ready, so a
        # first context (up to a second under vGPU) does not cut the load window short.
        budget = Budget(max(copies_s, 0.0))
        setup_s = round(time.perf_counter() - setup_started, 3)
        results = []
        with torch.cuda.stream(stream):
            for left, phase in zip(range(len(phases), 0, -1), phases):
                details = pinned_details if phase.pinned else numa
                if budget.expired():
                    results.append(measurement(phase.name, None, "GB/s", ctx.subject, bytes=nbytes,
                                               reason="the time budget ran out before this copy", **details))
                    continue
                results.append(_run_phase(ctx, budget, phase, stream, nbytes, left, details, setup_s))
        if host is None and not ctx.params.get("together"):
            for name in ("pcie.h2d_pinned", "pcie.d2h_pinned", BIDIRECTIONAL):
                results.append(measurement(name, None, "GB/s", ctx.subject, bytes=nbytes,
                                           reason=f"pinned host memory could not be allocated: {pinned.error}",
                                           **pinned_details))
        return results


def both_ways(stream: Any, other: Any, host: torch.Tensor, gpu_buffer: torch.Tensor) -> Callable[[], None]:
    """Half the buffer up and the other half down at once, on two streams, the whole of it timed by
    the events on `stream` (nvbandwidth's bidirectional copies): a link or host that cannot carry
    both directions together (a shared switch uplink, a weak root complex) shows here only."""
    half = host.numel() // 2

    def copy() -> None:
        other.wait_stream(stream)  # starts after the start event
        gpu_buffer[:half].copy_(host[:half], non_blocking=True)
        with torch.cuda.stream(other):
            host[half:].copy_(gpu_buffer[half:], non_blocking=True)
        stream.wait_stream(other)  # the end event waits for both
    return copy


def _run_phase(ctx: BenchContext, budget: Budget, phase: _Phase, stream: torch.cuda.Stream, nbytes: int,
               phases_left: int, details: dict[str, Any], setup_s: float) -> dict:
    timer = _time_on_stream if phase.pinned else _time_blocking
    timer(stream, phase.copy, 1)  # warm-up: first use of the buffers and of this copy path
    (one,) = timer(stream, phase.copy, 1)
    seconds = min(PHASE_CAP_S, budget.remaining() / phases_left)
    is_load_phase = phase.name == LOAD_PHASE
    if is_load_phase:
        seconds = min(max(seconds, load_window_s(ctx.params)), max(budget.remaining(), 0.0))
        ctx.progress(LOAD_PHASE)
    at_most = MAX_REPEATS if phase.pinned else MAX_PAGEABLE_REPEATS
    window_start = time.time()  # the host's clock, as the parent's link samples are stamped
    started = time.perf_counter()
    # A batch sized from one calibration copy can take many times longer when the copies get
    # slower (a contended host CPU for the pageable copies): it stops being queued at the phase's
    # end, so a slow phase never eats the next phases' budget.
    phase_end = started + seconds
    times = timer(stream, phase.copy, repeats_for(seconds, one, at_most), phase_end)
    # Steady copies can beat the calibration copy: top up until the load window is really held.
    while is_load_phase and len(times) < at_most and not budget.expired():
        short = seconds - (time.perf_counter() - started)
        if short <= 0:
            break
        times += timer(stream, phase.copy, min(at_most - len(times), repeats_for(short, one, at_most)), phase_end)
    extra = {}
    if is_load_phase:  # every copy queued in the window has finished: the timer synchronised
        extra = {"load_s": round(time.perf_counter() - started, 3),
                 "load_window": load_window(window_start, time.time()), "setup_s": setup_s}
    if phase.name == BIDIRECTIONAL:
        extra["how"] = "half the buffer host-to-device and half device-to-host at once; value = both directions' bytes / time"
    rates = [nbytes / t / 1e9 for t in times if t > 0]
    stats = summary(rates)
    return measurement(
        phase.name, stats.get("median"), "GB/s", ctx.subject,
        bytes=nbytes, iterations=len(times), summary=stats,
        timing="CUDA events on a side stream" if phase.pinned else "wall clock around a blocking copy",
        **details, **extra,
    )


def load_window(start: float, end: float) -> list[float]:
    """The load phase as `[start, end]` in epoch seconds (time.time()), to the millisecond: the
    parent keeps the link readings it took inside it."""
    return [round(start, 3), round(end, 3)]


def repeats_for(seconds: float, one_copy_s: float, at_most: int) -> int:
    """How many copies of `one_copy_s` fill `seconds`, at least MIN_REPEATS for a median."""
    if one_copy_s <= 0:
        return at_most
    return max(MIN_REPEATS, min(at_most, math.ceil(seconds / one_copy_s)))


def _time_on_stream(stream: torch.cuda.Stream, copy: Callable[[], Any], repeats: int,
                    until: float = math.inf) -> list[float]:
    """Queue all copies with an event pair each, then wait once: the link never idles between them.
    Queuing stops at `until` (perf_counter), after at least MIN_REPEATS copies, if not done by then."""
    pairs = []
    for done in range(repeats):
        if done >= MIN_REPEATS and time.perf_counter() >= until:
            break
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        copy()
        end.record(stream)
        pairs.append((start, end))
    stream.synchronize()
    return [start.elapsed_time(end) / 1000.0 for start, end in pairs]


def _time_blocking(stream: torch.cuda.Stream, copy: Callable[[], Any], repeats: int,
                   until: float = math.inf) -> list[float]:
    times = []
    stream.synchronize()
    for done in range(repeats):
        if done >= MIN_REPEATS and time.perf_counter() >= until:
            break
        t0 = time.perf_counter()
        copy()  # blocking: PyTorch synchronises the stream before returning
        times.append(time.perf_counter() - t0)
    return times


# --- host buffers ----------------------------------------------------------------------------

# Buffers whose pages the driver may still hold locked (unregistering failed): never unmapped, so
# the process cannot reuse pages a DMA engine might still reach.
_KEPT: list[Any] = []


def fresh_host_buffer(nbytes: int) -> torch.Tensor:
    """`nbytes` of pageable host memory in pages no one has touched (a private anonymous mapping,
    not the heap, which can hand back pages another thread placed), each then written from the
    calling thread so that the kernel's first-touch policy puts them on its NUMA node. The pages
    are written by this thread, not PyTorch's thread pool, which is not bound."""
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_DONTFORK"):  # a child forked meanwhile must not share pages the GPU reads
        mapping.madvise(mmap.MADV_DONTFORK)
    host = torch.frombuffer(mapping, dtype=torch.uint8)  # keeps the mapping alive
    ctypes.memset(host.data_ptr(), 1, nbytes)
    return host


@contextmanager
def pinned_host_buffer(nbytes: int, numa: dict[str, Any]) -> Iterator[PinnedBuffer]:
    """A pinned buffer on the bound thread's NUMA node, for the block's duration. Call it with the
    GPU as the current device.

    Preferred: fresh pages touched by this thread, then locked in place with cudaHostRegister, which
    pins the pages where they are and keeps PyTorch's pinned-memory cache out of it: that cache
    would hand the next GPU's run this GPU's buffer, on this GPU's node, and torch 2.0-2.4 has no
    call to empty it. Otherwise PyTorch's allocator (cudaHostAlloc, which places the pages from the
    calling thread), after emptying its cache where this torch can; where it cannot, the pinned
    copies say `numa_bound: False` and why. That buffer returns to PyTorch's cache when the caller
    drops it: the caller empties the cache then."""
    cudart = _cudart()
    why = "this PyTorch does not expose cudaHostRegister"
    if cudart is not None:
        host = fresh_host_buffer(nbytes)
        code = _call(cudart.cudaHostRegister, host.data_ptr(), nbytes, 0)  # 0: cudaHostRegisterDefault
        if code == 0:
            try:
                yield PinnedBuffer(host, via="cudaHostRegister")
            finally:
                _unregister(cudart, host)
            return
        why = f"cudaHostRegister failed ({_error_name(cudart, code)})"
        _clear_last_error()
        del host
    emptied = _release_cached_pinned_memory()
    yield _allocated_pinned(nbytes, numa, why, emptied)  # the caller empties the cache once it lets go


def _allocated_pinned(nbytes: int, numa: dict[str, Any], why: str, emptied: bool) -> PinnedBuffer:
    via = f"PyTorch's pinned allocator ({why})"
    try:
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    except RuntimeError as err:  # containers can cap locked memory
        return PinnedBuffer(None, via=via, error=str(err).splitlines()[0])
    if numa.get("numa_bound") and not emptied:
        return PinnedBuffer(host, via=via, numa={
            "numa_bound": False,
            "numa_note": "this PyTorch cannot empty its pinned-memory cache, so the buffer may be one an "
                         "earlier GPU's run left there, on that GPU's NUMA node"})
    return PinnedBuffer(host, via=via)


def _cudart() -> Any:
    """PyTorch's CUDA runtime bindings, when they can register host memory."""
    get = getattr(torch.cuda, "cudart", None)
    if get is None:
        return None
    try:
        cudart = get()
    except Exception:  # noqa: BLE001 - no runtime bindings in this build
        return None
    if hasattr(cudart, "cudaHostRegister") and hasattr(cudart, "cudaHostUnregister"):
        return cudart
    return None


def _call(fn: Callable[..., Any], *args: Any) -> int:
    """A cudart binding's result as an int (the bindings return a cudaError enum)."""
    return int(fn(*args))


def _error_name(cudart: Any, code: int) -> str:
    try:
        return f"{cudart.cudaGetErrorString(cudart.cudaError(code))}, error {code}"
    except Exception:  # noqa: BLE001 - the enum names only cudaSuccess
        return f"cudaError {code}"


def _unregister(cudart: Any, host: torch.Tensor) -> None:
    try:
        torch.cuda.synchronize()  # no copy may still be reading or writing the pages
        code = _call(cudart.cudaHostUnregister, host.data_ptr())
    except RuntimeError:
        code = -1
    if code != 0:
        _KEPT.append(host)
        _clear_last_error()


def _clear_last_error() -> None:
    """A failed cudart call stays the thread's "last error", and PyTorch's check after its next
    kernel launch would raise it as that kernel's failure. Launching one tiny kernel reads it, and
    reading it clears it."""
    for _ in range(2):
        try:
            torch.ones(1, device=torch.cuda.current_device())
            return
        except RuntimeError:
            continue


def _release_cached_pinned_memory() -> bool:
    """Empty PyTorch's cache of pinned host blocks; False where this torch has no call for it."""
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None)  # torch >= 2.9
    if empty is None:
        empty = getattr(torch._C, "_host_emptyCache", None)  # some older releases; 2.0-2.4 have neither
    if empty is None:
        return False
    try:
        empty()
    except RuntimeError:
        return False
    return True
