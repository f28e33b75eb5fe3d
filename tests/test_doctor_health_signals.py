"""gpuvet doctor answers from the fleet health checks: a kernel log with Xid 79 confirms a GPU
fault for "slower and slower"; a container without GPU nodes confirms "container cannot see the GPU"."""

from __future__ import annotations

from pathlib import Path

from gpuvet import doctor, judge, runner
from gpuvet.facts import ContainerRuntime, Host, Stack

FIXTURES = Path(__file__).parent / "fixtures"


def _result(symptom: str, record, words: str) -> doctor.CauseResult:
    (s,) = [s for s in doctor.SYMPTOMS if s.name == symptom]
    return next(r for r in doctor.diagnose(s, record).results if words in r.cause.name)


def test_xid79_in_the_kernel_log_confirms_a_gpu_fault_for_slower_and_slower():
    record = runner.inspect([str(FIXTURES / "edited/dmesg-tesla-k40m-xid79-390.30-edited-bus-86-as-h100-gpu3.txt"),
                             str(FIXTURES / "smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt")])
    result = _result("slower-and-slower", record, "GPU fault mid-run")
    assert result.state == doctor.CONFIRMED and any("gpu3" in f and "Xid 79" in f for f in result.figures)
    clean = runner.inspect([str(FIXTURES / "kernel_log/kmsg-nvswitch-no-nvidia-fault.log"),
                            str(FIXTURES / "smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt")])
    assert _result("slower-and-slower", clean, "GPU fault mid-run").state == doctor.RULED_OUT


def test_a_container_without_gpu_nodes_confirms_the_driver_is_not_reachable():
    record = runner.inspect([str(FIXTURES / "smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt")])
    record.machine.host = Host(container="docker")
    record.machine.stack = Stack(container=ContainerRuntime(dev_nodes=["nvidiactl"]))
    record.findings = judge.judge(record.machine)
    result = _result("container-no-gpu", record, "not reachable here")
    assert result.state == doctor.CONFIRMED and any("started without GPUs" in f for f in result.figures)
