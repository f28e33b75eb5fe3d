"""CUDA toolkit <-> driver compatibility (CUDA release notes, Tables 2 and 3).

Source: docs.nvidia.com/cuda/archive/13.2.2/cuda-toolkit-release-notes and the minor-version
compatibility guide, as transcribed in the project's reference notes.
"""

from __future__ import annotations

import re

SOURCE = "CUDA toolkit release notes, Tables 2-3 (minimum Linux x86_64 driver per toolkit)"

# CUDA version -> the driver released with that toolkit (GA).
TOOLKIT_DRIVER = {
    "10.0": "410.48", "10.1": "418.39", "10.2": "440.33",
    "11.0": "450.36.06", "11.1": "455.23", "11.2": "460.27.03", "11.3": "465.19.01", "11.4": "470.42.01",
    "11.5": "495.29.05", "11.6": "510.39.01", "11.7": "515.43.04", "11.8": "520.61.05",
    "12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03", "12.3": "545.23.06", "12.4": "550.54.14",
    "12.5": "555.42.02", "12.6": "560.28.03", "12.8": "570.26", "12.9": "575.51.03",
    "13.0": "580.65.06", "13.1": "590.44.01", "13.2": "595.45.04",
}

# Minor-version compatibility: any toolkit of the family runs (with a limited feature set) on
# drivers from this version on. CUDA 10.x had none.
FAMILY_MIN_DRIVER = {"11": "450.80.02", "12": "525.60.13", "13": "580.65.06"}


def version_tuple(version: str | None) -> tuple[int, ...]:
    if not version:
        return ()
    return tuple(int(x) for x in re.findall(r"\d+", version))


def toolkit_driver(cuda: str) -> str | None:
    major_minor = ".".join(str(x) for x in version_tuple(cuda)[:2])
    return TOOLKIT_DRIVER.get(major_minor)


def family_min_driver(cuda: str) -> str | None:
    major = version_tuple(cuda)[:1]
    return FAMILY_MIN_DRIVER.get(str(major[0])) if major else None


def supports_arch(arch_list: list[str], capability: str) -> str | None:
    """Which entry of torch.cuda.get_arch_list() runs on compute capability "8.9", or None.

    A cubin for sm_XY runs on the same major with a higher minor (sm_86 covers 8.9); PTX
    (compute_XY) is compiled by the driver for any newer GPU.
    """
    cc = version_tuple(capability)
    if len(cc) < 2:
        return None
    target = cc[0] * 10 + cc[1]
    cubins, ptx = [], []
    for entry in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)([a-z]?)", entry.strip())
        if not m:
            continue
        number, arch_specific = int(m.group(2)), bool(m.group(3))
        if m.group(1) == "sm":
            if number == target or (number // 10 == cc[0] and number % 10 <= cc[1] and not arch_specific):
                cubins.append((number, entry))
        elif number <= target:
            ptx.append((number, entry))
    # The closest cubin is what runs; PTX only when no cubin fits.
    return max(cubins)[1] if cubins else max(ptx)[1] if ptx else None
