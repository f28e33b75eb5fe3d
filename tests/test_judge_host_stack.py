"""Host, storage and software-stack rules: on this machine's real facts, and on copies with one
fact edited (each test says which)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvet import judge as judge_module
from gpuvet.facts import Host, Machine, Stack, Storage, Torch
from gpuvet.judge import judge
from gpuvet.specs.cuda import supports_arch
from gpuvet.probe import capture
from gpuvet.probe.host import collect_host

FIXTURES = Path(__file__).parent / "fixtures"
GIB = 1024**3


@pytest.fixture(scope="module")
def this_host() -> Host:
    return collect_host(steal_window_s=0.05)


def result(machine: Machine, check: str):
    (f,) = [f for f in judge(machine) if f.check == check]
    return f


def with_gpus(name: str, host: Host | None = None, stack: Stack | None = None) -> Machine:
    machine = capture.merge(capture.read_captures(str(FIXTURES / name)))
    machine.host, machine.stack = host, stack
    return machine


# -- host -------------------------------------------------------------------------------------

def test_host_checks_skip_for_captures_and_say_why():
    machine = with_gpus("smi_text/q-titan-v-560.35.03.txt")
    for check in ("host.cpu", "host.shm", "host.steal", "host.somaxconn", "storage.workdir"):
        f = result(machine, check)
        assert f.status == "skip" and "not in the capture" in f.summary


def test_this_machine_host_facts_are_judged(this_host):
    machine = Machine(host=this_host)
    for check in ("host.cpu", "host.shm", "host.somaxconn"):
        assert result(machine, check).status in ("pass", "warn"), check
    assert result(machine, "storage.workdir").status in ("pass", "warn")
    kept = result(machine, "storage.persistence")  # a VM's disk may be instance storage: a skip that says so
    assert kept.status in ("pass", "warn") or "cannot tell whether" in kept.summary


# The seed's starved instance: 8 cores for one RTX 4090 (16 fed it); 8 per GPU warns.
@pytest.mark.parametrize("cores, status", [(128, "pass"), (64, "warn"), (48, "warn"), (16, "fail")])
def test_cores_per_gpu_on_an_8_gpu_box(this_host, cores, status):
    this_host.cpu_usable_cores = cores  # edited: this machine has 2
    f = result(with_gpus("smi_text/q-8x-rtx4090-all-idle-535.154.05.txt", host=this_host), "host.cpu")
    assert f.status == status and f"{cores / 8:.0f}" in f.summary


def test_docker_default_shm_fails_with_the_flag_to_fix_it(this_host):
    this_host.shm_total_bytes = 64 * 2**20  # edited: Docker's default /dev/shm
    f = result(Machine(host=this_host), "host.shm")
    assert f.status == "fail" and "64 MiB" in f.summary and "--shm-size" in f.remedy


@pytest.mark.parametrize("steal, status", [(0.5, "pass"), (7.0, "warn"), (25.0, "fail")])
def test_cpu_steal(this_host, steal, status):
    this_host.steal_pct, this_host.steal_since_boot_pct = steal, 0.1  # edited
    assert result(Machine(host=this_host), "host.steal").status == status


def test_small_somaxconn_warns_like_the_seed(this_host):
    this_host.somaxconn = 128  # edited: the seed's value
    f = result(Machine(host=this_host), "host.somaxconn")
    assert f.status == "warn" and "sysctl -w net.core.somaxconn=4096" in f.remedy


OVERLAY = Storage(path="/workspace", fs_type="overlay", kind="overlay", free_bytes=500 * GIB)
NFS = Storage(path="/mnt/nfs", fs_type="nfs4", kind="network", free_bytes=500 * GIB)
EBS = Storage(path="/data", fs_type="ext4", kind="nvme", model="Amazon Elastic Block Store", free_bytes=800 * GIB)
INSTANCE_STORE = Storage(path="/data", fs_type="ext4", kind="nvme", ephemeral=True,
                         ephemeral_reason="Amazon EC2 NVMe Instance Storage", free_bytes=800 * GIB)


# storage.workdir: what it is on and whether checkpoints fit; storage.persistence: whether it outlives the instance.
@pytest.mark.parametrize(
    "check, storage, status, words",
    [
        ("storage.workdir", OVERLAY, "warn", "writable layer"),
        ("storage.workdir", NFS, "warn", "network file system"),
        ("storage.workdir", Storage(path="/data", fs_type="xfs", kind="nvme", free_bytes=5 * GIB), "warn", "only 5 GiB free"),
        ("storage.workdir", EBS, "pass", "/data on ext4 (nvme, Amazon Elastic Block Store), 800 GiB free"),
        ("storage.persistence", OVERLAY, "warn", "overlay: not kept"),
        ("storage.persistence", INSTANCE_STORE, "warn", "/data on ext4: Amazon EC2 NVMe Instance Storage; checkpoints there are lost"),
        ("storage.persistence", NFS, "pass", "outlives the instance"),
        ("storage.persistence", EBS, "pass", "network block volume"),
    ],
)
def test_workdir_storage(this_host, check, storage, status, words):
    this_host.workdir = storage  # edited: a storage the tests describe
    f = result(Machine(host=this_host), check)
    assert f.status == status and words in f.summary
    assert f.evidence.measured.startswith(f"{storage.path} on {storage.fs_type} ({storage.kind}")
    if check == "storage.persistence":
        assert f.evidence.expected.startswith("storage that outlives the instance") and "findmnt" in f.evidence.source


def bare_metal(host: Host) -> Host:
    host.hypervisor = host.cloud = host.container = None  # edited: a physical machine
    return host


def test_a_local_disk_of_a_physical_machine_is_persistent(this_host):
    bare_metal(this_host).workdir = Storage(path="/data", fs_type="xfs", kind="nvme", free_bytes=800 * GIB)  # edited
    f = result(Machine(host=this_host), "storage.persistence")
    assert f.status == "pass" and f.summary == "/data on xfs: a local disk of a physical machine"
    assert result(Machine(host=this_host), "storage.workdir").summary == "/data on xfs (nvme), 800 GiB free"


def test_a_vm_disk_of_unknown_persistence_is_a_skip_that_says_how_to_find_out(this_host):
    this_host.hypervisor, this_host.container = "kvm", None  # edited: a KVM guest with a virtio disk
    this_host.workdir = Storage(path="/tmp", fs_type="ext4", kind="unknown", free_bytes=77 * GIB)
    f = result(Machine(host=this_host), "storage.persistence")
    assert f.status == "skip"
    assert f.summary.startswith("/tmp on ext4: cannot tell whether a virtual or unknown disk (kvm guest) is kept")
    assert "`findmnt -T /tmp`" in f.summary and "`lsblk -o NAME,TYPE,ROTA,MODEL`" in f.summary and "instance" in f.summary


def test_unknown_persistence_warns_on_a_preemptible_instance(this_host):
    this_host.hypervisor = "kvm"  # edited, as above; the user said the instance is preemptible
    this_host.workdir = Storage(path="/tmp", fs_type="ext4", kind="nvme", free_bytes=77 * GIB)
    (f,) = [f for f in judge(Machine(host=this_host), options={"preemptible": True}) if f.check == "storage.persistence"]
    assert f.status == "warn" and "cannot tell whether a local NVMe disk" in f.summary
    assert f.summary.endswith("; the instance is preemptible (as you stated)")
    assert f.remedy.startswith("keep checkpoints on a persistent volume or object storage; check `findmnt -T /tmp`")


@pytest.mark.parametrize(("stated", "status", "measured"), [(True, "warn", "preemptible"), (False, "pass", "on-demand"),
                                                          (None, "skip", None)])
def test_preemptible_is_judged_from_what_the_user_stated(this_host, stated, status, measured):
    this_host.preemptible = None  # edited: no instance metadata answered, so only the user can tell
    (f,) = [f for f in judge(Machine(host=this_host), options={"preemptible": stated}) if f.check == "host.preemptible"]
    assert f.status == status and f.evidence.measured == measured
    if status != "skip":
        assert f.evidence.source == "what you stated (--preemptible / --on-demand)" and f.evidence.expected
    else:
        assert "`gpuvet run --preemptible` or `--on-demand`" in f.summary


# -- stack ------------------------------------------------------------------------------------

def stack(cuda: str | None, version: str = "2.7.0", arch_list=None, available=True) -> Stack:
    return Stack(torch=Torch(installed=True, version=version, cuda=cuda, cuda_available=available,
                             arch_list=arch_list or ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]))


@pytest.mark.parametrize(
    "capture_name, torch_cuda, status",
    [
        ("smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt", "12.1", "pass"),  # driver 535 runs CUDA 12.2
        ("smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt", "12.8", "warn"),  # minor-version compatibility
        ("smi_text/q-4x-v100-pcie-16gb-azure-ncv3-460.32.03.txt", "12.1", "fail"),  # 460 is CUDA 11.2
        ("smi_text/q-h100-80gb-hbm3-vm-590.48.01-idle.txt", "13.0", "pass"),
    ],
)
def test_driver_against_the_torch_cuda_runtime(capture_name, torch_cuda, status):
    f = result(with_gpus(capture_name, stack=stack(torch_cuda)), "stack.driver_cuda")
    assert f.status == status
    if status != "pass":
        assert "driver >=" in f.evidence.expected and f.remedy


def test_cpu_only_torch_on_a_gpu_machine_fails():
    f = result(with_gpus("smi_text/q-titan-v-560.35.03.txt", stack=stack(None, version="2.13.0+cpu")), "stack.driver_cuda")
    assert f.status == "fail" and "CPU-only" in f.summary


def test_stack_skips_without_torch_or_without_capture():
    assert result(with_gpus("smi_text/q-titan-v-560.35.03.txt"), "stack.driver_cuda").status == "skip"
    no_torch = Stack(torch=Torch(installed=False))
    assert result(with_gpus("smi_text/q-titan-v-560.35.03.txt", stack=no_torch), "stack.driver_cuda").status == "skip"


def test_arch_support_fails_for_a_gpu_newer_than_the_wheel():
    machine = with_gpus("smi_text/q-h100-80gb-hbm3-vm-590.48.01-idle.txt", stack=stack("12.1"))
    machine.gpus[0].compute_capability = "12.0"  # edited: an RTX 5090-class GPU
    f = result(machine, "stack.arch_support")
    assert f.status == "fail" and "no kernel image is available" in f.summary


def test_arch_support_passes_via_a_compatible_cubin():
    machine = with_gpus("smi_text/q-h100-80gb-hbm3-vm-590.48.01-idle.txt", stack=stack("12.1"))
    machine.gpus[0].compute_capability = "9.0"  # NVML reports it live; -q captures do not
    f = result(machine, "stack.arch_support")
    assert f.status == "pass" and "sm_90" in f.summary


def test_torch_that_cannot_see_the_gpus_fails():
    machine = with_gpus("smi_text/q-titan-v-560.35.03.txt", stack=stack("12.4", available=False))
    f = result(machine, "stack.arch_support")
    assert f.status == "fail" and "is_available() is False" in f.summary


@pytest.mark.parametrize(
    "arch_list, cc, expected",
    [
        (["sm_80", "sm_86", "sm_90"], "8.9", "sm_86"),  # same major, older minor: the cubin runs
        (["sm_80", "sm_90"], "8.6", "sm_80"),
        (["sm_70", "sm_80"], "9.0", None),
        (["sm_80", "compute_90"], "12.0", "compute_90"),  # PTX is compiled for newer GPUs
        (["sm_90a"], "9.0", "sm_90a"),
    ],
)
def test_supports_arch(arch_list, cc, expected):
    assert supports_arch(arch_list, cc) == expected


# -- isolation of rules ------------------------------------------------------------------------

def test_a_crashing_rule_is_a_skip_and_the_others_still_report(monkeypatch):
    def broken(ctx):
        raise RuntimeError("boom")

    monkeypatch.setitem(judge_module.RULES, "gpu.ecc", broken)
    findings = judge(with_gpus("smi_text/q-titan-v-560.35.03.txt"))
    (crashed,) = [f for f in findings if f.check == "gpu.ecc"]
    assert crashed.status == "skip" and "crashed" in crashed.summary and "boom" in crashed.summary
    assert any(f.check == "gpu.power_limit" and f.status == "pass" for f in findings)


# -- stack.driver_cuda: the wheel the remedy names exists on PyTorch's index ----------------------

@pytest.mark.parametrize("capture_name, torch_cuda, command", [
    # driver 535 runs CUDA 12.2: the newest index not newer is cu121, last built for torch 2.5.1
    ("smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt", "13.0", "pip install torch==2.5.1 --index-url https://download.pytorch.org/whl/cu121"),
    # driver 460 runs CUDA 11.2: cu102 (torch 1.12.1); there is no cu112 index
    ("smi_text/q-4x-v100-pcie-16gb-azure-ncv3-460.32.03.txt", "12.1", "pip install torch==1.12.1 --index-url https://download.pytorch.org/whl/cu102"),
])
def test_driver_too_old_names_a_wheel_index_that_exists(capture_name, torch_cuda, command):
    f = result(with_gpus(capture_name, stack=stack(torch_cuda)), "stack.driver_cuda")
    assert f.status in ("warn", "fail") and command in f.remedy
    assert "previous-versions" in f.evidence.source


@pytest.mark.parametrize("capture_name, command", [
    ("smi_text/q-titan-v-560.35.03.txt", "pip install torch --index-url https://download.pytorch.org/whl/cu126"),  # CUDA 12.6
    ("smi_xml/gt-1030-x4-470.74-v11.xml", "pip install torch==1.12.1 --index-url https://download.pytorch.org/whl/cu113"),  # CUDA 11.4
    ("smi_text/default-table-8x-h100-550.90.07.txt", "pip install torch==2.6.0 --index-url https://download.pytorch.org/whl/cu124"),  # CUDA 12.4
])
def test_cpu_only_torch_names_the_wheel_for_this_driver(capture_name, command):
    f = result(with_gpus(capture_name, stack=stack(None, version="2.9.1+cpu")), "stack.driver_cuda")
    assert f.status == "fail" and command in f.remedy


def test_wheel_for_a_driver_older_than_every_index_says_to_upgrade():
    from gpuvet.judge.stack import wheel_for

    assert wheel_for("10.1").startswith("no PyTorch wheel index has a build for CUDA 10.1 or older: upgrade the driver to >= 440.33")
    assert wheel_for("12.9") == "pip install torch --index-url https://download.pytorch.org/whl/cu128"


def test_host_passes_say_what_was_expected_and_where_that_comes_from(this_host):
    # edited: values that pass everywhere, so every host check reaches its pass
    this_host.cpu_usable_cores, this_host.shm_total_bytes, this_host.somaxconn = 128, 16 * GIB, 4096
    this_host.steal_pct, this_host.steal_since_boot_pct = 0.5, 0.1
    machine = with_gpus("smi_text/q-8x-rtx4090-all-idle-535.154.05.txt", host=this_host)
    for check, expected, source in (("host.cpu", "at least 16 usable cores per GPU", "DataLoader"),
                                    ("host.shm", "at least 4 GiB", "docs.docker.com"),
                                    ("host.steal", "under 5%", "/proc/stat"),
                                    ("host.somaxconn", ">= 1024", "listen() backlog")):
        f = result(machine, check)
        assert f.status == "pass", check
        assert f.evidence.expected.startswith(expected) and source in f.evidence.source, check


@pytest.mark.parametrize("capture_name, index", [
    ("smi_text/q-titan-v-560.35.03.txt", "cu126"),  # driver's CUDA 12.6: a current index
    ("smi_text/default-table-8x-h100-550.90.07.txt", "cu124"),  # CUDA 12.4: PyPI's newest torch would not run
])
def test_without_torch_the_skip_names_the_index_for_the_drivers_cuda(capture_name, index):
    f = result(with_gpus(capture_name, stack=Stack(torch=Torch(installed=False))), "stack.driver_cuda")
    assert f.status == "skip" and f"--index-url https://download.pytorch.org/whl/{index}`" in f.remedy
