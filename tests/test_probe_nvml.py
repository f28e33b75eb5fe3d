"""The live NVML backend's tolerance: every call a GPU or driver lacks becomes "not available"
with its reason, never a crash.

There is no GPU here, so the NVML library is replaced by a stand-in that answers a few calls and
refuses the rest the way NVML does on a vGPU guest (NotSupported) or an old driver
(FunctionNotFound). The real pynvml error classes are used.
"""

from __future__ import annotations


import pynvml

from gpuvet.probe import live, nvml


def test_no_driver_here_is_reported_not_raised():
    error = nvml.init_error()
    assert error is None or "driver" in error or "NVML" in error  # this machine has no NVIDIA driver


class _Memory:
    total, used, free = 80 * 2**30, 2**20, 80 * 2**30 - 2**20


def _stand_in(monkeypatch, answers: dict[str, object], refuse_with: int = pynvml.NVML_ERROR_NOT_SUPPORTED):
    """Replace every nvmlDevice*/nvmlSystem* call: answer from `answers`, refuse the rest."""

    def refuse(*_args, **_kwargs):
        raise pynvml.NVMLError(refuse_with)

    for name in {*dir(pynvml), *answers}:  # answered names exist even where this nvidia-ml-py predates them
        if name.startswith(("nvmlDevice", "nvmlSystem")):
            value = answers.get(name)
            fn = (lambda v: (lambda *a, **k: v(*a) if callable(v) else v))(value) if name in answers else refuse
            monkeypatch.setattr(pynvml, name, fn, raising=False)
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)


def test_vgpu_like_guest_where_most_calls_are_not_supported(monkeypatch):
    _stand_in(monkeypatch, {
        "nvmlSystemGetDriverVersion": "550.54.14",
        "nvmlSystemGetCudaDriverVersion_v2": 12040,
        "nvmlDeviceGetCount": 1,
        "nvmlDeviceGetHandleByIndex": "handle0",
        "nvmlDeviceGetName": "NVIDIA A100-SXM4-80GB",
        "nvmlDeviceGetMemoryInfo": _Memory(),
        "nvmlDeviceGetVirtualizationMode": 2,
    })
    assert nvml.init_error() is None
    driver, gpus, topology, error = nvml.collect()
    assert error is None and driver.version == "550.54.14" and driver.cuda_version == "12.4"
    (gpu,) = gpus
    assert gpu.name == "NVIDIA A100-SXM4-80GB" and gpu.memory_total_mib == 80 * 1024
    assert gpu.virtualization_mode == "vgpu"
    assert gpu.power.enforced_limit_w is None
    assert gpu.unavailable["power.enforced_limit_w"] == "not supported on this GPU or driver"
    assert gpu.unavailable["pcie.current_gen"] == "not supported on this GPU or driver"
    assert gpu.nvlinks is None and "nvlinks" in gpu.unavailable
    assert gpu.clocks.event_reasons is None and topology is None


def test_old_driver_without_the_calls(monkeypatch):
    _stand_in(monkeypatch, {"nvmlDeviceGetCount": 1, "nvmlDeviceGetHandleByIndex": "h", "nvmlDeviceGetName": "Tesla K80"},
              refuse_with=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    _, (gpu,), _, _ = nvml.collect()
    assert gpu.name == "Tesla K80"
    assert "driver too old" in gpu.unavailable["power.draw_w"]


def test_a_gpu_that_cannot_be_opened_keeps_its_place(monkeypatch):
    def handle(index):
        if index == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        return f"h{index}"

    _stand_in(monkeypatch, {"nvmlDeviceGetCount": 2, "nvmlDeviceGetHandleByIndex": handle, "nvmlDeviceGetName": "NVIDIA L4"})
    _, gpus, _, _ = nvml.collect()
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].name == "NVIDIA L4" and gpus[1].name is None
    assert "no permission" in gpus[1].unavailable["gpu"]


def test_live_collect_never_raises_and_explains_missing_gpus():
    machine = live.collect(steal_window_s=0.05, import_torch=False)
    assert machine.source == "live" and machine.host is not None and machine.stack is not None
    if not machine.gpus:
        assert machine.gpu_error


def test_a_hung_probe_is_abandoned_at_its_deadline(monkeypatch):
    import threading

    release = threading.Event()
    monkeypatch.setattr(live.stack, "collect_stack", lambda **_: release.wait(5))
    monkeypatch.setattr(live, "_Isolated", _short_deadline(live._Isolated))
    machine = live.collect(steal_window_s=0.05, import_torch=False)
    release.set()
    assert machine.stack is None and "timed out" in machine.probe_errors["stack"]
    assert machine.host is not None  # the other probes still reported


def _short_deadline(cls):
    class Short(cls):
        def __init__(self, name, fn, timeout_s):
            super().__init__(name, fn, 0.2 if name == "stack" else timeout_s)

    return Short


def test_memory_in_use_leaves_out_the_drivers_reserve_like_nvidia_smi(monkeypatch):
    """v1 memory info counts the driver's reserve (~0.5-0.9 GiB) as used: an idle GPU would look
    like it holds a process nobody lists. v2 (drivers 510+) reports it apart, as nvidia-smi does."""
    class V1:
        total, used, free = 80 * 2**30, 600 * 2**20, 80 * 2**30 - 600 * 2**20

    class V2:
        total, reserved, used, free = 80 * 2**30, 600 * 2**20, 0, 80 * 2**30 - 600 * 2**20

    def memory_info(_handle, version=None):
        if version is None:
            return V1()
        if version != pynvml.nvmlMemory_v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return V2()

    _stand_in(monkeypatch, {"nvmlDeviceGetCount": 1, "nvmlDeviceGetHandleByIndex": "h", "nvmlDeviceGetName": "NVIDIA H100"})
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", memory_info)
    _, (gpu,), _, _ = nvml.collect()
    assert gpu.memory_used_mib == 0 and gpu.memory_reserved_mib == 600 and gpu.memory_total_mib == 80 * 1024

    def old_driver(_handle, version=None):  # v2 not supported: v1's figures are still reported
        if version is not None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return V1()

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", old_driver)
    _, (gpu,), _, _ = nvml.collect()
    assert gpu.memory_used_mib == 600 and gpu.memory_reserved_mib is None


def _one_gpu(**answers: object) -> dict[str, object]:
    return {"nvmlSystemGetDriverVersion": "550.54.14", "nvmlDeviceGetCount": 1, "nvmlDeviceGetHandleByIndex": "h0",
            "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3", "nvmlDeviceGetMemoryInfo": _Memory(), **answers}


def _raises(code: int):
    def call(*_args):
        raise pynvml.NVMLError(code)
    return call


def test_an_ecc_read_that_fails_live_is_a_failure_not_no_errors(monkeypatch):
    # nvidia-smi prints "Unknown Error" where NVML answers NVML_ERROR_UNKNOWN: a GPU in trouble. The
    # counters were read as "not read" and gpu.ecc passed on the mode alone ("ECC on").
    from gpuvet import judge
    from gpuvet.facts import ECC_READ_FAILED, Machine

    _stand_in(monkeypatch, _one_gpu(nvmlDeviceGetEccMode=(1, 1),
                                    nvmlDeviceGetTotalEccErrors=_raises(pynvml.NVML_ERROR_UNKNOWN),
                                    nvmlDeviceGetRemappedRows=_raises(pynvml.NVML_ERROR_UNKNOWN)))
    driver, gpus, _, _ = nvml.collect()
    assert "ecc.volatile_uncorrected" in gpus[0].unavailable[ECC_READ_FAILED]
    ecc = [f for f in judge.judge(Machine(driver=driver, gpus=gpus)) if f.check == "gpu.ecc"]
    assert [f.status for f in ecc] == ["fail"] and ecc[0].action == "reset_gpu"


def test_ecc_counters_a_gpu_lacks_are_not_a_failure(monkeypatch):
    from gpuvet.facts import ECC_READ_FAILED

    _stand_in(monkeypatch, _one_gpu(nvmlDeviceGetEccMode=(1, 1)))  # every counter: NotSupported
    _, gpus, _, _ = nvml.collect()
    assert ECC_READ_FAILED not in gpus[0].unavailable


def test_fans_are_read_per_fan_and_a_failed_one_is_named(monkeypatch):
    # A GeForce card's two fans, the second one's reading failing as nvidia-smi's ERR! does.
    from gpuvet import judge
    from gpuvet.facts import Machine

    speeds = {0: 38}
    _stand_in(monkeypatch, _one_gpu(nvmlDeviceGetNumFans=2,
                                    nvmlDeviceGetFanSpeed_v2=lambda h, fan: speeds[fan] if fan in speeds else _raises(
                                        pynvml.NVML_ERROR_UNKNOWN)()))
    driver, gpus, _, _ = nvml.collect()
    assert gpus[0].thermal.fan_pct == [38, None] and "fan 1" in gpus[0].unavailable["thermal.fan_pct"]
    fans = [f for f in judge.judge(Machine(driver=driver, gpus=gpus)) if f.check == "gpu.fan_failure"]
    assert [f.status for f in fans] == ["fail"] and "fan 1 of 2" in fans[0].summary and fans[0].action == "ask_provider"
    speeds[1] = 41  # both answering
    _, gpus, _, _ = nvml.collect()
    assert gpus[0].thermal.fan_pct == [38, 41]


def test_a_passive_gpu_without_fans_skips_the_fan_check(monkeypatch):
    from gpuvet import judge
    from gpuvet.facts import Machine

    _stand_in(monkeypatch, _one_gpu())  # nvmlDeviceGetNumFans: NotSupported, as on an SXM board
    driver, gpus, _, _ = nvml.collect()
    fans = [f for f in judge.judge(Machine(driver=driver, gpus=gpus)) if f.check == "gpu.fan_failure"]
    assert [f.status for f in fans] == ["skip"] and "passively cooled" in fans[0].summary
