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
