"""Monitoring loops as time series: `nvidia-smi --query-gpu=... --format=csv -l 5` (or `-lms 500`)
and `nvidia-smi dmon`.

Both print one row per GPU per sample. Read as snapshots, a loop of one GPU looks like many GPUs
(the `-l` loop) or only its last sample counts (dmon), and a GPU that heats up while its clock falls
looks fine. Here each GPU's rows become its samples, oldest first, with the same field names as
gpuvet's own telemetry (`telemetry.Sample`), so the judge reads a capture's trend the way it reads
a sustained load's.
"""

from __future__ import annotations

import math
from datetime import datetime

from .bounded_read import MAX_GPUS
from .values import MAX_DIGITS
from ..untrusted_text import quote
from .errors import CaptureError

# No machine has more GPUs than bounded_read allows; an index above that is damage (or hostile
# input), and it must not size anything (a dmon row "20000000 ..." once took 21 s and 820 MB).
MAX_GPU_INDEX = MAX_GPUS - 1
# NVML's "not available" sentinels when a tool prints the raw integer (INT_MAX, UINT_MAX).
_SENTINELS = {0x7FFFFFFF, 0xFFFFFFFF}

SAMPLE_FIELDS = ("t", "temp_c", "power_w", "power_limit_w", "sm_mhz", "mem_mhz", "util_pct", "mem_used_mib")


def gpu_index(raw: object, what: str) -> int:
    """A GPU index from a capture, bounded: one clear line for anything that is not one."""
    number = raw if isinstance(raw, (int, float)) else _number(str(raw))
    if number is None or not math.isfinite(number) or number != int(number) or not 0 <= number <= MAX_GPU_INDEX:
        raise CaptureError(f"{what}: GPU index {quote(str(raw), 20)} is not an index 0..{MAX_GPU_INDEX}; "
                           "the capture is damaged or not nvidia-smi output")
    return int(number)


def reading(raw: str | None) -> float | None:
    """A numeric reading ("87", "631.95 W", "1980 MHz") or None for what is not one: "-", "N/A",
    "[N/A]", nan, inf, or NVML's 0x7fffffff sentinel."""
    if raw is None:
        return None
    number = _number(raw.strip().split(" ", 1)[0])
    if number is None or not math.isfinite(number) or number in _SENTINELS:
        return None
    return number


def _number(token: str) -> float | None:
    token = token.strip()
    if len(token) > 2 * MAX_DIGITS:  # no reading is that long; int() refuses past 4300 digits
        return None
    try:
        return float(int(token, 16)) if token.lower().startswith("0x") else float(token)
    except ValueError:
        return None


# nvidia-smi's --query-gpu timestamp ("2026/07/14 08:12:53.353") and dmon -o DT's ("20260714 08:12:53").
_TIME_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y%m%d %H:%M:%S")


def timestamp(raw: str | None) -> float | None:
    """Seconds since the epoch of a loop's timestamp, None when it has none or it is not one."""
    if not raw:
        return None
    for form in _TIME_FORMATS:
        try:
            return datetime.strptime(raw.strip(), form).timestamp()
        except ValueError:
            continue
    return None


# A monitoring loop's samples kept per GPU: 2,000 are 2.8 hours of `-l 5`, more than a trend needs;
# a day of `-l 1` (86,400 rows) would make a record of tens of MB and minutes of judging.
MAX_SAMPLES = 2000


def thin(samples: list[dict], limit: int = MAX_SAMPLES) -> tuple[list[dict], str | None]:
    """At most about `limit` of `samples`, evenly spaced, the first and the last kept; and a note
    saying so (None when all were kept)."""
    if len(samples) <= limit:
        return samples, None
    step = -(-len(samples) // limit)
    kept = samples[::step]
    if kept[-1] is not samples[-1]:
        kept.append(samples[-1])
    return kept, f"{len(samples)} samples per GPU: every {step}th kept ({len(kept)}), evenly spaced"


def relative_times(samples: list[dict]) -> bool:
    """Make each sample's "t" seconds since the first one; False (and t None) when any sample has no time."""
    times = [s.get("t") for s in samples]
    if not samples or any(t is None for t in times):
        for s in samples:
            s["t"] = None
        return False
    t0 = times[0]
    for s in samples:
        s["t"] = round(s["t"] - t0, 3)
    return True
