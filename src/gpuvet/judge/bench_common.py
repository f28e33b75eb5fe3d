"""What the benchmark rules share: finding measurements, explaining ones that are missing,
and comparing a GPU with the others in the same box."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ..facts import Gpu
from ..record import Finding, Measurement, Valued, has_value
from ..specs.reference import Reference
from .common import FAIL, SKIP, Context, finding

# A failure reason that points at the machine (a hang, a CUDA or NCCL error), not at gpuvet.
_MACHINE_TROUBLE = ("CUDA", "NCCL", "hung", "no answer", "died", "ECC", "Xid", "illegal memory", "timed out", "did not finish")


def planned(ctx: Context, bench: str) -> bool:
    return bench in (ctx.options.get("benchmarks") or [])


def measured(ctx: Context, name: str, subject: str | None = None) -> list[Measurement]:
    return [m for m in ctx.measurements if m.name == name and (subject is None or m.subject == subject)]


def one(ctx: Context, name: str, subject: str) -> Valued | None:
    """The first measurement of `name` on `subject` that has a figure."""
    return next((m for m in measured(ctx, name, subject) if has_value(m)), None)


def not_measured(ctx: Context, bench: str, check: str, subject: str) -> Finding:
    """Why a planned benchmark gave nothing for `subject`: skipped (does not apply) or failed."""
    notes = [m for m in measured(ctx, f"bench.{bench}") if m.subject in (subject, "gpu", "machine")]
    note = next((m for m in notes if m.subject == subject), notes[0] if notes else None)
    if note is None:
        return finding(check, subject, SKIP, f"{bench} was not measured")
    reason = note.details.get("reason", "no reason given")
    if note.details.get("outcome") == "failed" and any(word in reason for word in _MACHINE_TROUBLE):
        return finding(check, subject, FAIL, f"the {bench} benchmark failed: {reason}",
                       remedy=f"`nvidia-smi -q -i {subject.removeprefix('gpu')} -d PERFORMANCE,ECC`; `sudo dmesg | grep -i xid`; "
                              "rerun `gpuvet bench " + bench + "`")
    if note.details.get("outcome") == "failed":
        return finding(check, subject, SKIP, f"the {bench} benchmark could not run: {reason}")
    return finding(check, subject, SKIP, reason)


def box_median(ctx: Context, name: str) -> float | None:
    """The median of a measurement over the GPUs of this machine (None with fewer than two)."""
    values = [m.value for m in measured(ctx, name) if has_value(m) and m.subject.startswith("gpu")]
    return statistics.median(values) if len(values) >= 2 else None


def against_box(value: float, median: float | None, warn_below: float, fail_below: float) -> tuple[str | None, str]:
    """Status and words for a GPU compared with the box median (None: in line with the others)."""
    if median is None or median <= 0:
        return None, ""
    share = value / median
    words = f"{100 * share:.0f}% of the median of this machine's GPUs ({median:.4g})"
    if share < fail_below:
        return FAIL, words
    if share < warn_below:
        return "warn", words
    return None, words


def worst(*statuses: str | None) -> str:
    order = {"fail": 3, "warn": 2, "pass": 1, "measured": 0, "skip": 0}
    present = [s for s in statuses if s]
    return max(present, key=lambda s: order[s]) if present else "pass"


MIG_MEMORY_SLICES = 8  # A100/H100/H200/B200 split their memory (and its bandwidth) in eighths


@dataclass(frozen=True)
class MigSlice:
    """The share of the whole GPU a MIG slice holds: compute by its SMs, memory bandwidth by its
    memory slices; None where it cannot be told (the slice is then judged as measured)."""

    compute: float | None
    memory: float | None
    words: str


def mig_slice(gpu: Gpu, ref: Reference | None, details: dict[str, Any]) -> MigSlice | None:
    """None on a whole GPU. The benchmark records the CUDA device's SMs and memory (details
    "device"); an older record falls back to the GPU's MIG devices when they are all one size."""
    if not gpu.mig_enabled:
        return None
    recorded = details.get("device")
    device: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    sizes = {(m.sm_count, m.memory_total_mib) for m in gpu.mig_devices}
    only = next(iter(sizes)) if len(sizes) == 1 else (None, None)
    sms, memory_mib = device.get("sm_count") or only[0], device.get("memory_total_mib") or only[1]
    whole_sms = ref.number("sm_count") if ref else None
    compute = min(1.0, sms / whole_sms) if sms and whole_sms else None
    memory = None
    if memory_mib and gpu.memory_total_mib:
        eighths = max(1, min(MIG_MEMORY_SLICES, round(MIG_MEMORY_SLICES * memory_mib / gpu.memory_total_mib)))
        memory = eighths / MIG_MEMORY_SLICES
    if compute is None:
        return MigSlice(None, memory, "a MIG slice of unknown size (several sizes on this GPU, the benchmark did not "
                                      "record its device's SMs): judged as measured")
    words = f"a MIG slice of {sms} of {whole_sms:.0f} SMs"
    if memory is not None:
        words += f" and {memory * MIG_MEMORY_SLICES:.0f}/{MIG_MEMORY_SLICES} of the memory"
    return MigSlice(compute, memory, words)
