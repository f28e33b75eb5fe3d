"""stack.driver_cuda and stack.arch_support: will your framework run on this driver and GPU?"""

from __future__ import annotations

from ..record import Finding
from . import cuda
from .common import FAIL, PASS, SKIP, WARN, Context, finding
from .cuda import version_tuple as vt

_INSTALL = "install a PyTorch wheel built for an older CUDA (e.g. `pip install torch --index-url https://download.pytorch.org/whl/cu{tag}`)"


def check_driver_cuda(ctx: Context) -> list[Finding]:
    m = ctx.machine
    if m.stack is None:
        return [finding("stack.driver_cuda", "stack", SKIP, "software stack not in the capture (gpuvet run reads it)")]
    torch = m.stack.torch
    driver = m.driver
    if not torch.installed:
        return [finding("stack.driver_cuda", "stack", SKIP, "PyTorch is not installed: no framework CUDA to compare with the driver")]
    if torch.cuda is None:
        if m.gpus and torch.hip is None:
            return [finding("stack.driver_cuda", "stack", FAIL,
                            f"PyTorch {torch.version} is a CPU-only build: it will never use the GPUs",
                            measured=f"torch.version.cuda = None ({torch.version})", expected="a CUDA build of PyTorch",
                            remedy="pip install torch --index-url https://download.pytorch.org/whl/cu128  (pick the CUDA your driver supports)")]
        return [finding("stack.driver_cuda", "stack", SKIP, f"PyTorch {torch.version} has no CUDA runtime (CPU or ROCm build)")]
    if driver.version is None:
        return [finding("stack.driver_cuda", "stack", SKIP,
                        f"PyTorch {torch.version} wants CUDA {torch.cuda}, but there is no NVIDIA driver: {m.gpu_error or 'no GPU found'}")]
    needed = cuda.toolkit_driver(torch.cuda)
    family_min = cuda.family_min_driver(torch.cuda)
    measured = f"driver {driver.version} (supports CUDA {driver.cuda_version or '?'}); torch {torch.version} built with CUDA {torch.cuda}"
    expected = f"driver >= {needed}" if needed else f"driver supporting CUDA {torch.cuda}"
    ok_by_cuda = driver.cuda_version and vt(driver.cuda_version)[:2] >= vt(torch.cuda)[:2]
    ok_by_driver = needed and vt(driver.version) >= vt(needed)
    if ok_by_cuda or ok_by_driver:
        return [finding("stack.driver_cuda", "stack", PASS,
                        f"driver {driver.version} runs CUDA {torch.cuda} (torch {torch.version})",
                        measured=measured, expected=expected, source=cuda.SOURCE)]
    tag = (driver.cuda_version or "").replace(".", "")
    remedy = f"ask the provider for a driver >= {needed or '?'}, or " + _INSTALL.format(tag=tag or "118")
    if family_min and vt(driver.version) >= vt(family_min) and vt(driver.cuda_version or "0")[:1] == vt(torch.cuda)[:1]:
        return [finding("stack.driver_cuda", "stack", WARN,
                        f"driver {driver.version} is older than CUDA {torch.cuda} wants; it runs by minor-version compatibility, "
                        "but PTX/JIT code (torch.compile, Triton) can fail with 'unsupported PTX version'",
                        measured=measured, expected=expected, source=cuda.SOURCE, remedy=remedy)]
    return [finding("stack.driver_cuda", "stack", FAIL,
                    f"driver {driver.version} is too old for PyTorch built with CUDA {torch.cuda}: CUDA calls will fail",
                    measured=measured, expected=expected, source=cuda.SOURCE, remedy=remedy)]


def check_arch_support(ctx: Context) -> list[Finding]:
    m = ctx.machine
    if m.stack is None:
        return [finding("stack.arch_support", "stack", SKIP, "software stack not in the capture (gpuvet run reads it)")]
    torch = m.stack.torch
    if not m.gpus:
        return [finding("stack.arch_support", "stack", SKIP, f"no GPU to run kernels on: {m.gpu_error or 'none found'}")]
    if not torch.installed or torch.cuda is None:
        return [finding("stack.arch_support", "stack", SKIP, "no CUDA build of PyTorch installed")]
    if torch.error:
        return [finding("stack.arch_support", "stack", FAIL, f"PyTorch could not be checked: {torch.error}",
                        remedy="python -c 'import torch; print(torch.cuda.is_available())'")]
    if torch.cuda_available is False:
        return [finding("stack.arch_support", "stack", FAIL,
                        "torch.cuda.is_available() is False although the driver sees GPUs: PyTorch cannot use them",
                        measured="torch.cuda.is_available() = False", expected="True",
                        remedy="check CUDA_VISIBLE_DEVICES and, in a container, that it runs with the NVIDIA runtime (`--gpus all`)")]
    if not torch.arch_list:
        return [finding("stack.arch_support", "stack", SKIP, "torch.cuda.get_arch_list() not read")]
    findings = []
    capabilities = sorted({g.compute_capability for g in m.gpus if g.compute_capability})
    if not capabilities:
        return [finding("stack.arch_support", "stack", SKIP, "GPU compute capability unknown")]
    archs = " ".join(torch.arch_list)
    for cc in capabilities:
        names = ", ".join(sorted({g.name or "?" for g in m.gpus if g.compute_capability == cc}))
        entry = cuda.supports_arch(torch.arch_list, cc)
        if entry is None:
            findings.append(finding(
                "stack.arch_support", "stack", FAIL,
                f"PyTorch {torch.version} has no kernels for compute capability {cc} ({names}): "
                "'no kernel image is available for execution on the device'",
                measured=f"torch arch list: {archs}", expected=f"sm_{cc.replace('.', '')} or older PTX",
                source="torch.cuda.get_arch_list()",
                remedy="install a PyTorch build for this GPU (newer GPUs need a newer CUDA wheel, e.g. cu128 for Blackwell)"))
        else:
            findings.append(finding("stack.arch_support", "stack", PASS,
                                    f"PyTorch {torch.version} runs on compute capability {cc} ({names}) via {entry}",
                                    measured=f"torch arch list: {archs}", source="torch.cuda.get_arch_list()"))
    return findings
