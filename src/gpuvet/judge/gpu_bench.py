"""What the GPU benchmarks measured, against the model's figures and the box's other GPUs:
gpu.gemm, gpu.correctness, gpu.memory_bandwidth, gpu.pcie_bandwidth, gpu.context_init,
gpu.kernel_launch."""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import checked
from ..facts import Gpu
from ..record import MEASURED, Finding, has_value
from .bench_common import against_box, box_median, measured, mig_slice, not_measured, one, planned, worst
from .common import FAIL, PASS, WARN, Context, finding, subject
from .gpu_links import GBS_PER_LANE
from ..specs.reference import Reference

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
GPU_CONTEXT_INIT = checked("gpu.context_init")
GPU_CORRECTNESS = checked("gpu.correctness")
GPU_GEMM = checked("gpu.gemm")
GPU_KERNEL_LAUNCH = checked("gpu.kernel_launch")
GPU_MEMORY_BANDWIDTH = checked("gpu.memory_bandwidth")
GPU_PCIE_BANDWIDTH = checked("gpu.pcie_bandwidth")

DTYPE_PEAK = {"fp32": "fp32_tflops", "tf32": "tf32_tensor_tflops_dense", "fp16": "fp16_tensor_tflops_dense",
              "bf16": "bf16_tensor_tflops_dense", "fp8": "fp8_tensor_tflops_dense"}
DTYPE_BEST = {"bf16": "mamf_bf16_tflops", "fp8": "mamf_fp8_tflops"}  # measured best (mamf-finder)
PRIMARY = ("bf16", "fp16", "tf32", "fp32")  # the dtype training runs on decides the box comparison

# Against the best achievable figure a healthy GPU lands within a few percent; a 10% shortfall
# must show. Against the dense peak only, healthy GPUs land anywhere from 60% to 90%.
BEST_WARN, BEST_FAIL = 0.92, 0.80
# Words of a GEMM error that mean the GPU faulted; anything else (a library refusing a shape,
# CUBLAS_STATUS_NOT_SUPPORTED, out of memory) is a limit of the software, not the hardware.
_GPU_FAULTS = ("illegal memory access", "illegal instruction", "ECC", "Xid", "unspecified launch failure",
               "misaligned address", "uncorrectable", "hardware", "launch timed out")
# A model's own figure measured another way than mamf-finder (one shape, a hand kernel, a torch
# test: the row's other_measured_matmul_tflops) is a floor more than a best: judged loosely. It is
# what a SKU whose tensor rate firmware caps (H20: 89.5 of a 148 dense peak) really reaches.
PUBLISHED_WARN, PUBLISHED_FAIL = 0.80, 0.65
# A model nobody published a measured figure for is judged as measured, against this machine's
# other GPUs; only a figure below this share of its dense peak fails: no healthy GPU lands there
# (the lowest measured share in the table is the firmware-capped H20's 60%; power-capped T4 and L4
# boards reach well over a third).
PEAK_FLOOR = 0.25
BOX_WARN, BOX_FAIL = 0.92, 0.85
CONFIRM_GEMM = ("check gpu.power_limit and gpu.throttle; watch clocks while it runs: "
                "`nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv -l 1`; rerun `gpuvet bench gemm`")


@dataclass(frozen=True)
class Achievable:
    """The figure a healthy GPU of this model reaches for a dtype, measured by mamf-finder or
    published another way, scaled to a MIG slice's share of the SMs."""

    tflops: float
    kind: str  # "best" (mamf-finder) or "published"
    words: str  # how the summary names it
    source: str
    warn_below: float
    fail_below: float


def achievable(ref: Reference | None, dtype: str, share: float = 1.0) -> Achievable | None:
    column = DTYPE_BEST.get(dtype)
    if ref is None or column is None and dtype not in DTYPE_PEAK:
        return None
    scaled = "" if share == 1.0 else f", x {100 * share:.0f}% for the slice"
    best = ref.number(column) if column else None
    if column and best:
        return Achievable(best * share, "best", f"the best measured for {ref.name} ({best:g}{scaled})", ref.cite(column),
                          BEST_WARN, BEST_FAIL)
    published = ref.published_matmul(dtype)
    if published is None:
        return None
    stand_in = f" ({published.dtype}: the same tensor rate)" if published.dtype != dtype else ""
    return Achievable(published.tflops * share, "published",
                      f"the {published.tflops:g}{stand_in} published for {ref.name}{scaled}, judged loosely",
                      f"{ref.cite('other_measured_matmul_tflops')}; the cell: {published.text}",
                      PUBLISHED_WARN, PUBLISHED_FAIL)


def check_gemm(ctx: Context) -> list[Finding]:
    if not planned(ctx, "gemm"):
        return []
    return [_gemm(ctx, gpu) for gpu in ctx.machine.gpus]


def _gemm(ctx: Context, gpu: Gpu) -> Finding:
    s = subject(gpu)
    rates = {m.name.removeprefix("gemm."): m for m in ctx.measurements
             if m.subject == s and m.name.startswith("gemm.") and has_value(m) and m.unit == "TFLOPS"}
    if not rates:
        return not_measured(ctx, "gemm", GPU_GEMM, s)
    ref = ctx.ref(gpu)
    primary = next(d for d in PRIMARY + tuple(rates) if d in rates)
    mig = mig_slice(gpu, ref, rates[primary].details)
    share = mig.compute if mig else 1.0
    listing = "; ".join(f"{d} {m.value:.1f}" + _shares(ref, d, m.value, share or 1.0) for d, m in rates.items())
    measured_text = f"TFLOPS: {listing}; {primary} shape {rates[primary].details.get('shape')}"
    if mig:
        measured_text += f"; {mig.words}"
    # Every dtype with a measured figure is judged against it, the primary one against its peak
    # when it has none; the worst decides. A slice of unknown size is only measured.
    judged = [_Judged(MEASURED, f"{primary} {rates[primary].value:.1f} TFLOPS on {mig.words if mig else 'a MIG slice'}")]
    if share is not None:
        judged = [j for j in (_judged_dtype(ref, gpu, dtype, rates[dtype].value, share, dtype == primary)
                              for dtype in sorted(rates, key=lambda d: d != primary)) if j]
    status = worst(*(j.status for j in judged))
    words = "; ".join(j.words for j in judged)
    box, box_words = against_box(rates[primary].value, box_median(ctx, f"gemm.{primary}"), BOX_WARN, BOX_FAIL)
    if box:
        words += f"; {primary} {box_words}"
    status = worst(status, box)
    return finding(GPU_GEMM, s, status, words, measured=measured_text,
                   expected="; ".join(j.expected for j in judged if j.expected) or None,
                   source=" | ".join(dict.fromkeys(j.source for j in judged if j.source)) or None,
                   remedy=CONFIRM_GEMM if status in (WARN, FAIL) else None)


def _judged_dtype(ref: Reference | None, gpu: Gpu, dtype: str, value: float, share: float, primary: bool) -> _Judged | None:
    best = achievable(ref, dtype, share)
    if best:
        return _against_best(dtype, value, best)
    return _against_peak(ref, gpu, dtype, value, share) if primary else None


@dataclass(frozen=True)
class _Judged:
    status: str
    words: str
    expected: str | None = None
    source: str | None = None


def _against_best(dtype: str, value: float, best: Achievable) -> _Judged:
    share = value / best.tflops
    status = PASS if share >= best.warn_below else WARN if share >= best.fail_below else FAIL
    return _Judged(status, f"{dtype} {value:.1f} TFLOPS = {100 * share:.0f}% of {best.words}",
                   f"{dtype} >= {100 * best.warn_below:.0f}% of {best.tflops:.4g} TFLOPS", best.source)


def _against_peak(ref: Reference | None, gpu: Gpu, dtype: str, value: float, share: float) -> _Judged:
    """No measured figure for this model: what it reached of its dense peak, as measured; only a
    rate no healthy GPU shows fails."""
    whole = ref.number(DTYPE_PEAK[dtype]) if ref and dtype in DTYPE_PEAK else None
    if ref is None or not whole:
        return _Judged(MEASURED, f"{dtype} {value:.1f} TFLOPS (no reference figure for {gpu.name or 'this GPU'})")
    peak = whole * share
    of_peak = value / peak
    status = FAIL if of_peak < PEAK_FLOOR else MEASURED
    slice_words = "" if share == 1.0 else f" x {100 * share:.0f}% for the slice"
    return _Judged(status, f"{dtype} {value:.1f} TFLOPS = {100 * of_peak:.0f}% of the {whole:g}{slice_words} dense peak "
                           "(nobody published a measured figure for this model: judged as measured, against this "
                           f"machine's other GPUs; under {100 * PEAK_FLOOR:.0f}% of the peak fails)",
                   f"{dtype} >= {100 * PEAK_FLOOR:.0f}% of the {peak:.4g} TFLOPS dense peak", ref.cite(DTYPE_PEAK[dtype]))


def _shares(ref, dtype: str, value: float, share: float) -> str:
    """" (79% of the 989 dense peak, 98% of best 794.5)": the figures a reader compares with."""
    parts = []
    peak = ref.number(DTYPE_PEAK[dtype]) if ref and dtype in DTYPE_PEAK else None
    if peak:
        parts.append(f"{100 * value / (peak * share):.0f}% of the {peak * share:.4g} dense peak")
    a = achievable(ref, dtype, share)
    if a:
        parts.append(f"{100 * value / a.tflops:.0f}% of {'best' if a.kind == 'best' else 'published'} {a.tflops:.4g}")
    return f" ({', '.join(parts)})" if parts else ""


def check_correctness(ctx: Context) -> list[Finding]:
    if not planned(ctx, "gemm"):
        return []
    findings = []
    for gpu in ctx.machine.gpus:
        s = subject(gpu)
        m = one(ctx, "gemm.check_failures", s)
        if m is None:
            findings.append(not_measured(ctx, "gemm", GPU_CORRECTNESS, s))
        elif m.value:
            failed = m.details.get("failed") or m.details
            findings.append(finding(
                GPU_CORRECTNESS, s, FAIL, f"wrong GEMM results (silent data corruption): {failed}",
                measured=f"{m.value:.0f} dtype(s) failed the check", expected="results equal to a float64 reference",
                source="gpuvet GEMM check against a CPU float64 product",
                remedy=f"stop using GPU {gpu.index}; reset it (`sudo nvidia-smi -r -i {gpu.index}`), rerun `gpuvet bench gemm`; "
                       "if it repeats, ask the provider to replace the GPU"))
        else:
            checked = ", ".join(x.name.removeprefix("gemm.") for x in ctx.measurements
                                if x.subject == s and x.unit == "TFLOPS" and x.name.startswith("gemm."))
            errors = m.details.get("errors") or {}
            if errors:  # a dtype whose GEMM raised: nothing of it was checked
                said = "; ".join(f"{dtype}: {error}" for dtype, error in errors.items())
                trouble = any(word in said for word in _GPU_FAULTS)
                findings.append(finding(
                    GPU_CORRECTNESS, s, FAIL if trouble else WARN,
                    f"GEMM failed to run in {', '.join(errors)} ({said})" + (f"; {checked} matched a float64 reference" if checked else ""),
                    measured=said, expected="every dtype the GPU supports runs and matches a float64 reference",
                    source="gpuvet GEMM check against a CPU float64 product",
                    remedy=f"rerun `gpuvet bench gemm`; `sudo dmesg | grep -i xid`; `nvidia-smi -q -i {gpu.index} -d ECC`"))
                continue
            findings.append(finding(GPU_CORRECTNESS, s, PASS, f"GEMM results match a float64 reference ({checked})",
                                    measured=f"{checked}: within tolerance of the float64 product, 0 mismatches",
                                    expected="every dtype matches a float64 reference within its tolerance",
                                    source="gpuvet GEMM check against a CPU float64 product"))
    return findings


def check_memory_bandwidth(ctx: Context) -> list[Finding]:
    if not planned(ctx, "membw"):
        return []
    findings = []
    median = box_median(ctx, "membw.copy")
    for gpu in ctx.machine.gpus:
        s = subject(gpu)
        m = one(ctx, "membw.copy", s)
        if m is None:
            findings.append(not_measured(ctx, "membw", GPU_MEMORY_BANDWIDTH, s))
            continue
        ref = ctx.ref(gpu)
        spec = ref.number("mem_bandwidth_gbs") if ref else None
        words, status, expected, source = f"device copy {m.value:.0f} GB/s (read + write counted)", PASS, None, None
        mig = mig_slice(gpu, ref, m.details)
        if mig and mig.memory is None:
            spec, status = None, MEASURED
            words += f"; {mig.words}"
        if ref is not None and spec:
            portion = mig.memory if mig and mig.memory else 1.0
            share = m.value / (spec * portion)
            status = PASS if share >= 0.75 else WARN if share >= 0.55 else FAIL
            of = f"{spec:g} GB/s spec" if portion == 1.0 else f"{spec * portion:.0f} GB/s its slice holds ({mig.words if mig else ''} of {spec:g} GB/s)"
            words += f" = {100 * share:.0f}% of the {of}"
            expected, source = (f">= 75% of {spec * portion:.0f} GB/s (healthy HBM/GDDR copies reach 80-92%)",
                                ref.cite("mem_bandwidth_gbs"))
        box, box_words = against_box(m.value, median, 0.90, 0.80)
        if box:
            words += f"; {box_words}"
        status = worst(status, box)
        findings.append(finding(GPU_MEMORY_BANDWIDTH, s, status, words, measured=f"{m.value:.0f} GB/s, {m.details.get('bytes_counted', '')}",
                                expected=expected, source=source,
                                remedy=None if status in (PASS, MEASURED) else "check clocks and throttling under load; rerun `gpuvet bench membw`"))
    return findings


def check_pcie_bandwidth(ctx: Context) -> list[Finding]:
    if not planned(ctx, "pcie"):
        return []
    findings = []
    medians = {name: box_median(ctx, name) for name in ("pcie.h2d_pinned", "pcie.d2h_pinned")}
    for gpu in ctx.machine.gpus:
        s = subject(gpu)
        h2d, d2h = one(ctx, "pcie.h2d_pinned", s), one(ctx, "pcie.d2h_pinned", s)
        if h2d is None or d2h is None:
            findings.append(not_measured(ctx, "pcie", GPU_PCIE_BANDWIDTH, s))
            continue
        h2d_pageable, d2h_pageable = one(ctx, "pcie.h2d_pageable", s), one(ctx, "pcie.d2h_pageable", s)
        both = one(ctx, "pcie.bidir_pinned", s)
        measured_text = f"pinned H2D {h2d.value:.1f} / D2H {d2h.value:.1f} GB/s" + (
            f"; pageable {h2d_pageable.value:.1f} / {d2h_pageable.value:.1f}" if h2d_pageable and d2h_pageable else "") + (
            f"; both ways at once {both.value:.1f} GB/s together" if both else "") + _binding(h2d.details)
        gen, width, under_load = _link_for_bandwidth(gpu)
        words, status, expected = f"H2D {h2d.value:.1f}, D2H {d2h.value:.1f} GB/s (pinned)", MEASURED, None
        source = "PCIe line rate per lane and generation (after encoding)"
        link, carry = _expected_link(gen, width, under_load, ctx.ref(gpu))
        if carry:
            share = min(h2d.value, d2h.value) / carry
            status = PASS if share >= 0.65 else WARN if share >= 0.40 else FAIL
            words += f" = {100 * share:.0f}% of what {link}"
            expected = f">= 65% of ~{carry:.0f} GB/s (healthy links reach 80-90%)"
            ref = ctx.ref(gpu)
            if ref and "reference" in link:
                source += f"; the model's own link: {ref.cite('pcie_gen')} and pcie_lanes"
        for m in (h2d, d2h):
            box, box_words = against_box(m.value, medians[m.name], 0.85, 0.70)
            if box:
                words += f"; {m.name.split('.')[1].split('_')[0].upper()} {box_words}"
                status = worst(status if status != MEASURED else PASS, box)
        together = one(ctx, "pcie.h2d_pinned_together", s)
        if together is not None:
            measured_text += f"; H2D with every GPU copying at once {together.value:.1f} GB/s"
            if together.value < SHARED_UPLINK_WARN * h2d.value:
                words += (f"; with every GPU copying at once it gets only {together.value:.1f} GB/s "
                          f"({100 * together.value / h2d.value:.0f}% of its own): the GPUs share a host link, and a data "
                          "loader feeding them all will starve (`nvidia-smi topo -m`: GPUs behind one switch)")
                status = worst(status if status != MEASURED else PASS, WARN)
        if status == MEASURED:
            words += ": no link width or model reference to judge it against"
        findings.append(finding(
            GPU_PCIE_BANDWIDTH, s, status, words, measured=measured_text, expected=expected,
            source=source,
            remedy=None if status == PASS else
            "compare with gpu.pcie_link; a virtualised or oversubscribed link shows here: ask the provider; "
            "rerun `gpuvet bench pcie`"))
    return findings


# Two GPUs behind one switch share its uplink by design (HGX: each gets ~half with both copying);
# four or more behind one x16 uplink starve a data loader.
SHARED_UPLINK_WARN = 0.25


def _binding(details: dict) -> str:
    """Where the pinned buffer's pages lay: near the GPU (bound to its NUMA node's CPUs) or not known."""
    if details.get("numa_bound"):
        return f"; host buffer on the GPU's NUMA node ({details.get('cpu_affinity_source') or 'CPU list'})"
    note = details.get("numa_note")
    return f"; host buffer not bound to the GPU's NUMA node ({note})" if note else ""


def _expected_link(gen: int | None, width: int | None, under_load: bool, ref: Reference | None) -> tuple[str, float | None]:
    """What the link should carry: the generation as read (a Gen5 card in a Gen4 host moves Gen4
    rates, healthy; the short slot is gpu.pcie_link's to say), over the model's own lanes when the
    link as read is narrower: a link the slot or a virtualization layer cut to x8 is judged against
    what the card was built to move, so a halved link cannot pass at 90% of x8."""
    read = GBS_PER_LANE[gen] * width if gen in GBS_PER_LANE and width else None
    ref_gen, ref_lanes = (ref.number("pcie_gen"), ref.number("pcie_lanes")) if ref else (None, None)
    as_read = f"Gen{gen} x{width}" + (" as read under load" if under_load else "")
    if ref is not None and ref_lanes and width and ref_lanes > width and gen in GBS_PER_LANE:
        model = GBS_PER_LANE[gen] * ref_lanes
        return (f"the {ref.id}'s own Gen{gen} x{int(ref_lanes)} link (reference) carries (~{model:.0f} GB/s); "
                f"the link as read, Gen{gen} x{width}, carries ~{read:.0f} GB/s (gpu.pcie_link)"), model
    if read:
        short = (f"; the {ref.id} is a Gen{int(ref_gen)} card, the host gives Gen{gen} (gpu.pcie_link)"
                 if ref is not None and ref_gen and gen and ref_gen > gen else "")
        return f"{as_read} carries (~{read:.0f} GB/s){short}", read
    if ref is not None and ref_gen and ref_lanes and int(ref_gen) in GBS_PER_LANE:  # nothing read: the card's own link
        model = GBS_PER_LANE[int(ref_gen)] * ref_lanes
        return f"the {ref.id}'s own Gen{int(ref_gen)} x{int(ref_lanes)} link (reference) carries (~{model:.0f} GB/s)", model
    return "", None


def _link_for_bandwidth(gpu: Gpu) -> tuple[int | None, int | None, bool]:
    loaded = [r for r in gpu.pcie.readings if r.under_load]
    readings = loaded or gpu.pcie.readings
    if not readings:
        return None, None, False
    r = readings[0]
    if r.under_load:
        return r.current_gen, r.current_width, True
    return r.max_gen, r.max_width, False  # an idle reading's current generation means nothing


COLD_WARN_MS = 2000.0  # a first process slower than this: the driver was not kept loaded


def check_context_init(ctx: Context) -> list[Finding]:
    if not planned(ctx, "latency"):
        return []
    found = [m for m in measured(ctx, "latency.context_init") if has_value(m)]
    if not found:
        return [not_measured(ctx, "latency", GPU_CONTEXT_INIT, "gpu0" if ctx.machine.gpus else "gpu")]
    findings = []
    for m in found:
        gpu = next((g for g in ctx.machine.gpus if subject(g) == m.subject), None)
        hint = ""
        if gpu is not None and gpu.persistence_mode is False:
            hint = "persistence mode is off: `sudo nvidia-smi -pm 1` keeps the driver loaded between processes; "
        if gpu is not None and gpu.virtualization_mode == "vgpu":
            hint += "a vGPU guest pays this on every new process; "
        status = PASS if m.value <= 500 else WARN if m.value <= 2000 else FAIL
        words = f"a new process needs {m.value:.0f} ms to get a CUDA context"
        if status != PASS:
            words += " (a whole GPU passed through takes ~100 ms, a vGPU guest ~850 ms): every new Python process or notebook kernel pays it"
        cold = one(ctx, "latency.context_cold", m.subject)
        cold_words = ""
        if cold is not None:  # the first process on the idle GPU, before gpuvet's worker held it
            cold_words = f"; the first, before any gpuvet process held the GPU: {cold.value:.0f} ms"
            if cold.value > COLD_WARN_MS and status == PASS:
                status = WARN  # a setting (persistence mode) or vGPU, never the GPU's speed: never FAIL
                words += (f"; but the first process on the idle GPU took {cold.value:.0f} ms: the driver unloads between "
                          "jobs, so every job's first process pays it")
                hint = hint or "`sudo nvidia-smi -pm 1` (persistence mode) keeps the driver loaded between processes; "
        findings.append(finding(GPU_CONTEXT_INIT, m.subject, status, words,
                                measured=f"median {m.value:.0f} ms of {len(m.details.get('runs', [])) or '?'} fresh processes"
                                         + cold_words,
                                expected="<= 500 ms", source="renters' measurements of a first CUDA call in a fresh process: 95-120 ms on a "
                                       "passed-through GPU, 850 ms under vGPU",
                                remedy=None if status == PASS else hint + "rerun `gpuvet bench latency`"))
    return findings


def check_kernel_launch(ctx: Context) -> list[Finding]:
    if not planned(ctx, "latency"):
        return []
    found = [m for m in measured(ctx, "latency.kernel_launch") if has_value(m)]
    findings = []
    for m in found:
        status = PASS if m.value <= 20 else WARN
        findings.append(finding(GPU_KERNEL_LAUNCH, m.subject, status, f"{m.value:.1f} us per kernel launch",
                                measured=f"{m.value:.1f} us async, {m.details.get('sync_roundtrip_us', '?')} us with synchronize",
                                expected="<= 20 us",
                                source="gpuvet's own bound for the host time to queue one PyTorch add_ (dispatch "
                                "included); not SuperBench's A100 5.7 us, which is the GPU-side event time of an "
                                "empty CUDA kernel",
                                remedy=None if status == PASS else "a slow or oversubscribed host CPU, or vGPU: see host.steal"))
    return findings
