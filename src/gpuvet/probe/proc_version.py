"""The version of the NVIDIA kernel module that is actually loaded.

`/proc/driver/nvidia/version` (and the bare `/sys/module/nvidia/version`) tell which module the
kernel runs. After a driver upgrade without a reboot it differs from the user-space driver, and
nvidia-smi then fails with "Driver/library version mismatch"; these files still answer.

    NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.103.01  Thu Jan  6 12:10:04 UTC 2022
    NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build  (...)  <date>
    470.103.01                                   (/sys/module/nvidia/version)
"""

from __future__ import annotations

import re
from pathlib import Path

PROC_VERSION = Path("/proc/driver/nvidia/version")
SYS_MODULE_VERSION = Path("/sys/module/nvidia/version")

_VERSION = r"\d+\.\d+(?:\.\d+)*"
# The first dotted number after "Kernel Module" (skipping "for x86_64" in the open-module form).
_NVRM_LINE = re.compile(rf"^NVRM version:.*?Kernel Module\b.*?\s({_VERSION})(?:\s|$)", re.MULTILINE)
_BARE_VERSION = re.compile(rf"\s*({_VERSION})\s*")


def parse_kernel_module_version(text: str) -> str | None:
    """The module version from either file's text; None when the text holds none."""
    nvrm = _NVRM_LINE.search(text)
    if nvrm:
        return nvrm.group(1)
    bare = _BARE_VERSION.fullmatch(text)
    return bare.group(1) if bare else None


def looks_like_proc_version(text: str) -> bool:
    """True for the text of /proc/driver/nvidia/version or /sys/module/nvidia/version."""
    first_line = text.lstrip().split("\n", 1)[0]
    return first_line.startswith("NVRM version:") or bool(_BARE_VERSION.fullmatch(text))


def read_kernel_module_version(paths: tuple[Path, ...] = (PROC_VERSION, SYS_MODULE_VERSION)) -> str | None:
    """The loaded module's version on this machine; None when no NVIDIA module is loaded."""
    for path in paths:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:  # absent (no module, not Linux) or unreadable
            continue
        version = parse_kernel_module_version(text)
        if version:
            return version
    return None
