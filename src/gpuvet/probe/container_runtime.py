"""What CUDA needs from a container, and what a Docker host needs to give one GPUs: the device
nodes, the driver's user-space library (its version must be the kernel module's), the NVIDIA
container runtime or a CDI spec; and nvidia_peermem, the module GPUDirect RDMA needs."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil

from ..facts import ContainerRuntime

ROOT = "/"  # tests point this at a stand-in file tree
_LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib", "usr/local/nvidia/lib64",
             "usr/local/nvidia/lib")
_LIBCUDA_VERSION = re.compile(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$")
_CDI_DIRS = ("etc/cdi", "var/run/cdi")


def _path(*parts: str) -> str:
    return os.path.join(ROOT, *parts)


def peermem_loaded() -> bool | None:
    try:
        with open(_path("proc/modules"), encoding="ascii", errors="replace") as f:
            return any(line.split(" ", 1)[0] == "nvidia_peermem" for line in f)
    except OSError:
        return None


def collect() -> ContainerRuntime:
    runtime = ContainerRuntime()
    runtime.dev_nodes = sorted(os.path.basename(p) for p in glob.glob(_path("dev", "nvidia*")))
    runtime.libcuda, runtime.libcuda_version = _libcuda()
    runtime.docker = shutil.which("docker") is not None
    runtime.nvidia_runtime = _nvidia_runtime() if runtime.docker else None
    runtime.cdi_specs = sorted(p for d in _CDI_DIRS for p in glob.glob(_path(d, "*"))
                               if "nvidia" in os.path.basename(p).lower())
    return runtime


def _libcuda() -> tuple[str | None, str | None]:
    """The real file libcuda.so.1 resolves to (the version is in its name: libcuda.so.535.183.01)."""
    for folder in _LIB_DIRS:
        for candidate in sorted(glob.glob(_path(folder, "libcuda.so*"))):
            real = os.path.realpath(candidate)
            m = _LIBCUDA_VERSION.search(os.path.basename(real))
            if m:
                return real, m.group(1)
    return None, None


def _nvidia_runtime() -> bool:
    if shutil.which("nvidia-container-runtime") or shutil.which("nvidia-ctk"):
        return True
    try:
        with open(_path("etc/docker/daemon.json"), encoding="utf-8") as f:
            return "nvidia" in json.load(f).get("runtimes", {})
    except (OSError, ValueError, AttributeError):
        return False
