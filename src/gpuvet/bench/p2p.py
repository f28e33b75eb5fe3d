"""B8: GPU-to-GPU copy bandwidth, every ordered pair of the machine's GPUs.

A pair that copies slowly points at a missing NVLink, disabled peer access (ACS, IOMMU, a VM) or a
PCIe path through the CPU; a pair without peer access is staged through host memory by the
driver. Each copy moves one 256 MiB buffer (less when memory is short) with `dst.copy_(src)`, which
PyTorch issues as a copy-engine cudaMemcpyAsync on the source GPU's current stream (enabling peer
access first where the GPUs allow it); CUDA events on that stream time each copy and the median of
a few repeats is reported, in GB/s of 1e9 bytes.

Pairs are measured nearest-neighbour first (0->1, 1->2, ..., then 0->2 ...), so that when the
budget cannot hold them all every GPU has been a source and a destination before any is measured
twice; the pairs left out are listed.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from .common import BenchContext, Skip, free_memory_bytes, measurement, summary

MiB = 1024 * 1024
DEFAULT_BUFFER_BYTES = 256 * MiB
MIN_BUFFER_BYTES = 8 * MiB
DEFAULT_REPEATS = 5


def run(ctx: BenchContext) -> list[dict]:
    if not ctx.is_cuda:
        raise Skip("GPU-to-GPU copies need CUDA GPUs")
    gpus = _gpus(ctx.params.get("gpus"))
    if len(gpus) < 2:
        raise Skip(f"GPU-to-GPU copies need at least 2 GPUs; {len(gpus)} visible")
    nbytes = buffer_bytes(int(ctx.params.get("bytes", DEFAULT_BUFFER_BYTES)),
                          min(free_memory_bytes(f"cuda:{g}") for g in gpus))
    repeats = max(1, int(ctx.params.get("repeats", DEFAULT_REPEATS)))
    sources = {g: torch.ones(nbytes, dtype=torch.uint8, device=f"cuda:{g}") for g in gpus}
    targets = {g: torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{g}") for g in gpus}

    pairs = pairs_in_ring_order(gpus)
    measured: dict[tuple[int, int], dict] = {}
    slowest_pair_s = 0.0
    ctx.progress(f"p2p: {len(pairs)} GPU pairs")
    for src, dst in pairs:
        if measured and ctx.budget.remaining() < slowest_pair_s:
            break  # the first pair is always measured: a figure late beats none
        started = time.monotonic()
        measured[(src, dst)] = _measure_pair(src, dst, sources[src], targets[dst], repeats)
        slowest_pair_s = max(slowest_pair_s, time.monotonic() - started)
    left_out = [[s, d] for s, d in pairs if (s, d) not in measured]
    return list(measured.values()) + [_matrix_measurement(gpus, measured, left_out, nbytes)]


def _gpus(requested: list[int] | None) -> list[int]:
    count = torch.cuda.device_count()
    gpus = list(range(count)) if requested is None else [int(g) for g in requested]
    unknown = [g for g in gpus if not 0 <= g < count]
    if unknown:
        raise ValueError(f"no CUDA device with ordinal {unknown} ({count} visible)")
    return gpus


def buffer_bytes(requested: int, smallest_gpu_free: int) -> int:
    """As requested, but at most a quarter of the free memory of the fullest GPU (each GPU holds a
    source and a destination buffer), in whole MiB."""
    nbytes = min(requested, smallest_gpu_free // 4)
    nbytes -= nbytes % MiB
    if nbytes < MIN_BUFFER_BYTES:
        raise Skip(f"not enough free GPU memory for {MIN_BUFFER_BYTES // MiB} MiB copy buffers "
                   f"({smallest_gpu_free // MiB} MiB free on the fullest GPU)")
    return nbytes


def pairs_in_ring_order(gpus: list[int]) -> list[tuple[int, int]]:
    """Every ordered pair, by distance along the list: all (i, i+1) first, then (i, i+2), ..."""
    n = len(gpus)
    return [(gpus[i], gpus[(i + step) % n]) for step in range(1, n) for i in range(n)]


def _measure_pair(src: int, dst: int, source: torch.Tensor, target: torch.Tensor,
                  repeats: int) -> dict:
    peer = bool(torch.cuda.can_device_access_peer(src, dst))
    stream = torch.cuda.current_stream(src)  # PyTorch runs a cross-GPU copy on the source's stream
    target.zero_()  # so that the check below sees this pair's bytes, not an earlier pair's
    _time_copies(source, target, stream, 1)  # warm-up: enables peer access, first-use costs
    times = _time_copies(source, target, stream, repeats)
    check_ok = _arrived(target)
    rates = [source.numel() / t / 1e9 for t in times if t > 0]
    stats = summary(rates)
    return measurement("p2p.copy", stats.get("median"), "GB/s", f"gpu{src}", src=src, dst=dst,
                       peer_access=peer, bytes=source.numel(), repeats=len(times), summary=stats, check_ok=check_ok,
                       method="dst.copy_(src): cudaMemcpyAsync on the source GPU's stream, CUDA events")


def _arrived(target: torch.Tensor) -> bool:
    """The destination holds the source's bytes (all ones): a copy that corrupts data fails here."""
    return bool((target == 1).all().item())


def _time_copies(source: torch.Tensor, target: torch.Tensor, stream: torch.cuda.Stream, repeats: int) -> list[float]:
    """Each copy alone (waiting for it before the next), so that PyTorch's two-way stream barrier
    between the GPUs never holds a copy inside another copy's timing."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        target.copy_(source, non_blocking=True)
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    torch.cuda.synchronize(target.device)  # the destination's stream waits on the copy too
    return times


def _matrix_measurement(gpus: list[int], measured: dict[tuple[int, int], dict], left_out: list[list[int]],
                        nbytes: int) -> dict:
    """All pairs in one place: rows are sources, columns destinations, in the order of `gpus`."""
    def cell(src: int, dst: int, key: str) -> Any:
        m = measured.get((src, dst))
        if m is None:
            return None
        return m["value"] if key == "value" else m["details"][key]

    rates = [m["value"] for m in measured.values() if m["value"] is not None]
    slowest = min(measured.values(), key=lambda m: m["value"] if m["value"] is not None else float("inf"))
    return measurement(
        "p2p.matrix", statistics.median(rates) if rates else None, "GB/s", "machine",
        gpus=gpus, bytes=nbytes,
        matrix_gbps=[[cell(s, d, "value") for d in gpus] for s in gpus],
        peer_access=[[cell(s, d, "peer_access") for d in gpus] for s in gpus],
        pairs_measured=len(measured), left_out=left_out,
        slowest_pair={"src": slowest["details"]["src"], "dst": slowest["details"]["dst"], "gbps": slowest["value"]},
        wrong_copies=[[s, d] for (s, d), m in measured.items() if not m["details"]["check_ok"]],
        layout="rows: source GPU, columns: destination GPU, in the order of `gpus`; None: same GPU or not measured",
    )
