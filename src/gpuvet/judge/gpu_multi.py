"""gpu.p2p and gpu.allreduce: how fast the GPUs of one machine talk to each other, against what
their links (NVLink count and generation from the topology, or PCIe) can carry."""

from __future__ import annotations

import re

from ..catalog import checked
from ..facts import Gpu, Machine
from ..record import MEASURED, Finding, Measurement, has_value
from .bench_common import measured, not_measured, one, planned, worst
from .common import FAIL, PASS, WARN, Context, finding
from .gpu_links import GBS_PER_LANE, nvlinks_per_gpu

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
GPU_ALLREDUCE = checked("gpu.allreduce")
GPU_P2P = checked("gpu.p2p")

# Copies and all-reduce staged through host memory (no peer access): shares of half the PCIe line
# rate. A healthy 8x RTX 4090 box gives ~9 GB/s all-reduce busbw on Gen4 x16 (57% of 15.75).
STAGED_WARN, STAGED_FAIL = 0.35, 0.20
# Per link and direction: NVLink 2.0-4.0 carry ~25 GB/s, NVLink 5 ~50 GB/s.
_NVLINK_GBS = {2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}


def _gpu(machine: Machine, index: int) -> Gpu | None:
    return next((g for g in machine.gpus if g.index == index), None)


def _per_link_gbs(ctx: Context, gpu: Gpu | None) -> float:
    ref = ctx.ref(gpu) if gpu else None
    gen = ref.number("nvlink_gen") if ref else None
    return _NVLINK_GBS.get(int(gen), 25.0) if gen else 25.0


def _pcie_gbs(gpu: Gpu | None) -> float | None:
    for r in (gpu.pcie.readings if gpu else []):
        gen = r.current_gen if r.under_load else r.max_gen
        width = r.current_width if r.under_load else r.max_width
        if gen in GBS_PER_LANE and width:
            return GBS_PER_LANE[gen] * width
    return None


def without_p2p(ctx: Context) -> str | None:
    """The model name when the GPUs are a product with no peer access at all (RTX 4090, 5090):
    their copies and all-reduce go through host memory by design, not because a provider turned
    something off."""
    refs = [ctx.ref(g) for g in ctx.machine.gpus]
    lacking = [r for r in refs if r is not None and r.peer_to_peer is False]
    return lacking[0].name if lacking else None


NO_P2P_SOURCE = ("GeForce Ada and Blackwell cards have no P2P with NVIDIA's driver (NVIDIA/nccl#1127, "
                 "tinygrad/open-gpu-kernel-modules#28 and #29); a host-staged copy crosses PCIe twice")


def _pair_expectation(ctx: Context, src: int, dst: int, staged: bool = False) -> tuple[float | None, str]:
    """What a copy from GPU src to GPU dst should reach, and over what. A copy staged through host
    memory (no peer access) crosses the PCIe links twice: half their line rate."""
    topo = ctx.machine.topology
    code = topo.links.get(f"GPU{src}", {}).get(f"GPU{dst}", "") if topo else ""
    m = re.fullmatch(r"NV(\d+)", code)
    gpu = _gpu(ctx.machine, src)
    if m and not staged:
        return int(m.group(1)) * _per_link_gbs(ctx, gpu), f"{code} (NVLink)"
    pcie = _pcie_gbs(gpu)
    if pcie and staged:
        return pcie / 2, f"PCIe through host memory ({code or 'topology unknown'})"
    return (pcie, f"PCIe ({code or 'topology unknown'})") if pcie else (None, code or "unknown link")


def check_p2p(ctx: Context) -> list[Finding]:
    if not planned(ctx, "p2p"):
        return []
    pairs = [m for m in measured(ctx, "p2p.copy") if has_value(m)]
    if not pairs:
        return [not_measured(ctx, "p2p", GPU_P2P, "machine")]
    product = without_p2p(ctx)
    slow, no_peer, rows = [], [], []
    for m in pairs:
        src, dst = int(m.details.get("src", -1)), int(m.details.get("dst", -1))
        staged = m.details.get("peer_access") is False
        expected, over = _pair_expectation(ctx, src, dst, staged=staged and product is not None)
        share = m.value / expected if expected else None
        rows.append(f"gpu{src}->gpu{dst} {m.value:.0f} GB/s" + (f" ({100 * share:.0f}% of ~{expected:.0f} over {over})" if share else ""))
        if staged:
            no_peer.append(f"gpu{src}->gpu{dst}")
        # Host-staged copies vary with the host's memory and its root complex (a healthy 2x RTX 4090
        # pair: 6.3 GB/s, tinygrad/open-gpu-kernel-modules#44): judged as loosely as the all-reduce.
        warn_below, fail_below = (STAGED_WARN, STAGED_FAIL) if staged and product else (0.6, 0.3)
        if share is not None and share < warn_below:
            slow.append((share < fail_below, share,
                         f"gpu{src}->gpu{dst} {m.value:.0f} GB/s = {100 * share:.0f}% of ~{expected:.0f} GB/s over {over}"))
    slow.sort(key=lambda pair: pair[1])
    values = sorted(m.value for m in pairs)
    median = values[len(values) // 2]
    measured_text = "; ".join(rows[:12]) + (f"; ... {len(rows) - 12} more pairs" if len(rows) > 12 else "")
    remedy = "compare `nvidia-smi topo -m` and `nvidia-smi topo -p2p r`; ask the provider whether P2P is disabled (ACS, IOMMU, VM)"
    source = "NVLink ~25 GB/s per link and direction (NVLink 5: 50); PCIe line rate"
    if product:  # no peer access is the product's limit: nothing a provider can switch on
        remedy = ("host-staged copies are bound by each GPU's PCIe link and the host's memory: compare gpu.pcie_bandwidth "
                  "and `nvidia-smi topo -m` (GPUs behind one switch or CPU share its uplink)")
        source += f"; {NO_P2P_SOURCE}"
    broken = _broken_pairs(ctx)
    if broken:  # a copy that hung after good pairs: the measured ones do not clear the machine
        status, words = broken
        return [finding(GPU_P2P, "machine", status, words, measured=measured_text,
                        expected="every pair copies and finishes", remedy=f"`sudo dmesg | grep -i xid`; {remedy}")]
    if slow:
        status = FAIL if any(failed for failed, _, _ in slow) else WARN
        bar = (f">= {100 * STAGED_WARN:.0f}% of half the PCIe line rate (host-staged)" if product
               else ">= 60% of what the link between each pair carries")
        return [finding(GPU_P2P, "machine", status, f"{len(slow)} of {len(pairs)} GPU pairs copy slowly; slowest: {slow[0][2]}",
                        measured=measured_text, expected=bar, source=source, remedy=remedy)]
    if no_peer and product:
        return [finding(GPU_P2P, "machine", PASS,
                        f"{len(pairs)} GPU pairs, median {median:.0f} GB/s per direction, staged through host memory: "
                        f"the {product} has no peer-to-peer access (a limit of the product, not of this machine)",
                        measured=measured_text,
                        expected=f">= {100 * STAGED_WARN:.0f}% of half the PCIe line rate (a host-staged copy crosses it twice)",
                        source=source)]
    if no_peer:
        return [finding(GPU_P2P, "machine", WARN, f"no peer access between {len(no_peer)} pairs (copies staged through host memory)",
                        measured=measured_text, remedy=remedy)]
    return [finding(GPU_P2P, "machine", PASS, f"{len(pairs)} GPU pairs, median {median:.0f} GB/s per direction", measured=measured_text,
                    expected=">= 60% of what the link between each pair carries, peer access on every pair",
                    source=source)]


def _broken_pairs(ctx: Context) -> tuple[str, str] | None:
    """A pair that hung (the bench.p2p note) FAILs; pairs the driver could not map (more peers than
    CUDA allows one GPU) WARN."""
    note = next((m for m in measured(ctx, "bench.p2p") if m.details.get("outcome") == "failed"), None)
    if note is not None:
        return FAIL, f"a GPU-to-GPU copy failed: {note.details.get('reason', 'no reason given')}"
    matrix = next(iter(measured(ctx, "p2p.matrix")), None)
    failed = (matrix.details.get("failed_pairs") or []) if matrix else []
    if failed:
        names = ", ".join(f"gpu{f.get('src')}->gpu{f.get('dst')}" for f in failed[:6]) + (" ..." if len(failed) > 6 else "")
        return WARN, f"{len(failed)} GPU pairs could not copy peer to peer ({names}): {failed[0].get('reason', '')}"
    return None


def check_allreduce(ctx: Context) -> list[Finding]:
    if not planned(ctx, "allreduce"):
        return []
    busbw = one(ctx, "allreduce.busbw", "machine")
    if busbw is None:
        return [not_measured(ctx, "allreduce", GPU_ALLREDUCE, "machine")]
    latency = one(ctx, "allreduce.latency_1mb", "machine")
    d = busbw.details
    measured_text = (f"busbw {busbw.value:.1f} GB/s at {d.get('largest_bytes', d.get('bytes', '?'))} bytes over {d.get('world_size')} ranks "
                     f"({d.get('backend')})" + (f"; 1 MiB latency {latency.value:.0f} us" if latency else ""))
    if d.get("check_ok") is False:
        return [finding(GPU_ALLREDUCE, "machine", FAIL, "all-reduce returned wrong sums: data corrupted between GPUs",
                        measured=measured_text, expected="every rank holds n(n+1)/2",
                        remedy="rerun `gpuvet bench allreduce`; test pairs with `gpuvet bench p2p`; ask for another node")]
    expected, over = _allreduce_expectation(ctx)
    if d.get("outcome") == "hung":  # the deadline passed inside a size: a stuck rank, not a slow one
        return [finding(GPU_ALLREDUCE, "machine", FAIL, f"{d.get('reason') or 'all-reduce hung'}",
                        measured=measured_text, expected="every size of the sweep finishes",
                        source="nccl-tests busbw = algbw x 2(n-1)/n",
                        remedy="`sudo dmesg | grep -i xid`; rerun `gpuvet bench allreduce` with `NCCL_DEBUG=INFO`; "
                               "check gpu.nvlink and gpu.p2p; ask for another node if it repeats")]
    # Larger sizes skipped for time: the largest measured still says how the links carry, if less fully.
    skipped = (f" (sweep incomplete: {(d.get('reason') or 'sizes not measured').removeprefix('sweep incomplete: ')}; "
               "judged at the largest size measured)") if d.get("outcome") == "incomplete" else ""
    lat_status, lat_words, lat_expected = _latency_verdict(latency, over if expected is not None else "")
    if expected is None:
        status = lat_status or MEASURED
        if skipped:
            status = WARN if status in (PASS, MEASURED) else status
        words = f"bus bandwidth {busbw.value:.1f} GB/s (no link figure to compare with){skipped}" + lat_words
        if status == MEASURED:
            return [finding(GPU_ALLREDUCE, "machine", MEASURED, words, measured=measured_text)]
        return [finding(GPU_ALLREDUCE, "machine", status, words, measured=measured_text, expected=lat_expected,
                        source=LATENCY_SOURCE, remedy="check gpu.nvlink and gpu.p2p; `NCCL_DEBUG=INFO` shows the transport NCCL chose")]
    share = busbw.value / expected
    product = without_p2p(ctx) if over.startswith("PCIe") else None
    # Through host memory (NCCL's SHM transport) each step is staged and copied again.
    warn_below, fail_below = (STAGED_WARN, STAGED_FAIL) if product else (0.6, 0.35)
    status = PASS if share >= warn_below else WARN if share >= fail_below else FAIL
    if product:
        over += f" (the {product} has no peer-to-peer access: a limit of the product, not of this machine)"
    if skipped and status == PASS:
        status = WARN  # a healthy figure at a small size does not prove the large ones
    words = f"bus bandwidth {busbw.value:.1f} GB/s = {100 * share:.0f}% of ~{expected:.0f} GB/s over {over}{skipped}" + lat_words
    status = worst(status, lat_status or PASS)
    source = "nccl-tests busbw = algbw x 2(n-1)/n, against the slowest link per GPU" + (f"; {LATENCY_SOURCE}" if lat_status else "")
    remedy = "check gpu.nvlink and gpu.p2p; `NCCL_DEBUG=INFO` shows the transport NCCL chose"
    if product:
        source += f"; {NO_P2P_SOURCE}"
        remedy = ("check gpu.pcie_bandwidth and `nvidia-smi topo -m` (GPUs behind one switch or CPU share its uplink); "
                  "`NCCL_DEBUG=INFO` shows the SHM transport")
    return [finding(GPU_ALLREDUCE, "machine", status, words, measured=measured_text,
                    expected=f">= {100 * warn_below:.0f}% of ~{expected:.0f} GB/s" + (f"; {lat_expected}" if lat_expected else ""),
                    source=source, remedy=None if status == PASS else remedy)]


# Seed 2, section 5: torch.distributed.all_reduce of a 1 MB tensor took 18 ms between two A100s
# over PCIe and 2.3 ms over NVLink; gradient buckets are MB-sized, so this decides the epoch time.
SEED_PCIE_1MB_MS, SEED_NVLINK_1MB_MS = 18.0, 2.3
LATENCY_SOURCE = "renters' measurements: a 1 MB all-reduce took 18 ms over PCIe, 2.3 ms over NVLink"
_MIB = 1 << 20


def _latency_verdict(latency: Measurement | None, over: str) -> tuple[str | None, str, str | None]:
    """The 1 MiB all-reduce time against the seed's figures for the link the GPUs have: over
    NVLink slower than 2.3 ms warns and PCIe-class (18 ms) fails; over PCIe (or an unknown link)
    18 ms or more warns. (None, "", None) when it was not measured at 1 MiB."""
    if latency is None or latency.value is None or latency.details.get("bytes") not in (None, _MIB):
        return None, "", None
    ms = latency.value / 1000.0
    if "NVLink" in over:
        status = PASS if ms <= SEED_NVLINK_1MB_MS else WARN if ms < SEED_PCIE_1MB_MS else FAIL
        expected = f"1 MiB all-reduce <= {SEED_NVLINK_1MB_MS:g} ms over NVLink"
        words = "" if status == PASS else (f"; 1 MiB all-reduce {ms:.1f} ms: slower than the seed's {SEED_NVLINK_1MB_MS:g} ms "
                                           "over NVLink" + (f", as slow as its {SEED_PCIE_1MB_MS:g} ms over PCIe: is NCCL "
                                                            "using the NVLinks?" if status == FAIL else ""))
    else:
        link = "PCIe" if over else "an unknown link"
        status = PASS if ms < SEED_PCIE_1MB_MS else WARN
        expected = f"1 MiB all-reduce < {SEED_PCIE_1MB_MS:g} ms over {link}"
        words = "" if status == PASS else (f"; 1 MiB all-reduce {ms:.1f} ms over {link}: the seed's slow PCIe case "
                                           f"({SEED_PCIE_1MB_MS:g} ms; {SEED_NVLINK_1MB_MS:g} ms over NVLink): gradient "
                                           "synchronisation will dominate multi-GPU training")
    if status == PASS:
        words = f"; 1 MiB all-reduce {ms:.2f} ms"
    return status, words, expected


def _allreduce_expectation(ctx: Context) -> tuple[float | None, str]:
    """Per-GPU bandwidth of the slowest GPU's links to its peers: NVLink when every GPU has it, else PCIe."""
    topo = ctx.machine.topology
    gpus = [g for g in ctx.machine.gpus if g.name or g.pcie.readings]
    if topo and topo.gpus:
        totals = [nvlinks_per_gpu(topo, label) for label in topo.gpus]
        if totals and min(totals) > 0:
            per_link = _per_link_gbs(ctx, gpus[0] if gpus else None)
            return min(totals) * per_link, f"{min(totals)} NVLinks per GPU"
    pcie = [p for p in (_pcie_gbs(g) for g in gpus) if p]
    if pcie and without_p2p(ctx):
        return min(pcie) / 2, "PCIe through host memory"
    return (min(pcie), "PCIe") if pcie else (None, "")
