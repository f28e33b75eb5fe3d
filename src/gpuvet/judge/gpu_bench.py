"""What the GPU benchmarks measured, against the model's figures and the box's other GPUs:
gpu.gemm, gpu.correctness, gpu.memory_bandwidth, gpu.pcie_bandwidth, gpu.context_init,
gpu.kernel_launch."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..facts import Gpu
from ..record import MEASURED, Finding, has_value
from .bench_common import against_box, box_median, measured, not_measured, one, planned, worst
from .common import FAIL, PASS, WARN, Context, finding, subject
from .gpu_links import GBS_PER_LANE
from ..specs import reference
from ..specs.reference import Reference

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
# A model without a measured best gets one estimated from a model of the same chip that has one
# (its best/peak ratio times this model's peak): an estimate, so judged with more room.
ESTIMATE_WARN, ESTIMATE_FAIL = 0.90, 0.75
PEAK_WARN, PEAK_FAIL = 0.60, 0.45
BOX_WARN, BOX_FAIL = 0.92, 0.85
CONFIRM_GEMM = ("check gpu.power_limit and gpu.throttle; watch clocks while it runs: "
                "`nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv -l 1`; rerun `gpuvet bench gemm`")


@dataclass(frozen=True)
class Achievable:
    """The best figure a healthy GPU of this model reaches for a dtype: measured, or estimated."""

    tflops: float
    measured: bool
    words: str  # how the summary names it
    source: str
    warn_below: float
    fail_below: float


def achievable(ref: Reference | None, dtype: str) -> Achievable | None:
    column = DTYPE_BEST.get(dtype)
    if ref is None or column is None:
        return None
    best = ref.number(column)
    if best:
        return Achievable(best, True, f"the best measured for {ref.name} ({best:g})", ref.cite(column),
                          BEST_WARN, BEST_FAIL)
    peak = ref.number(DTYPE_PEAK[dtype])
    sibling = _same_chip_ratio(ref.id, dtype)
    if not peak or sibling is None:
        return None
    ratio, basis = sibling
    estimate = peak * ratio
    return Achievable(estimate, False, f"the ~{estimate:.0f} estimated from {basis}",
                      f"estimated: {basis} times {ref.id}'s {peak:g} dense peak; {ref.cite(DTYPE_PEAK[dtype])}",
                      ESTIMATE_WARN, ESTIMATE_FAIL)


@functools.cache
def _same_chip_ratio(ref_id: str, dtype: str) -> tuple[float, str] | None:
    """The lowest measured best/peak ratio among models of the same chip (lowest: an estimate must
    never call a healthy card slow), with the words that say where it comes from. Same chip, not
    same architecture: GA102 boards (A10, A40) reach far less of their listed peak than GA100."""
    this = reference.by_id(ref_id)
    chip = (this.row.get("chip") or "").strip() if this else ""
    if not chip:
        return None
    column, peak_column = DTYPE_BEST[dtype], DTYPE_PEAK[dtype]
    ratios = []
    for other in reference.all_references():
        best, peak = other.number(column), other.number(peak_column)
        if other.id != ref_id and best and peak and (other.row.get("chip") or "").strip() == chip:
            ratios.append((best / peak, other.id, best, peak))
    if not ratios:
        return None
    ratio, other_id, best, peak = min(ratios)
    return ratio, f"{other_id}'s measured best/peak ratio ({best:g}/{peak:g} = {ratio:.2f}, same {chip} chip)"


def check_gemm(ctx: Context) -> list[Finding]:
    if not planned(ctx, "gemm"):
        return []
    return [_gemm(ctx, gpu) for gpu in ctx.machine.gpus]


def _gemm(ctx: Context, gpu: Gpu) -> Finding:
    s = subject(gpu)
    rates = {m.name.removeprefix("gemm."): m for m in ctx.measurements
             if m.subject == s and m.name.startswith("gemm.") and has_value(m) and m.unit == "TFLOPS"}
    if not rates:
        return not_measured(ctx, "gemm", "gpu.gemm", s)
    ref = ctx.ref(gpu)
    primary = next(d for d in PRIMARY + tuple(rates) if d in rates)
    listing = "; ".join(f"{d} {m.value:.1f}" + _shares(ref, d, m.value) for d, m in rates.items())
    measured_text = f"TFLOPS: {listing}; {primary} shape {rates[primary].details.get('shape')}"
    # Every dtype with a best figure is judged against it, the primary one loosely against its peak
    # when it has none; the worst decides.
    judged = []
    for dtype in sorted(rates, key=lambda d: d != primary):
        best = achievable(ref, dtype)
        if best:
            judged.append(_against_best(dtype, rates[dtype].value, best))
        elif dtype == primary:
            judged.append(_against_peak(ref, gpu, dtype, rates[dtype].value))
    status = worst(*(j.status for j in judged))
    words = "; ".join(j.words for j in judged)
    box, box_words = against_box(rates[primary].value, box_median(ctx, f"gemm.{primary}"), BOX_WARN, BOX_FAIL)
    if box:
        words += f"; {primary} {box_words}"
    status = worst(status, box)
    return finding("gpu.gemm", s, status, words, measured=measured_text,
                   expected="; ".join(j.expected for j in judged if j.expected) or None,
                   source=" | ".join(dict.fromkeys(j.source for j in judged if j.source)) or None,
                   remedy=CONFIRM_GEMM if status != PASS else None)


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


def _against_peak(ref: Reference | None, gpu: Gpu, dtype: str, value: float) -> _Judged:
    peak = ref.number(DTYPE_PEAK[dtype]) if ref and dtype in DTYPE_PEAK else None
    if ref is None or not peak:
        return _Judged(PASS, f"{dtype} {value:.1f} TFLOPS (no reference figure for {gpu.name or 'this GPU'})")
    share = value / peak
    status = PASS if share >= PEAK_WARN else WARN if share >= PEAK_FAIL else FAIL
    return _Judged(status, f"{dtype} {value:.1f} TFLOPS = {100 * share:.0f}% of the {peak:g} dense peak "
                           "(no measured best for this model: judged loosely)",
                   f"{dtype} >= {100 * PEAK_WARN:.0f}% of the {peak:g} TFLOPS dense peak", ref.cite(DTYPE_PEAK[dtype]))


def _shares(ref, dtype: str, value: float) -> str:
    """" (79% of the 989 dense peak, 98% of best 794.5)": the figures a reader compares with."""
    parts = []
    peak = ref.number(DTYPE_PEAK[dtype]) if ref and dtype in DTYPE_PEAK else None
    if peak:
        parts.append(f"{100 * value / peak:.0f}% of the {peak:g} dense peak")
    a = achievable(ref, dtype)
    if a:
        parts.append(f"{100 * value / a.tflops:.0f}% of {'best' if a.measured else 'estimated best'} {a.tflops:.4g}")
    return f" ({', '.join(parts)})" if parts else ""


def check_correctness(ctx: Context) -> list[Finding]:
    if not planned(ctx, "gemm"):
        return []
    findings = []
    for gpu in ctx.machine.gpus:
        s = subject(gpu)
        m = one(ctx, "gemm.check_failures", s)
        if m is None:
            findings.append(not_measured(ctx, "gemm", "gpu.correctness", s))
        elif m.value:
            failed = m.details.get("failed") or m.details
            findings.append(finding(
                "gpu.correctness", s, FAIL, f"wrong GEMM results (silent data corruption): {failed}",
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
                    "gpu.correctness", s, FAIL if trouble else WARN,
                    f"GEMM failed to run in {', '.join(errors)} ({said})" + (f"; {checked} matched a float64 reference" if checked else ""),
                    measured=said, expected="every dtype the GPU supports runs and matches a float64 reference",
                    source="gpuvet GEMM check against a CPU float64 product",
                    remedy=f"rerun `gpuvet bench gemm`; `sudo dmesg | grep -i xid`; `nvidia-smi -q -i {gpu.index} -d ECC`"))
                continue
            findings.append(finding("gpu.correctness", s, PASS, f"GEMM results match a float64 reference ({checked})",
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
            findings.append(not_measured(ctx, "membw", "gpu.memory_bandwidth", s))
            continue
        ref = ctx.ref(gpu)
        spec = ref.number("mem_bandwidth_gbs") if ref else None
        words, status, expected, source = f"device copy {m.value:.0f} GB/s (read + write counted)", PASS, None, None
        if ref is not None and spec:
            share = m.value / spec
            status = PASS if share >= 0.75 else WARN if share >= 0.55 else FAIL
            words += f" = {100 * share:.0f}% of the {spec:g} GB/s spec"
            expected, source = f">= 75% of {spec:g} GB/s (healthy HBM/GDDR copies reach 80-92%)", ref.cite("mem_bandwidth_gbs")
        box, box_words = against_box(m.value, median, 0.90, 0.80)
        if box:
            words += f"; {box_words}"
        status = worst(status, box)
        findings.append(finding("gpu.memory_bandwidth", s, status, words, measured=f"{m.value:.0f} GB/s, {m.details.get('bytes_counted', '')}",
                                expected=expected, source=source,
                                remedy=None if status == PASS else "check clocks and throttling under load; rerun `gpuvet bench membw`"))
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
            findings.append(not_measured(ctx, "pcie", "gpu.pcie_bandwidth", s))
            continue
        h2d_pageable, d2h_pageable = one(ctx, "pcie.h2d_pageable", s), one(ctx, "pcie.d2h_pageable", s)
        measured_text = f"pinned H2D {h2d.value:.1f} / D2H {d2h.value:.1f} GB/s" + (
            f"; pageable {h2d_pageable.value:.1f} / {d2h_pageable.value:.1f}" if h2d_pageable and d2h_pageable else "")
        gen, width, under_load = _link_for_bandwidth(gpu)
        words, status, expected = f"H2D {h2d.value:.1f}, D2H {d2h.value:.1f} GB/s (pinned)", MEASURED, None
        source = "PCIe line rate per lane and generation (after encoding)"
        link, carry = _expected_link(gen, width, under_load, ctx.ref(gpu))
        if carry:
            share = min(h2d.value, d2h.value) / carry
            status = PASS if share >= 0.65 else WARN if share >= 0.40 else FAIL
            words += f" = {100 * share:.0f}% of what {link} carries (~{carry:.0f} GB/s)"
            expected = f">= 65% of ~{carry:.0f} GB/s (healthy links reach 80-90%)"
            ref = ctx.ref(gpu)
            if ref and "reference" in link:
                source += f"; the model's own link: {ref.cite('pcie_gen')} and pcie_lanes"
        for m in (h2d, d2h):
            box, box_words = against_box(m.value, medians[m.name], 0.85, 0.70)
            if box:
                words += f"; {m.name.split('.')[1].split('_')[0].upper()} {box_words}"
                status = worst(status if status != MEASURED else PASS, box)
        if status == MEASURED:
            words += ": no link width or model reference to judge it against"
        findings.append(finding(
            "gpu.pcie_bandwidth", s, status, words, measured=measured_text, expected=expected,
            source=source,
            remedy=None if status == PASS else
            "compare with gpu.pcie_link; a virtualised or oversubscribed link shows here: ask the provider; "
            "rerun `gpuvet bench pcie`"))
    return findings


def _expected_link(gen: int | None, width: int | None, under_load: bool, ref: Reference | None) -> tuple[str, float | None]:
    """What the link should carry: the link as read, or the model's own link (reference gen and
    lanes) when that is wider or faster. A link the slot or a virtualization layer cut to x8 is
    judged against what the card was built to move, so a halved link cannot pass at 90% of x8."""
    read = GBS_PER_LANE[gen] * width if gen in GBS_PER_LANE and width else None
    ref_gen, ref_lanes = (ref.number("pcie_gen"), ref.number("pcie_lanes")) if ref else (None, None)
    model = GBS_PER_LANE[int(ref_gen)] * ref_lanes if ref_gen and int(ref_gen) in GBS_PER_LANE and ref_lanes else None
    if ref is not None and ref_gen and ref_lanes and model and (read is None or model > read * 1.01):
        words = f"the {ref.id}'s own Gen{int(ref_gen)} x{int(ref_lanes)} link (reference)"
        if read:
            words += f"; the link as read, Gen{gen} x{width}, carries ~{read:.0f} GB/s"
        return words, model
    if read:
        return f"Gen{gen} x{width}" + (" as read under load" if under_load else ""), read
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


def check_context_init(ctx: Context) -> list[Finding]:
    if not planned(ctx, "latency"):
        return []
    found = [m for m in measured(ctx, "latency.context_init") if has_value(m)]
    if not found:
        return [not_measured(ctx, "latency", "gpu.context_init", "gpu0" if ctx.machine.gpus else "gpu")]
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
        findings.append(finding("gpu.context_init", m.subject, status, words,
                                measured=f"median {m.value:.0f} ms of {len(m.details.get('runs', [])) or '?'} fresh processes",
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
        findings.append(finding("gpu.kernel_launch", m.subject, status, f"{m.value:.1f} us per kernel launch",
                                measured=f"{m.value:.1f} us async, {m.details.get('sync_roundtrip_us', '?')} us with synchronize",
                                expected="<= 20 us",
                                source="gpuvet's own bound for the host time to queue one PyTorch add_ (dispatch "
                                "included); not SuperBench's A100 5.7 us, which is the GPU-side event time of an "
                                "empty CUDA kernel",
                                remedy=None if status == PASS else "a slow or oversubscribed host CPU, or vGPU: see host.steal"))
    return findings
