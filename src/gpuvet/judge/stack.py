"""stack.driver_cuda, stack.arch_support and stack.toolkit: will your framework (and the CUDA
toolkit installed) run on this driver and GPU?"""

from __future__ import annotations

import re

from ..catalog import checked
from ..facts import Stack
from ..record import MEASURED, Finding
from ..specs import cuda
from ..specs.cuda import version_tuple as vt
from ..specs.torch_wheels import WHEEL_SOURCE, driver_cuda, torch_install, wheel_for
from .common import FAIL, PASS, SKIP, WARN, Context, finding

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
STACK_ARCH_SUPPORT = checked("stack.arch_support")
STACK_DRIVER_CUDA = checked("stack.driver_cuda")
STACK_TOOLKIT = checked("stack.toolkit")


def check_driver_cuda(ctx: Context) -> list[Finding]:
    m = ctx.machine
    if m.stack is None:
        return [finding(STACK_DRIVER_CUDA, "stack", SKIP, "software stack not in the capture (gpuvet run reads it)")]
    torch = m.stack.torch
    driver = m.driver
    if not torch.installed:
        return [finding(STACK_DRIVER_CUDA, "stack", SKIP, "PyTorch is not installed: no framework CUDA to compare with the driver",
                        remedy=f"install one this driver runs: {torch_install(m)}")]
    if torch.cuda is None:
        if m.gpus and torch.hip is None:
            return [finding(STACK_DRIVER_CUDA, "stack", FAIL,
                            f"PyTorch {torch.version} is a CPU-only build: it will never use the GPUs",
                            measured=f"torch.version.cuda = None ({torch.version})", expected="a CUDA build of PyTorch",
                            source=WHEEL_SOURCE, remedy=f"install a CUDA build your driver runs: {wheel_for(driver_cuda(driver))}")]
        return [finding(STACK_DRIVER_CUDA, "stack", SKIP, f"PyTorch {torch.version} has no CUDA runtime (CPU or ROCm build)")]
    if driver.version is None:
        return [finding(STACK_DRIVER_CUDA, "stack", SKIP,
                        f"PyTorch {torch.version} wants CUDA {torch.cuda}, but there is no NVIDIA driver: {m.gpu_error or 'no GPU found'}")]
    needed = cuda.toolkit_driver(torch.cuda)
    family_min = cuda.family_min_driver(torch.cuda)
    measured = f"driver {driver.version} (supports CUDA {driver.cuda_version or '?'}); torch {torch.version} built with CUDA {torch.cuda}"
    expected = f"driver >= {needed}" if needed else f"driver supporting CUDA {torch.cuda}"
    ok_by_cuda = driver.cuda_version and vt(driver.cuda_version)[:2] >= vt(torch.cuda)[:2]
    ok_by_driver = needed and vt(driver.version) >= vt(needed)
    if ok_by_cuda or ok_by_driver:
        return [finding(STACK_DRIVER_CUDA, "stack", PASS,
                        f"driver {driver.version} runs CUDA {torch.cuda} (torch {torch.version})",
                        measured=measured, expected=expected, source=cuda.SOURCE)]
    remedy = (f"ask the provider for a driver >= {needed or '?'}, or install a PyTorch wheel for the driver's CUDA: "
              f"{wheel_for(driver_cuda(driver))}")
    if family_min and vt(driver.version) >= vt(family_min) and vt(driver.cuda_version or "0")[:1] == vt(torch.cuda)[:1]:
        return [finding(STACK_DRIVER_CUDA, "stack", WARN,
                        f"driver {driver.version} is older than CUDA {torch.cuda} wants; it runs by minor-version compatibility, "
                        "but PTX/JIT code (torch.compile, Triton) can fail with 'unsupported PTX version'",
                        measured=measured, expected=expected, source=f"{cuda.SOURCE}; {WHEEL_SOURCE}", remedy=remedy)]
    return [finding(STACK_DRIVER_CUDA, "stack", FAIL,
                    f"driver {driver.version} is too old for PyTorch built with CUDA {torch.cuda}: CUDA calls will fail",
                    measured=measured, expected=expected, source=f"{cuda.SOURCE}; {WHEEL_SOURCE}", remedy=remedy)]


def check_arch_support(ctx: Context) -> list[Finding]:
    m = ctx.machine
    if m.stack is None:
        return [finding(STACK_ARCH_SUPPORT, "stack", SKIP, "software stack not in the capture (gpuvet run reads it)")]
    torch = m.stack.torch
    if not m.gpus:
        return [finding(STACK_ARCH_SUPPORT, "stack", SKIP, f"no GPU to run kernels on: {m.gpu_error or 'none found'}")]
    if not torch.installed or torch.cuda is None:
        return [finding(STACK_ARCH_SUPPORT, "stack", SKIP, "no CUDA build of PyTorch installed")]
    if torch.error:
        return [finding(STACK_ARCH_SUPPORT, "stack", FAIL, f"PyTorch could not be checked: {torch.error}",
                        remedy="python -c 'import torch; print(torch.cuda.is_available())'")]
    if torch.cuda_available is False:
        return [finding(STACK_ARCH_SUPPORT, "stack", FAIL,
                        "torch.cuda.is_available() is False although the driver sees GPUs: PyTorch cannot use them",
                        measured="torch.cuda.is_available() = False", expected="True",
                        remedy="check CUDA_VISIBLE_DEVICES and, in a container, that it runs with the NVIDIA runtime (`--gpus all`)")]
    if not torch.arch_list:
        return [finding(STACK_ARCH_SUPPORT, "stack", SKIP, "torch.cuda.get_arch_list() not read")]
    findings = []
    capabilities = sorted({g.compute_capability for g in m.gpus if g.compute_capability})
    if not capabilities:
        return [finding(STACK_ARCH_SUPPORT, "stack", SKIP, "GPU compute capability unknown")]
    archs = " ".join(torch.arch_list)
    for cc in capabilities:
        names = ", ".join(sorted({g.name or "?" for g in m.gpus if g.compute_capability == cc}))
        entry = cuda.supports_arch(torch.arch_list, cc)
        if entry is None:
            findings.append(finding(
                STACK_ARCH_SUPPORT, "stack", FAIL,
                f"PyTorch {torch.version} has no kernels for compute capability {cc} ({names}): "
                "'no kernel image is available for execution on the device'",
                measured=f"torch arch list: {archs}", expected=f"sm_{cc.replace('.', '')} or older PTX",
                source="torch.cuda.get_arch_list()",
                remedy="install a PyTorch build for this GPU (newer GPUs need a newer CUDA wheel, e.g. cu128 for Blackwell)"))
        else:
            findings.append(finding(STACK_ARCH_SUPPORT, "stack", PASS,
                                    f"PyTorch {torch.version} runs on compute capability {cc} ({names}) via {entry}",
                                    measured=f"torch arch list: {archs}", expected=f"sm_{cc.replace('.', '')} or older PTX",
                                    source="torch.cuda.get_arch_list() against the GPU's compute capability"))
    return findings


# -- stack.toolkit ---------------------------------------------------------------------------------

def check_toolkit(ctx: Context) -> list[Finding]:
    """The CUDA toolkit installed (nvcc, /usr/local/cuda's version file) against the driver (seed 2:
    a driver older than the toolkit's minimum means stop deploying) and against the CUDA PyTorch
    was built with (extensions compiled with nvcc must match it)."""
    m = ctx.machine
    if m.stack is None:
        return [finding(STACK_TOOLKIT, "stack", SKIP, "software stack not in the capture (gpuvet run reads it)")]
    st = m.stack
    toolkit, where = _toolkit(st)
    if toolkit is None:
        why = st.unavailable.get("nvcc_version") or "nvcc not found"
        return [finding(STACK_TOOLKIT, "stack", SKIP, f"no CUDA toolkit installed ({why}): PyTorch wheels bring their "
                        "own CUDA runtime; a toolkit is needed only to compile CUDA code or extensions")]
    measured = f"toolkit CUDA {toolkit} ({where}); driver {m.driver.version or '?'}"
    problems: list[tuple[str, str]] = []
    expected, sources = [], [cuda.SOURCE]
    needed, family_min = cuda.toolkit_driver(toolkit), cuda.family_min_driver(toolkit)
    if m.driver.version and needed:
        expected.append(f"driver >= {needed} for CUDA {toolkit}")
        if vt(m.driver.version) < vt(needed):
            compatible = family_min and vt(m.driver.version) >= vt(family_min)
            problems.append((WARN if compatible else FAIL,
                             f"driver {m.driver.version} is older than CUDA {toolkit} needs ({needed})"
                             + ("; it runs by minor-version compatibility, but code nvcc builds with newer PTX fails to load"
                                if compatible else ": programs built with this toolkit fail to start; stop deploying "
                                                   "until the provider upgrades the driver")))
    if st.nvcc_version and st.cuda_home_version and vt(st.nvcc_version)[:2] != vt(st.cuda_home_version)[:2]:
        problems.append((WARN, f"two toolkits: nvcc on PATH is CUDA {st.nvcc_version}, {st.cuda_home_target} holds "
                               f"{st.cuda_home_version}: builds use whichever comes first"))
        measured += f"; nvcc {st.nvcc_version}, {st.cuda_home_target} {st.cuda_home_version}"
    torch_cuda = st.torch.cuda if st.torch.installed else None
    if torch_cuda:
        measured += f"; torch {st.torch.version} built with CUDA {torch_cuda}"
        expected.append(f"the same CUDA major as PyTorch's ({vt(torch_cuda)[0]})")
        sources.append("torch.utils.cpp_extension refuses a toolkit of another CUDA major than torch.version.cuda")
        if vt(toolkit)[:1] != vt(torch_cuda)[:1]:
            problems.append((WARN, f"toolkit CUDA {toolkit} vs PyTorch's CUDA {torch_cuda}: extensions built here "
                                   "(flash-attn, apex, custom ops) fail: 'The detected CUDA version mismatches the version "
                                   "that was used to compile PyTorch'"))
    if not expected:
        return [finding(STACK_TOOLKIT, "stack", MEASURED, f"CUDA toolkit {toolkit} ({where}): no driver version "
                        "or PyTorch to compare it with", measured=measured)]
    common = {"measured": measured, "expected": "; ".join(expected), "source": "; ".join(sources)}
    if problems:
        status = FAIL if any(s == FAIL for s, _ in problems) else WARN
        return [finding(STACK_TOOLKIT, "stack", status, "; ".join(w for _, w in problems), **common,
                        remedy="`nvcc --version`, `cat /usr/local/cuda/version.json`, `nvidia-smi`; ask the provider for a "
                               "newer driver, or install the toolkit matching torch.version.cuda")]
    return [finding(STACK_TOOLKIT, "stack", PASS, f"CUDA toolkit {toolkit} runs on driver {m.driver.version or '?'}"
                    + (f" and matches PyTorch's CUDA {torch_cuda}" if torch_cuda else ""), **common)]


def _toolkit(st: Stack) -> tuple[str | None, str]:
    if st.nvcc_version:
        return ".".join(str(x) for x in vt(st.nvcc_version)[:2]), "nvcc --version"
    if st.cuda_home_version:
        return st.cuda_home_version, f"{st.cuda_home_target or '/usr/local/cuda'}/version.json or version.txt"
    return None, ""


# Drivers before R450 account GPU memory coarsely (418-era drivers over-report used memory), so
# memory figures that disagree with the framework's have a known cause there.
COARSE_MEMORY_DRIVER_BELOW = 450


def coarse_memory_accounting(driver_version: str | None) -> bool | None:
    """Whether this driver is one that accounts memory coarsely (None: version not known)."""
    major = re.match(r"(\d+)", driver_version or "")
    return int(major.group(1)) < COARSE_MEMORY_DRIVER_BELOW if major else None
