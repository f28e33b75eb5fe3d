"""stack.peermem, stack.nccl, stack.container_runtime: read on stand-in file trees (/proc/modules,
/dev/nvidia*, libcuda.so.N, /etc/docker/daemon.json, /etc/cdi) and judged."""

from __future__ import annotations

import os
import stat

import pytest

from gpuvet import judge
from gpuvet.facts import Driver, Gpu, Host, Machine, RdmaPort, Stack, Torch
from gpuvet.probe import container_runtime


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.setattr(container_runtime, "ROOT", str(tmp_path))
    bin_dir = tmp_path / "bin-path"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    return tmp_path


def _file(root, relative: str, text: str = "") -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _machine(stack: Stack, container: str | None = None, rdma: bool = False, module: str = "535.183.01") -> Machine:
    host = Host(container=container, rdma=[RdmaPort(device="mlx5_0", port=1, state="ACTIVE")] if rdma else [])
    return Machine(gpus=[Gpu(index=0, name="NVIDIA H100 80GB HBM3")], host=host, stack=stack,
                   driver=Driver(version=module, kernel_module_version=module))


def _finding(machine: Machine, check: str, options: dict | None = None):
    (f,) = [f for f in judge.judge(machine, options=options) if f.check == check]
    return f


def test_container_with_gpus_and_the_hosts_libcuda_passes(tree):
    for node in ("nvidia0", "nvidiactl", "nvidia-uvm"):
        _file(tree, f"dev/{node}")
    _file(tree, "usr/lib/x86_64-linux-gnu/libcuda.so.535.183.01")
    os.symlink("libcuda.so.535.183.01", tree / "usr/lib/x86_64-linux-gnu/libcuda.so.1")
    runtime = container_runtime.collect()
    assert runtime.dev_nodes == ["nvidia-uvm", "nvidia0", "nvidiactl"] and runtime.libcuda_version == "535.183.01"
    f = _finding(_machine(Stack(container=runtime), container="docker"), "stack.container_runtime")
    assert f.status == "pass" and "nvidia0" in f.evidence.measured


def test_container_without_gpu_nodes_fails_with_the_docker_flag(tree):
    f = _finding(_machine(Stack(container=container_runtime.collect()), container="docker"), "stack.container_runtime")
    assert f.status == "warn" and "--gpus all" in f.remedy and "started without GPUs" in f.summary


def test_container_libcuda_of_another_version_is_the_mismatch(tree):
    _file(tree, "dev/nvidia0")
    _file(tree, "usr/lib64/libcuda.so.550.54.14")
    f = _finding(_machine(Stack(container=container_runtime.collect()), container="docker"), "stack.container_runtime")
    assert f.status == "fail" and "version mismatch" in f.summary and "535.183.01" in f.summary


def _docker(tree) -> None:
    path = tree / "bin-path" / "docker"
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_docker_host_without_the_nvidia_runtime_warns_could_not_select_device_driver(tree):
    _docker(tree)
    _file(tree, "etc/docker/daemon.json", '{"log-driver": "json-file"}')
    f = _finding(_machine(Stack(container=container_runtime.collect())), "stack.container_runtime")
    assert f.status == "warn" and "could not select device driver" in f.summary and "nvidia-ctk" in f.remedy


def test_docker_host_with_the_runtime_or_a_cdi_spec_passes(tree):
    _docker(tree)
    _file(tree, "etc/docker/daemon.json", '{"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}')
    assert _finding(_machine(Stack(container=container_runtime.collect())), "stack.container_runtime").status == "pass"
    _file(tree, "etc/docker/daemon.json", "{}")
    _file(tree, "etc/cdi/nvidia.yaml", "cdiVersion: 0.5.0\n")
    f = _finding(_machine(Stack(container=container_runtime.collect())), "stack.container_runtime")
    assert f.status == "pass" and "nvidia.yaml" in f.summary


def test_peermem_from_proc_modules_matters_only_with_rdma(tree):
    _file(tree, "proc/modules", "nvidia_uvm 1806336 0 - Live 0x0\nnvidia 56717312 2 nvidia_uvm, Live 0x0\n")
    stack = Stack(peermem_loaded=container_runtime.peermem_loaded())
    assert stack.peermem_loaded is False
    assert _finding(_machine(stack), "stack.peermem").status == "skip"  # no RDMA NIC
    assert _finding(_machine(stack, rdma=True), "stack.peermem").status == "warn"
    f = _finding(_machine(stack, rdma=True), "stack.peermem", {"multi_node": True})
    assert f.status == "fail" and "modprobe nvidia-peermem" in f.remedy
    _file(tree, "proc/modules", "nvidia_peermem 16384 0 - Live 0x0\nnvidia 56717312 2 nvidia_peermem, Live 0x0\n")
    stack.peermem_loaded = container_runtime.peermem_loaded()
    assert _finding(_machine(stack, rdma=True), "stack.peermem").status == "pass"


def test_nccl_version_is_shown_not_judged():
    stack = Stack(torch=Torch(installed=True, version="2.4.1+cu124", cuda="12.4", nccl="2.21.5"))
    f = _finding(_machine(stack), "stack.nccl")
    assert f.status == "measured" and "NCCL 2.21.5" in f.summary
    stack.torch = Torch(installed=True, version="2.4.1+cpu")
    assert _finding(_machine(stack), "stack.nccl").status == "skip"
