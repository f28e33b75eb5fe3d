"""Reading the values nvidia-smi prints: "320.00 W", "16x", "[N/A]", "Not Active"...

Shared by every capture parser so that "N/A" means the same thing everywhere.
"""

from __future__ import annotations

import re

# What nvidia-smi prints instead of a value, and the reason we keep for it.
_NOT_AVAILABLE = {
    "n/a": "nvidia-smi reported N/A",
    "[n/a]": "nvidia-smi reported N/A",
    "not available": "nvidia-smi reported not available",
    "[not supported]": "not supported on this GPU or driver",
    "not supported": "not supported on this GPU or driver",
    "requested functionality has been deprecated": "deprecated by this driver",
    "[requested functionality has been deprecated]": "deprecated by this driver",
    "[insufficient permissions]": "insufficient permissions",
    "insufficient permissions": "insufficient permissions",
    "[unknown error]": "nvidia-smi reported an unknown error",
    "unknown error": "nvidia-smi reported an unknown error",
    "not found": "nvidia-smi reported not found",
    "[gpu requires reset]": "GPU requires reset",
    "none": "none",
    "": "empty in capture",
}

_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
# No reading nvidia-smi prints has more digits than this (a 64-bit counter has 20); a longer run
# is damage or hostile input. int() refuses past 4300 digits and a float of it is inf: it is no
# value, so every capture reads its numbers through whole() and number().
MAX_DIGITS = 24


def whole(digits: str | None) -> int | None:
    """The integer a run of ASCII digits ("0", "81559") stands for; None for anything else or for
    more than MAX_DIGITS digits."""
    if digits is None:
        return None
    digits = digits.strip()
    if not digits or len(digits) > MAX_DIGITS or not digits.isascii() or not digits.isdigit():
        return None
    return int(digits)


def missing_reason(raw: str | None) -> str | None:
    """Why `raw` is not a value, or None when it is one."""
    if raw is None:
        return "not in capture"
    return _NOT_AVAILABLE.get(raw.strip().lower())


# The longest text nvidia-smi prints for one value is a process's path; a GPU name is under 40
# characters. A value of 10,000 characters (a damaged or hostile capture) made a 10 KB line in
# every report: it is cut here, saying so.
MAX_TEXT = 300


def cut(raw: str) -> str:
    """`raw` (a name, a path) at most MAX_TEXT characters, saying how many more there were."""
    return f"{raw[:MAX_TEXT]}... ({len(raw) - MAX_TEXT} more characters)" if len(raw) > MAX_TEXT else raw


def text(raw: str | None) -> str | None:
    if raw is None:
        return None
    raw = raw.strip()
    return None if missing_reason(raw) and raw.lower() != "none" else cut(raw)


def cuda_version(raw: str | None) -> str | None:
    """ "12.4" as a report prints the CUDA version; None for "N/A" or anything not MAJOR.MINOR."""
    value = text(raw)
    return value if value and re.fullmatch(r"\d+\.\d+", value) else None


def number(raw: str | None) -> float | None:
    """The first number in "320.00 W", "16x", "27 C", "0x9" -> None (hex is not a measure)."""
    if raw is None or missing_reason(raw):
        return None
    m = _NUMBER.search(raw)
    if not m or len(m.group()) > 2 * MAX_DIGITS:
        return None
    return float(m.group())


def integer(raw: str | None) -> int | None:
    value = number(raw)
    return None if value is None else int(round(value))


def hex_or_int(raw: str | None) -> int | None:
    if raw is None or missing_reason(raw):
        return None
    raw = raw.strip()
    if len(raw) > MAX_DIGITS:
        return None
    try:
        return int(raw, 16) if raw.lower().startswith("0x") else int(raw)
    except ValueError:
        return None


def mib(raw: str | None) -> int | None:
    """Memory in MiB from "81559 MiB" (also accepts GiB/KiB units)."""
    value = number(raw)
    if raw is None or value is None:
        return None
    unit = raw.strip().lower()
    if unit.endswith("gib") or unit.endswith("gb"):
        value *= 1024
    elif unit.endswith("kib") or unit.endswith("kb"):
        value /= 1024
    return int(round(value))


def flag(raw: str | None) -> bool | None:
    """Enabled/Disabled, Yes/No, Active/Not Active, On/Off -> True/False."""
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in ("enabled", "yes", "active", "on", "true", "supported"):
        return True
    if value in ("disabled", "no", "not active", "off", "false", "not supported", "none"):
        return False
    return None


def pstate(raw: str | None) -> int | None:
    """ "P0" -> 0; "P8" -> 8."""
    if raw is None:
        return None
    m = re.fullmatch(r"\s*P(\d{1,2})\s*", raw)
    return int(m.group(1)) if m else None


def virtualization_mode(raw: str | None) -> str | None:
    """nvidia-smi's "Pass-Through", "VGPU", "Host VGPU"... -> none/passthrough/vgpu/host_vgpu/host_vsga."""
    if raw is None or (missing_reason(raw) and raw.strip().lower() != "none"):
        return None
    key = re.sub(r"[^a-z]", "", raw.lower())
    return {
        "none": "none",
        "passthrough": "passthrough",
        "vgpu": "vgpu",
        "hostvgpu": "host_vgpu",
        "hostvsga": "host_vsga",
    }.get(key, raw.strip().lower())


def bus_id(raw: str | None) -> str | None:
    """Normalise "00000000:01:00.0" (NVML) or "01:00.0" (lspci) to sysfs form "0000:01:00.0"."""
    if raw is None:
        return None
    m = re.search(r"(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", raw)
    if not m:
        return None
    domain = (m.group(1) or "0000")[-4:]
    return f"{domain}:{m.group(2)}:{m.group(3)}.{m.group(4)}".lower()


def pcie_gen_from_speed(gts: float | None) -> int | None:
    """PCIe generation from the transfer rate in GT/s (2.5 -> 1 ... 64 -> 6)."""
    if gts is None:
        return None
    for gen, rate in ((1, 2.5), (2, 5.0), (3, 8.0), (4, 16.0), (5, 32.0), (6, 64.0)):
        if abs(gts - rate) < 0.3:
            return gen
    return None
