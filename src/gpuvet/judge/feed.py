"""host.cpu_feed: can the CPU cores prepare images as fast as the GPUs train on them? (B9)

The seed's 4090 trained a third faster with 16 cores than with 8: the GPU had been waiting for
the DataLoader. `cpu.feed_rate` (bench/cpufeed.py) says how many ImageNet-style samples per
second the cores prepare; this rule compares it with how many images per second the GPUs of
this machine consume when training a reference model.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..catalog import checked
from ..facts import Gpu
from ..record import MEASURED, Finding, Measurement, Valued
from .bench_common import measured, one, planned
from .common import FAIL, PASS, SKIP, WARN, Context, finding, subject
from ..specs.cpu_share import LOW_CPU_SHARE

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
HOST_CPU_FEED = checked("host.cpu_feed")

# The reference model: ResNet-50 training at 224x224, the standard image-training workload.
# Its forward pass is 4.1 G multiply-adds (the "4.1 GFLOPs" usually quoted counts multiply-adds),
# so 8.2 GFLOP; the backward pass costs about twice the forward: 3 x 8.2 GFLOP per image.
REFERENCE_MODEL = "ResNet-50 training at 224x224"
TRAIN_GFLOP_PER_IMAGE = 3 * 2 * 4.1

# Share of a GPU's GEMM rate that ResNet-50 mixed-precision training turns into model FLOPs.
# NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5, 1 GPU, AMP (21.03 container):
# A100 80GB 2470 img/s = 61 TFLOPS = 20% of its 312 TFLOPS dense peak; V100 16GB 1200 img/s
# = 30 TFLOPS = 24% of 125. A healthy GPU's measured GEMM reaches ~85% of the dense peak, so
# about 25% of the measured rate. The estimate holds to about +-30%: big GPUs (H100 and up)
# spend more of a ResNet step on memory-bound layers and land lower.
SHARE_OF_MEASURED_GEMM = 0.25
GEMM_SHARE_OF_PEAK = 0.85
SHARE_OF_PEAK = SHARE_OF_MEASURED_GEMM * GEMM_SHARE_OF_PEAK
CALIBRATION = ("NVIDIA DeepLearningExamples PyTorch ResNet50 v1.5 AMP, 1 GPU: A100 80GB 2470 img/s, "
               "V100 16GB 1200 img/s")

# Dtypes training runs on, best first: measurement name suffix -> reference column.
DTYPE_PEAK_COLUMN = {"bf16": "bf16_tensor_tflops_dense", "fp16": "fp16_tensor_tflops_dense",
                     "tf32": "tf32_tensor_tflops_dense", "fp32": "fp32_tflops"}

# Below the GPUs' rate the GPUs wait for data; below a third of it they idle two thirds of the
# time (the seed's 8-core 4090 sat near two thirds of what it needed).
WARN_BELOW = 1.0
FAIL_BELOW = 1 / 3

REMEDY = ("give the input pipeline more cores: DataLoader(num_workers=<cores - 1>, pin_memory=True, "
          "persistent_workers=True), or rent more vCPUs per GPU; or take decoding off the CPU: NVIDIA DALI "
          "(JPEG decoding on the GPU), pre-decoded and pre-resized data (WebDataset shards of decoded tensors, FFCV), "
          "Pillow-SIMD. Confirm with `nvidia-smi dmon -s u` while training: GPU utilization dips while the CPU is at 100%.")


@dataclass
class Demand:
    """How many reference-model images per second one GPU trains on, and from what figure."""

    gpu: str
    images_per_s: float
    basis: str


def check_cpu_feed(ctx: Context) -> list[Finding]:
    if not planned(ctx, "cpu"):
        return []
    feed = one(ctx, "cpu.feed_rate", "cpu")
    if feed is None:
        return [_not_measured(ctx)]
    cpu_text = _describe_feed(feed)
    caveat = _contention_caveat(feed)
    if not ctx.machine.gpus:
        return [finding(HOST_CPU_FEED, "host", MEASURED,
                        f"the CPU prepares {feed.value:,.0f} images/s (no GPU here to feed){caveat}", measured=cpu_text)]
    demands = [d for d in (gpu_demand(ctx, gpu) for gpu in ctx.machine.gpus) if d is not None]
    if not demands:
        names = ", ".join(sorted({g.name or "unknown GPU" for g in ctx.machine.gpus}))
        return [finding(HOST_CPU_FEED, "host", SKIP,
                        f"the CPU prepares {feed.value:,.0f} images/s; what the GPUs consume is unknown: no GEMM "
                        f"measurement and no reference figure for {names}", measured=cpu_text,
                        remedy="run `gpuvet bench gemm cpu` to measure both")]
    return [_compare(feed, demands, len(ctx.machine.gpus), cpu_text, caveat)]


def _compare(feed: Valued, demands: list[Demand], gpu_count: int, cpu_text: str, caveat: str) -> Finding:
    need = sum(d.images_per_s for d in demands)
    ratio = feed.value / need
    gpus = "the GPU" if len(demands) == 1 else f"the {len(demands)} GPUs"
    if len(demands) < gpu_count:
        gpus += f" with a figure (of {gpu_count}; the others are not counted)"
    measured_text = f"{cpu_text}; GPU demand: {_describe_demands(demands)}"
    expected = f">= ~{need:,.0f} images/s, what {gpus} can train on ({REFERENCE_MODEL})"
    source = (f"gpuvet estimate: {REFERENCE_MODEL} = {TRAIN_GFLOP_PER_IMAGE:.1f} GFLOP per image at "
              f"{100 * SHARE_OF_MEASURED_GEMM:.0f}% of the measured bf16/fp16 GEMM rate "
              f"({100 * SHARE_OF_PEAK:.0f}% of the dense peak when not measured), +-30%; calibrated on {CALIBRATION}; "
              "seed: 8 -> 16 cores cut a 4090's training time by a third")
    if ratio < WARN_BELOW:
        status = FAIL if ratio < FAIL_BELOW else WARN
        summary = (f"input-bound: the CPU prepares {feed.value:,.0f} images/s, {gpus} can train on ~{need:,.0f} images/s "
                   f"({REFERENCE_MODEL}): the GPUs would wait {100 * (1 - ratio):.0f}% of the time on JPEG data; "
                   f"use more cores or pre-decoded data (DALI, WebDataset of decoded tensors){caveat}")
        return finding(HOST_CPU_FEED, "host", status, summary, measured=measured_text, expected=expected,
                       source=source, remedy=REMEDY)
    summary = (f"the CPU prepares {feed.value:,.0f} images/s, {ratio:.1f}x the ~{need:,.0f} images/s {gpus} "
               f"can train on ({REFERENCE_MODEL}){caveat}")
    return finding(HOST_CPU_FEED, "host", PASS, summary, measured=measured_text, expected=expected, source=source)


def _describe_demands(demands: list[Demand]) -> str:
    """GPUs with the same figure from the same basis on one line (eight identical cards, one line)."""
    groups: dict[tuple[float, str], list[str]] = {}
    for d in demands:
        groups.setdefault((round(d.images_per_s), d.basis), []).append(d.gpu)
    return "; ".join(f"{', '.join(gpus)} ~{rate:,.0f} images/s{' each' if len(gpus) > 1 else ''} from {basis}"
                     for (rate, basis), gpus in groups.items())


def gpu_demand(ctx: Context, gpu: Gpu) -> Demand | None:
    """Images/s of the reference model this GPU trains on: from its measured GEMM rate, else
    from its reference dense peak; None when neither is known."""
    s = subject(gpu)
    gemm = _measured_gemm(ctx, s)
    if gemm is not None:
        dtype, tflops = gemm
        return Demand(s, _images_per_s(tflops, SHARE_OF_MEASURED_GEMM), f"measured {dtype} GEMM {tflops:.1f} TFLOPS")
    ref = ctx.ref(gpu)
    if ref is None:
        return None
    for dtype, column in DTYPE_PEAK_COLUMN.items():
        peak = ref.number(column)
        if peak:
            share, slice_note = _mig_share(gpu, ref.number("sm_count"))
            return Demand(s, _images_per_s(peak * share, SHARE_OF_PEAK),
                          f"{ref.id} {dtype} dense peak {peak:g} TFLOPS{slice_note} (not measured)")
    return None


def _measured_gemm(ctx: Context, s: str) -> tuple[str, float] | None:
    rates = {m.name.removeprefix("gemm."): m.value for m in ctx.measurements
             if m.subject == s and m.name.startswith("gemm.") and m.unit == "TFLOPS" and m.value}
    dtype = next((d for d in DTYPE_PEAK_COLUMN if d in rates), None)
    return (dtype, rates[dtype]) if dtype else None


def _mig_share(gpu: Gpu, reference_sms: float | None) -> tuple[float, str]:
    """The share of the whole GPU that its MIG instances hold (1.0 without MIG)."""
    if not gpu.mig_enabled or not gpu.mig_devices or not reference_sms:
        return 1.0, ""
    sms = sum(m.sm_count or 0 for m in gpu.mig_devices)
    if not sms:
        return 1.0, ""
    share = min(1.0, sms / reference_sms)
    return share, f" x {100 * share:.0f}% (MIG instances hold {sms} of {reference_sms:.0f} SMs)"


def _images_per_s(tflops: float, share: float) -> float:
    return tflops * 1e12 * share / (TRAIN_GFLOP_PER_IMAGE * 1e9)


def _describe_feed(feed: Measurement) -> str:
    d = feed.details
    per_worker = d.get("per_worker") or []
    image = d.get("image") or {}
    parts = [f"cpu.feed_rate {feed.value:,.0f} samples/s on {d.get('workers', '?')} worker processes"]
    if per_worker:
        parts.append(f"{statistics.median(per_worker):.0f}/s per worker (median)")
    if image:
        parts.append(f"{image.get('width')}x{image.get('height')} JPEGs of ~{(image.get('jpeg_bytes_mean') or 0) / 1000:.0f} kB "
                     "-> RandomResizedCrop 224, flip, normalize")
    tensor = (d.get("libraries") or {}).get("tensor")
    if tensor:
        parts.append(f"tensors by {tensor}")
    if d.get("cpu_share") is not None:
        parts.append(f"workers got {100 * d['cpu_share']:.0f}% of a core each")
    return ", ".join(parts)


def _contention_caveat(feed: Measurement) -> str:
    share = feed.details.get("cpu_share")
    if share is None or share >= LOW_CPU_SHARE:
        return ""
    alone = feed.details.get("uncontended_rate")
    more = f": with a core each to themselves they would prepare ~{alone:,.0f} images/s" if alone else ""
    return (f" (the workers got only {100 * share:.0f}% of their cores' time, other load or the hypervisor shared "
            f"them{more})")


def _not_measured(ctx: Context) -> Finding:
    notes = measured(ctx, "bench.cpu")
    if not notes:
        return finding(HOST_CPU_FEED, "host", SKIP, "the CPU feed rate was not measured")
    reason = notes[0].details.get("reason", "no reason given")
    if notes[0].details.get("outcome") == "failed":
        return finding(HOST_CPU_FEED, "host", SKIP, f"the CPU feed benchmark could not run: {reason}",
                       remedy="rerun `gpuvet bench cpu`; if it fails again, please report it with the reason")
    return finding(HOST_CPU_FEED, "host", SKIP, reason)
