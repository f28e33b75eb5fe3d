"""The NVIDIA Fabric Manager service of an NVSwitch system (HGX, DGX): whether it runs, and its
version, which must be the driver's own. Read only where a GPU reports an NVSwitch fabric."""

from __future__ import annotations

import re
import shutil
import subprocess

_SERVICE = "nvidia-fabricmanager"
_VERSION = re.compile(r"version is\s*:\s*(\S+)|(\d{3}\.\d+(?:\.\d+)?)")


def read_state(timeout_s: float = 3.0) -> tuple[str | None, str | None]:
    """(state, version): state "active"/"inactive"/"failed"/... as systemctl says, "not installed"
    when neither systemd knows the unit nor nv-fabricmanager is on PATH; None when it cannot tell."""
    version = _version(timeout_s)
    state = _systemctl_state(timeout_s)
    if state in (None, "unknown") and version is None:
        return ("not installed" if shutil.which("systemctl") else None), None
    return state, version


def _run(argv: list[str], timeout_s: float) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (subprocess.TimeoutExpired, OSError):
        return None
    return (done.stdout or "").strip()


def _systemctl_state(timeout_s: float) -> str | None:
    out = _run(["systemctl", "is-active", _SERVICE], timeout_s)
    return out.splitlines()[0].strip() if out else None


def _version(timeout_s: float) -> str | None:
    out = _run(["nv-fabricmanager", "--version"], timeout_s)
    m = _VERSION.search(out or "")
    return (m.group(1) or m.group(2)) if m else None
