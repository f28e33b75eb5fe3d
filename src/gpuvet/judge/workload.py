"""workload.*: the reference training run (B10) judged: throughput and MFU, the checkpoint path's
write and read, and whether training resumed from the same state in a fresh process."""

from __future__ import annotations

import os
from typing import Any

from ..catalog import checked
from ..facts import Gpu
from ..record import MEASURED, Finding, Measurement
from .bench_common import measured, not_measured, one, planned, worst
from .common import FAIL, PASS, SKIP, WARN, Context, finding, subject as gpu_subject

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
WORKLOAD_CHECKPOINT = checked("workload.checkpoint")
WORKLOAD_RESUME = checked("workload.resume")
WORKLOAD_THROUGHPUT = checked("workload.throughput")

BENCH = "workload"
PEAK_COLUMN = {"bfloat16": "bf16_tensor_tflops_dense", "float16": "fp16_tensor_tflops_dense"}
GEMM_NAME = {"bfloat16": "gemm.bf16", "float16": "gemm.fp16", "float32": "gemm.fp32"}

# Throughput of the default (GPT-2-small-shaped) model, judged loosely: it is a smoke test of the
# whole stack, the GEMM benchmark judges the GPU itself. Such a model in an eager, uncompiled
# PyTorch loop spends a large share of each step outside big matmuls (layernorm, softmax, AdamW,
# kernel launches); compiled and fused, runs of this size are reported at 30-60% MFU. gpuvet
# expects at least MFU_WARN_PCT of the dense peak and, where the GEMM benchmark ran, model
# FLOP/s of at least GEMM_SHARE_WARN of the GEMM rate this GPU proved it can reach. These are
# gpuvet's estimates for an eager loop, not published baselines: a shortfall is a warning.
MFU_WARN_PCT = 15.0
GEMM_SHARE_WARN = 0.25
# Step times on a GPU are steady; a slow tail means something else takes turns on the GPU or
# the CPU stalls feeding it.
SPREAD_WARN = 1.5  # p90 / median

# Checkpoint storage. Below a single hard disk's sequential rate, saving a real model's
# checkpoint takes minutes. A small checkpoint measures fsync latency, not throughput.
CHECKPOINT_WARN_MBS = 100.0
CHECKPOINT_JUDGE_MIN_BYTES = 256 * 10**6
EXAMPLE_CHECKPOINT_GB = 12  # a 1B-parameter model with fp32 weights and AdamW's two moments
PATH_REMEDY = ("pick a persistent, writable path with room for your checkpoints and rerun "
               "`gpuvet workload --path DIR`; check it with `df -hT DIR` and `ls -ld DIR`")


def check_workload(ctx: Context) -> list[Finding]:
    """All three workload checks (or register check_throughput, check_checkpoint, check_resume)."""
    return check_throughput(ctx) + check_checkpoint(ctx) + check_resume(ctx)


def check_throughput(ctx: Context) -> list[Finding]:
    return [_throughput(ctx, s) for s in _subjects(ctx)] if planned(ctx, BENCH) else []


def check_checkpoint(ctx: Context) -> list[Finding]:
    return [_checkpoint(ctx, s) for s in _subjects(ctx)] if planned(ctx, BENCH) else []


def check_resume(ctx: Context) -> list[Finding]:
    return [_resume(ctx, s) for s in _subjects(ctx)] if planned(ctx, BENCH) else []


def _subjects(ctx: Context) -> list[str]:
    """The subjects the workload ran on; or the one it should have run on, to say why it did not."""
    found = sorted({m.subject for m in ctx.measurements if m.name.startswith("workload.")})
    if found:
        return found
    return ["cpu" if ctx.options.get("device") == "cpu" or not ctx.machine.gpus else "gpu0"]


def _first(ctx: Context, name: str, subject: str) -> Measurement | None:
    """The measurement, even without a value (a failed step records why in its details)."""
    found = measured(ctx, name, subject)
    return found[0] if found else None


def _gpu(ctx: Context, subject: str) -> Gpu | None:
    return next((g for g in ctx.machine.gpus if gpu_subject(g) == subject), None)


# -- workload.throughput -----------------------------------------------------------------------

def _throughput(ctx: Context, subject: str) -> Finding:
    check = WORKLOAD_THROUGHPUT
    tps = one(ctx, "workload.tokens_per_s", subject)
    if tps is None:
        return not_measured(ctx, BENCH, check, subject)
    d = tps.details
    step = one(ctx, "workload.step_time_ms", subject)
    words = f"{tps.value:,.0f} tokens/s"
    measured_text = (f"{tps.value:,.0f} tokens/s over {d.get('timed_steps', '?')} timed steps, "
                     f"{d.get('dtype', '?')}, shape {d.get('shape')}")
    if step is not None:
        words += f", {step.value:.1f} ms per step"
        measured_text += f"; step median {step.value:.1f} ms (p10 {step.details.get('p10')}, p90 {step.details.get('p90')})"
    if d.get("loss_first") is not None:
        measured_text += f"; loss {d['loss_first']} -> {d.get('loss_last')}"
    if d.get("stopped_early"):
        words += f" ({d['stopped_early']})"
    if d.get("nonfinite_losses"):
        return _nonfinite_loss(subject, d, words, measured_text)
    if subject == "cpu" or not subject.startswith("gpu"):
        return finding(check, subject, MEASURED, words + " (on the CPU: no reference to judge against)", measured=measured_text)
    statuses, expected, sources = [PASS], [], []
    # Without a warm-up step the timed steps include CUDA's start-up (cuBLAS handles, kernels loaded on
    # first use, the allocator growing): figures reported, not judged.
    judged_shape = d.get("default_shape") and d.get("warmup_steps") != 0
    peak, peak_source = _peak(ctx, subject, d.get("dtype"))
    model_tflops = d.get("model_tflops")
    if peak and model_tflops is not None:
        mfu = 100.0 * model_tflops / peak
        words += f", MFU {mfu:.1f}% of the {peak:g} TFLOPS dense peak"
        measured_text += f"; {model_tflops:.1f} model TFLOPS ({d.get('flops_formula', '6N + attention')})"
        if judged_shape:
            statuses.append(PASS if mfu >= MFU_WARN_PCT else WARN)
            expected.append(f"MFU >= {MFU_WARN_PCT:g}% for the default model in an eager PyTorch loop")
            sources += [peak_source,
                        "gpuvet estimate for an eager loop of a GPT-2-small-shaped model (compiled runs reach 30-60%)"]
    elif not peak:
        words += " (no dense peak known for this GPU: MFU not computed)"
    gemm = one(ctx, GEMM_NAME.get(d.get("dtype") or "", ""), subject)
    if gemm is not None and gemm.value and model_tflops is not None and judged_shape:
        share = model_tflops / gemm.value
        words += f", {100 * share:.0f}% of the {gemm.value:.0f} TFLOPS this GPU reached in GEMMs"
        statuses.append(PASS if share >= GEMM_SHARE_WARN else WARN)
        expected.append(f">= {100 * GEMM_SHARE_WARN:.0f}% of the measured GEMM rate")
    if not d.get("default_shape"):
        words += " (a custom model shape: figures reported, not judged)"
    elif d.get("warmup_steps") == 0:
        words += " (too few steps for a warm-up: the first step, with CUDA's start-up, is timed; not judged)"
    if step is not None and step.value and step.details.get("p90"):
        spread = step.details["p90"] / step.value
        if spread > SPREAD_WARN:
            words += f"; slow steps: p90 is {spread:.1f}x the median"
            statuses.append(WARN)
            expected.append(f"p90 step time <= {SPREAD_WARN:g}x the median")
    status = worst(*statuses)
    if status == PASS and not expected:  # no peak, a custom shape or no warm-up: nothing was judged
        status = MEASURED
    return finding(check, subject, status, words, measured=measured_text,
                   expected="; ".join(expected) or None, source="; ".join(s for s in sources if s) or None,
                   remedy=None if status in (PASS, MEASURED) else
                   "look at gpu.gemm, gpu.throttle, host.cpu and host.steal; watch `nvidia-smi dmon -s pucv` while "
                   "`gpuvet workload --steps 500` runs: low SM use with a busy CPU means the GPU is not fed")


def _nonfinite_loss(subject: str, d: dict[str, Any], words: str, measured_text: str) -> Finding:
    steps = d.get("timed_steps", 0) + d.get("warmup_steps", 0)
    return finding(WORKLOAD_THROUGHPUT, subject, FAIL, f"the training loss was NaN or inf at {d['nonfinite_losses']} of "
                   f"{steps} steps ({words})", measured=measured_text,
                   expected="a finite loss at every step: the model is small, its gradients clipped, its "
                            "compute in bf16 (or fp16 with loss scaling)",
                   source="gpuvet: the reference workload trains without NaN on a healthy GPU",
                   remedy="look at gpu.correctness and gpu.ecc; rerun `gpuvet workload`; if it repeats with another "
                          "torch build too, report the GPU to the provider")


def _peak(ctx: Context, subject: str, dtype: str | None) -> tuple[float | None, str | None]:
    """The dense peak the MFU is computed against: the one the benchmark used, else the reference."""
    mfu = one(ctx, "workload.mfu", subject)
    if mfu is not None and mfu.details.get("peak_tflops"):
        return float(mfu.details["peak_tflops"]), "dense peak passed to the benchmark (gpuvet reference data)"
    gpu = _gpu(ctx, subject)
    ref = ctx.ref(gpu) if gpu else None
    column = PEAK_COLUMN.get(dtype or "")
    if ref is None or column is None or not ref.number(column):
        return None, None
    return ref.number(column), ref.cite(column)


# -- workload.checkpoint -----------------------------------------------------------------------

def _checkpoint(ctx: Context, subject: str) -> Finding:
    check = WORKLOAD_CHECKPOINT
    write, read = _first(ctx, "workload.checkpoint_write", subject), _first(ctx, "workload.checkpoint_read", subject)
    if write is None:
        return not_measured(ctx, BENCH, check, subject)
    path = write.details.get("path", "?")
    if write.value is None:
        return finding(check, subject, FAIL, f"could not write a checkpoint: {write.details.get('reason', 'no reason given')}",
                       measured=f"write to {path} failed ({write.details.get('errno', '?')})",
                       expected="a writable directory with room for the checkpoint", remedy=PATH_REMEDY)
    if read is not None and read.value is None and read.details.get("stage") == "read":
        return finding(check, subject, FAIL, f"wrote a checkpoint, but {read.details.get('reason')}",
                       measured=f"write {write.value:.0f} MB/s to {path}; read failed",
                       expected="a fresh process reads back what was written", remedy=PATH_REMEDY)
    if read is not None and read.details.get("checksum_match") is False:
        return finding(check, subject, FAIL, f"the checkpoint read back from {path} differs from what was written: "
                       "the storage corrupts data", measured=f"CRC32 mismatch on {read.details.get('bytes')} bytes",
                       expected="the same bytes back", remedy="do not keep checkpoints there; " + PATH_REMEDY +
                       "; report it to the provider")
    return _checkpoint_speed(ctx, subject, write, read)


def _checkpoint_speed(ctx: Context, subject: str, write: Measurement, read: Measurement | None) -> Finding:
    check, path, size = WORKLOAD_CHECKPOINT, write.details.get("path", "?"), write.details.get("bytes") or 0
    words = f"checkpoint of {size / 1e6:.0f} MB to {path}: write {write.value:.0f} MB/s (with fsync)"
    if read is not None and read.value is not None:
        words += f", read {read.value:.0f} MB/s by a fresh process"
    elif read is not None:
        words += f"; read {read.details.get('reason', 'not measured')}"
    rates = [m.value for m in (write, read) if m is not None and m.value]
    statuses, expected = [PASS], None
    if size >= CHECKPOINT_JUDGE_MIN_BYTES and rates:
        slowest = min(rates)
        words += (f"; {EXAMPLE_CHECKPOINT_GB} GB (a 1B-parameter model with AdamW state) would take "
                  f"~{EXAMPLE_CHECKPOINT_GB * 1000 / slowest:.0f} s")
        statuses.append(PASS if slowest >= CHECKPOINT_WARN_MBS else WARN)
        expected = f">= {CHECKPOINT_WARN_MBS:g} MB/s both ways (a single hard disk's sequential rate; local NVMe does GB/s)"
    else:
        words += " (too small a checkpoint to judge the storage's throughput: fsync latency dominates)"
    ephemeral = _ephemeral_workdir(ctx, write)
    if ephemeral:
        words += f"; {ephemeral}"
        statuses.append(WARN)
    status = worst(*statuses)
    if status == PASS and expected is None:  # too small to judge, and nothing else found
        status = MEASURED
    cache = ("page cache dropped before the read" if write.details.get("cache_dropped")
             else "the read may have come from the page cache")
    return finding(check, subject, status, words,
                   measured=f"{size} bytes; write {write.details.get('seconds')} s; {cache}",
                   expected=expected, source="gpuvet rule of thumb" if expected else None,
                   remedy=None if status in (PASS, MEASURED) else PATH_REMEDY)


def _ephemeral_workdir(ctx: Context, write: Measurement) -> str | None:
    """Why a checkpoint in the working directory would be lost, if the facts say it would."""
    host = ctx.machine.host
    workdir = host.workdir if host else None
    if workdir is None:
        return None
    path = write.details.get("path")
    same = not write.details.get("path_given") or (
        path and workdir.path and os.path.normpath(path) == os.path.normpath(workdir.path))
    if not same:
        return None
    if workdir.kind == "overlay":
        return "the working directory is the container's writable layer (overlay): checkpoints vanish with the container"
    if workdir.kind == "tmpfs":
        return "the working directory is RAM-backed tmpfs: checkpoints vanish at reboot"
    if workdir.ephemeral:
        why = workdir.ephemeral_reason or "wiped when the instance stops"
        return f"the working directory is ephemeral instance storage ({why})"
    return None


# -- workload.resume ---------------------------------------------------------------------------

def _resume(ctx: Context, subject: str) -> Finding:
    check = WORKLOAD_RESUME
    m = _first(ctx, "workload.resume_ok", subject)
    if m is None:
        return not_measured(ctx, BENCH, check, subject)
    d = m.details
    if m.value is None:
        reason = d.get("reason", "not verified")
        # Not tried or not read back: the checkpoint's own finding says why; otherwise the reason is whole.
        see = "" if d.get("stage") in ("device", "train", "reference") else " (see workload.checkpoint)"
        return finding(check, subject, SKIP, reason + see)
    compared = _compared(d) if "losses_resumed" in d else d.get("reason")
    expected = _expected(d)
    if m.value >= 1:
        return finding(check, subject, PASS, f"a fresh process restored the checkpoint and training continued from the "
                       f"same state ({d.get('steps', '?')} steps compared)", measured=compared, expected=expected,
                       source="gpuvet reference workload: the resumed run against the same state restored in this process")
    failed_in = d.get("failed_in") or []
    if "this process" in failed_in:
        remedy = ("the state restored in this process from the same bytes drifted too: check gpu.correctness and "
                  "gpu.ecc; your own training script needs the same: restore model, optimizer, step, RNG states and "
                  "data position")
    else:
        remedy = ("rerun `gpuvet workload --path DIR`, and once with `--path /tmp` to tell the storage from the GPU; "
                  "check gpu.correctness and gpu.ecc; your own training script needs the same: restore model, "
                  "optimizer, step, RNG states and data position")
    prefix = "training did not continue from the same state: "
    reason = d.get("reason") or "no reason given"
    reason = reason[len(prefix):] if reason.startswith(prefix) else reason  # said once, not twice
    return finding(check, subject, FAIL, prefix + reason,
                   measured=compared, expected=expected,
                   source="gpuvet: the resumed steps against the same steps taken without interruption", remedy=remedy)


def _number(value, spec: str = ".2e") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "n/a"


def _compared(d: dict) -> str:
    text = (f"{d.get('steps', '?')} steps from step {d.get('from_step', '?')}: losses {d.get('losses_uninterrupted')} "
            f"uninterrupted vs {d.get('losses_resumed')} resumed (max relative difference {_number(d.get('max_rel_diff'))}); "
            f"weight update differs by {_number(d.get('update_rel_diff'))}")
    noise = d.get("noise")
    if noise:
        text += (f"; restored again in the training process: update differs by {_number(noise.get('update'))}, "
                 f"losses by {_number(noise.get('loss'))} (this device's run-to-run noise)")
    elif d.get("noise_not_measured"):
        text += f"; run-to-run noise not measured ({d['noise_not_measured']})"
    return text


def _expected(d: dict) -> str:
    rtol = d.get("rtol")
    if not rtol:
        return "the same losses and update"
    text = f"equal within {rtol} (relative)"
    if d.get("noise_factor") and d.get("rtol_max") and d.get("rtol_floor") and d["rtol_max"] != d["rtol_floor"]:
        text += (f": {d['noise_factor']:g}x the run-to-run noise, at least {d['rtol_floor']}, at most {d['rtol_max']} "
                 "(a wrong RNG state or data position moves the update more)")
    return text
