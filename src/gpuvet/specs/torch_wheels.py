"""Which PyTorch wheel a driver runs: PyTorch's CUDA wheel indexes and the pip line for a machine.

Reference data and a formula, read by the judge (stack.driver_cuda) and by the benchmark plan (the
pip line it prints when PyTorch is missing): it lives in specs/ so neither reaches into the other."""

from __future__ import annotations

from . import cuda
from .cuda import version_tuple as vt

# PyTorch's CUDA wheel indexes (https://download.pytorch.org/whl/<tag>): the CUDA each is built
# with, and the last torch release published there (None: the newest release, 2.9.1, still is).
# Source: pytorch.org/get-started/previous-versions (the pip --index-url line of each release).
# cu111 and older are left out: their releases used `-f torch_stable.html`, not an index.
WHEEL_SOURCE = "PyTorch's wheel indexes per release (pytorch.org/get-started/previous-versions)"
TORCH_WHEELS: tuple[tuple[str, str, str | None], ...] = (
    ("cu102", "10.2", "1.12.1"), ("cu113", "11.3", "1.12.1"), ("cu116", "11.6", "1.13.1"),
    ("cu117", "11.7", "2.0.1"), ("cu118", "11.8", "2.7.1"), ("cu121", "12.1", "2.5.1"),
    ("cu124", "12.4", "2.6.0"), ("cu126", "12.6", None), ("cu128", "12.8", None),
    ("cu129", "12.9", "2.8.0"), ("cu130", "13.0", None),
)
_INDEX = "https://download.pytorch.org/whl/"


def driver_cuda(driver) -> str | None:
    """The newest CUDA the driver runs: as reported, else the newest toolkit released with an
    older or equal driver (CUDA release notes, Table 3)."""
    if driver.cuda_version:
        return driver.cuda_version
    if not driver.version:
        return None
    fitting = [c for c, needs in cuda.TOOLKIT_DRIVER.items() if vt(needs) <= vt(driver.version)]
    return max(fitting, key=vt) if fitting else None


def wheel_for(cuda_version: str | None) -> str:
    """The pip command for the newest PyTorch wheel this driver's CUDA runs: a tag still built
    by current releases when one fits (no pin), else the newest older tag, pinned to the last
    torch release that had it; or why none fits."""
    if not cuda_version:
        return (f"find the driver's CUDA version with `nvidia-smi` (top right), then pick that or an older "
                f"CUDA on pytorch.org/get-started/locally (e.g. `pip install torch --index-url {_INDEX}cu126`)")
    fitting = [w for w in TORCH_WHEELS if vt(w[1]) <= vt(cuda_version)[:2]]
    if not fitting:
        oldest_tag, oldest_cuda, last = TORCH_WHEELS[0]
        return (f"no PyTorch wheel index has a build for CUDA {cuda_version} or older: upgrade the driver to "
                f">= {cuda.toolkit_driver(oldest_cuda)} ({oldest_tag}, last built for torch {last}) or, for current "
                f"wheels (cu126), >= {cuda.toolkit_driver('12.6')}")
    current = [w for w in fitting if w[2] is None]
    tag, _, last = (current or fitting)[-1]
    pin = f"=={last}" if last else ""
    note = f"  ({tag} was last built for torch {last})" if last else ""
    return f"pip install torch{pin} --index-url {_INDEX}{tag}{note}"


CPU_INDEX = f"{_INDEX}cpu"


def torch_install(machine, pip: str = "pip") -> str:
    """How to install a PyTorch this machine runs, with `pip` (the pip of the environment gpuvet
    runs in, where the caller knows it): PyPI's default torch is built for the newest CUDA, which
    most rented machines' drivers are too old for, so the index matching the driver's CUDA is
    named; on a machine without an NVIDIA GPU, the CPU build."""
    if not machine.gpus and not machine.driver.version:
        return f"`{pip} install torch --index-url {CPU_INDEX}` (no NVIDIA GPU here: the CPU build)"
    line = wheel_for(driver_cuda(machine.driver))
    if not line.startswith("pip install "):
        return line
    command, _, note = line.partition("  ")
    cuda_version = driver_cuda(machine.driver)
    return (f"`{pip}{command[3:]}`" + (f" {note}" if note else "")
            + f" (the index for the driver's CUDA {cuda_version}: PyPI's default torch needs a newer driver)")
