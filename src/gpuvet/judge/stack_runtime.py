"""stack.peermem, stack.nccl, stack.container_runtime: the parts of the software stack that decide
whether multi-GPU and multi-node work runs at all (the seeds' "could not select device driver",
"NCCL version mismatch", GPUDirect RDMA off)."""

from __future__ import annotations

from ..catalog import checked
from ..facts import ContainerRuntime
from ..record import MEASURED, Finding
from .common import FAIL, PASS, SKIP, WARN, Context, finding

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
STACK_CONTAINER_RUNTIME = checked("stack.container_runtime")
STACK_NCCL = checked("stack.nccl")
STACK_PEERMEM = checked("stack.peermem")

_NO_STACK = "software stack not in the capture (gpuvet run reads it)"


def check_peermem(ctx: Context) -> list[Finding]:
    machine = ctx.machine
    stack, host = machine.stack, machine.host
    if stack is None or host is None:
        return [finding(STACK_PEERMEM, "stack", SKIP, _NO_STACK)]
    if not machine.gpus:
        return [finding(STACK_PEERMEM, "stack", SKIP, "no GPU: GPUDirect RDMA not in play")]
    if not host.rdma:
        return [finding(STACK_PEERMEM, "stack", SKIP, "no RDMA device (InfiniBand/RoCE): GPUDirect RDMA not in play")]
    if stack.peermem_loaded is None:
        return [finding(STACK_PEERMEM, "stack", SKIP, "/proc/modules not readable: nvidia_peermem not checked")]
    source = "NVIDIA GPUDirect RDMA documentation (nvidia-peermem); NCCL's NET/IB GDR transport"
    if stack.peermem_loaded:
        return [finding(STACK_PEERMEM, "stack", PASS, "nvidia_peermem loaded: NCCL can move GPU memory over RDMA directly",
                        measured="nvidia_peermem in /proc/modules", expected="loaded on a machine with RDMA NICs", source=source)]
    multi = bool(ctx.options.get("multi_node"))
    return [finding(STACK_PEERMEM, "stack", FAIL if multi else WARN,
                    "nvidia_peermem not loaded: NCCL cannot use GPUDirect RDMA, so traffic between nodes bounces through "
                    "host memory" + (" (this is a multi-node job)" if multi else ""),
                    measured=f"{len(host.rdma)} RDMA port(s), nvidia_peermem absent from /proc/modules",
                    expected="loaded on a machine with RDMA NICs", source=source,
                    remedy="`sudo modprobe nvidia-peermem` (and add it to /etc/modules-load.d); NCCL_DEBUG=INFO shows 'GDR' when used")]


def check_nccl(ctx: Context) -> list[Finding]:
    stack = ctx.machine.stack
    if stack is None:
        return [finding(STACK_NCCL, "stack", SKIP, _NO_STACK)]
    torch = stack.torch
    if not torch.installed:
        return [finding(STACK_NCCL, "stack", SKIP, "PyTorch is not installed: no NCCL to read")]
    if torch.nccl is None:
        why = torch.error or "this PyTorch carries no NCCL (a CPU or ROCm build), or it was not imported"
        return [finding(STACK_NCCL, "stack", SKIP, f"NCCL version not read: {why}")]
    return [finding(STACK_NCCL, "stack", MEASURED,
                    f"NCCL {torch.nccl} (inside PyTorch {torch.version}); every node of a job must run the same one "
                    "(`gpuvet cluster` compares them)",
                    measured=f"torch.cuda.nccl.version() = {torch.nccl}",
                    remedy="on each node: `python -c 'import torch; print(torch.cuda.nccl.version())'`")]


def check_container_runtime(ctx: Context) -> list[Finding]:
    machine = ctx.machine
    stack, host = machine.stack, machine.host
    if stack is None or stack.container is None or host is None:
        return [finding(STACK_CONTAINER_RUNTIME, "stack", SKIP, _NO_STACK)]
    rt = stack.container
    if host.container:
        return [_inside(machine.driver.kernel_module_version or machine.driver.version, rt, host.container)]
    if not rt.docker:
        return [finding(STACK_CONTAINER_RUNTIME, "stack", SKIP, "not in a container, and no Docker here")]
    source = "NVIDIA Container Toolkit documentation (runtime configuration, CDI)"
    if rt.nvidia_runtime or rt.cdi_specs:
        how = "the NVIDIA runtime" if rt.nvidia_runtime else f"CDI spec {', '.join(rt.cdi_specs)}"
        return [finding(STACK_CONTAINER_RUNTIME, "stack", PASS, f"Docker can give containers the GPUs ({how})",
                        measured=how, expected="the NVIDIA runtime or a CDI spec for Docker", source=source)]
    return [finding(STACK_CONTAINER_RUNTIME, "stack", WARN,
                    "Docker is here without the NVIDIA runtime or a CDI spec: `docker run --gpus all` fails with "
                    "\"could not select device driver\"", measured="no nvidia runtime in /etc/docker/daemon.json, no CDI spec",
                    expected="the NVIDIA runtime or a CDI spec for Docker", source=source,
                    remedy="install nvidia-container-toolkit, then `sudo nvidia-ctk runtime configure --runtime=docker && "
                           "sudo systemctl restart docker`")]


def _inside(module: str | None, rt: ContainerRuntime, engine: str) -> Finding:
    source = "NVIDIA Container Toolkit: what it mounts (device nodes, the driver's libraries of the host's version)"
    expected = "/dev/nvidia* nodes and libcuda of the kernel module's version"
    gpu_nodes = [n for n in rt.dev_nodes if n[len("nvidia"):].isdigit()]
    if not gpu_nodes:
        # A warning, not a failure: a CPU-only container looks the same, and gpu.model already says no GPU is visible.
        return finding(STACK_CONTAINER_RUNTIME, "stack", WARN,
                       f"inside a {engine} container with no /dev/nvidia<N> device: if this machine has GPUs, it was "
                       "started without GPUs",
                       measured=f"/dev: {', '.join(rt.dev_nodes) or 'no nvidia node'}", expected=expected, source=source,
                       remedy="start it with `docker run --gpus all ...` (or the Kubernetes resource nvidia.com/gpu)")
    if rt.libcuda_version is None:
        return finding(STACK_CONTAINER_RUNTIME, "stack", FAIL,
                       "GPU device nodes are here but the driver's libcuda.so is not: the NVIDIA runtime did not mount it",
                       measured=f"{len(gpu_nodes)} GPU node(s), no libcuda.so", expected=expected, source=source,
                       remedy="start it with the NVIDIA runtime (`--gpus all` / `--runtime=nvidia`), not by mounting /dev alone")
    if module and rt.libcuda_version != module:
        return finding(STACK_CONTAINER_RUNTIME, "stack", FAIL,
                       f"libcuda {rt.libcuda_version} in the container, kernel module {module}: CUDA fails with "
                       "\"driver/library version mismatch\"", measured=f"{rt.libcuda}", expected=f"libcuda.so.{module}",
                       source=source, remedy="remove the driver libraries baked into the image; let the NVIDIA runtime mount the host's")
    return finding(STACK_CONTAINER_RUNTIME, "stack", PASS,
                   f"inside a {engine} container with {len(gpu_nodes)} GPU node(s) and the host's libcuda {rt.libcuda_version}",
                   measured=f"{', '.join(gpu_nodes)}; {rt.libcuda}", expected=expected, source=source)
