"""The NVML sampler behind the benchmarks' power/clock/temperature series and `gpuvet watch`.

There is no GPU here, so NVML is replaced by a stand-in (the pattern of test_probe_nvml.py) that
answers per GPU handle and refuses the rest the way NVML does, with the real pynvml error classes.
The sampling loop is driven by hand through open()/sample_once(); only one test runs the thread.
"""

from __future__ import annotations

import json
import time
import types

import pynvml
import pytest

from gpuvet import samples, telemetry
from gpuvet.telemetry import COLUMNS, Sample, Sampler, snapshot, summarize, to_series


class _NvmlStandIn:
    """Answers nvmlDevice* calls from `answers` (a value, or a function of the call's arguments),
    refuses every other one with `refuse_with`, and counts init/shutdown and calls."""

    def __init__(self, monkeypatch, answers: dict[str, object],
                 refuse_with: int = pynvml.NVML_ERROR_NOT_SUPPORTED):
        self.inits = self.shutdowns = 0
        self.calls: dict[str, int] = {}
        # Every name answered is there even where this nvidia-ml-py predates it (the floor lacks
        # nvmlDeviceGetTemperatureV), as a newer nvidia-ml-py on the user's machine has it.
        for name in {*dir(pynvml), *answers}:
            if name.startswith(("nvmlDevice", "nvmlSystem")):
                monkeypatch.setattr(pynvml, name, self._fn(name, answers.get(name), name in answers, refuse_with),
                                    raising=False)
        monkeypatch.setattr(pynvml, "nvmlInit", self._init)
        monkeypatch.setattr(pynvml, "nvmlShutdown", self._shutdown)

    def _fn(self, name, value, answered, refuse_with):
        def call(*args):
            self.calls[name] = self.calls.get(name, 0) + 1
            if not answered:
                raise pynvml.NVMLError(refuse_with)
            return value(*args) if callable(value) else value

        return call

    def _init(self):
        self.inits += 1

    def _shutdown(self):
        self.shutdowns += 1


def _violation(ns: int):
    return types.SimpleNamespace(referenceTime=0, violationTime=ns)


def _healthy_gpu_answers(**overrides) -> dict[str, object]:
    """A busy H100-like GPU: every reading given, values distinct per field so mix-ups show."""
    clocks = {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619}
    violations = {pynvml.NVML_PERF_POLICY_POWER: _violation(5_000_000_000),
                  pynvml.NVML_PERF_POLICY_THERMAL: _violation(0)}
    answers = {
        "nvmlDeviceGetCount": 1,
        "nvmlDeviceGetHandleByIndex": lambda index: f"h{index}",
        "nvmlDeviceGetPowerUsage": 612_345,
        "nvmlDeviceGetEnforcedPowerLimit": 700_000,
        "nvmlDeviceGetClockInfo": lambda h, kind: clocks[kind],
        "nvmlDeviceGetTemperatureV": lambda h, sensor: 71,
        "nvmlDeviceGetUtilizationRates": types.SimpleNamespace(gpu=99, memory=40),
        "nvmlDeviceGetMemoryInfo": types.SimpleNamespace(total=80 * 2**30, used=3 * 2**30, free=77 * 2**30),
        "nvmlDeviceGetCurrentClocksEventReasons": 0x44,
        "nvmlDeviceGetCurrPcieLinkGeneration": 5,
        "nvmlDeviceGetCurrPcieLinkWidth": 16,
        "nvmlDeviceGetViolationStatus": lambda h, policy: violations[policy],
    }
    answers.update(overrides)
    return answers


def test_samples_carry_the_nvml_values(monkeypatch):
    _NvmlStandIn(monkeypatch, _healthy_gpu_answers())
    sampler = Sampler([0])
    assert sampler.open() and sampler.error is None
    taken = sampler.sample_once()
    s = taken[0]
    assert (s.power_w, s.power_limit_w) == (612.345, 700.0)
    assert (s.sm_mhz, s.mem_mhz, s.temp_c, s.util_pct, s.mem_used_mib) == (1980, 2619, 71.0, 99, 3 * 1024)
    assert s.reasons == 0x44  # the mask whole, not one bit
    assert (s.pcie_gen, s.pcie_width) == (5, 16)
    assert (s.violation_power_ns, s.violation_thermal_ns) == (5_000_000_000, 0)
    assert abs(s.t - time.time()) < 60
    assert sampler.latest() == {0: s}
    assert sampler.stop() == {0: [s]}
    assert sampler.unavailable == {}


def test_a_refused_reading_is_none_and_the_others_keep_coming(monkeypatch):
    answers = _healthy_gpu_answers()
    del answers["nvmlDeviceGetPowerUsage"]  # refused with NotSupported, as on some vGPU guests
    nvml = _NvmlStandIn(monkeypatch, answers)
    sampler = Sampler([0])
    sampler.open()
    samples = [sampler.sample_once()[0] for _ in range(3)]
    assert [s.power_w for s in samples] == [None, None, None]
    assert [s.sm_mhz for s in samples] == [1980, 1980, 1980]
    assert sampler.unavailable == {0: {"power_w": "not supported on this GPU or driver"}}
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == 1  # not asked again every tick
    sampler.stop()


def test_a_passing_failure_is_asked_again_next_tick(monkeypatch):
    answers = iter([pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN), 300_000])

    def power(_h):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    _NvmlStandIn(monkeypatch, _healthy_gpu_answers(nvmlDeviceGetPowerUsage=power))
    sampler = Sampler([0])
    sampler.open()
    assert [sampler.sample_once()[0].power_w for _ in range(2)] == [None, 300.0]
    assert sampler.unavailable == {}
    sampler.stop()


def test_a_gpu_that_falls_off_the_bus_is_lost_and_not_asked_again(monkeypatch):
    # Xid 79: from some moment on, every call on the GPU answers NVML_ERROR_GPU_IS_LOST.
    gone = {"now": False}

    def clock(_h, kind):
        if gone["now"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return 1980

    nvml = _NvmlStandIn(monkeypatch, _healthy_gpu_answers(nvmlDeviceGetClockInfo=clock))
    sampler = Sampler([0])
    sampler.open()
    assert sampler.sample_once()[0].sm_mhz == 1980 and sampler.lost == {}
    gone["now"] = True
    lost = sampler.sample_once()[0]
    assert sampler.lost == {0: "NVML: GPU is lost"}
    assert all(getattr(lost, c) is None for c in COLUMNS if c != "t")  # no half reading of a GPU that is gone
    calls = dict(nvml.calls)
    sampler.sample_once()
    assert nvml.calls == calls  # not asked again
    sampler.stop()


def test_old_driver_falls_back_to_the_old_calls(monkeypatch):
    answers = _healthy_gpu_answers(nvmlDeviceGetCurrentClocksThrottleReasons=0x4,
                                   nvmlDeviceGetTemperature=lambda h, sensor: 66)
    del answers["nvmlDeviceGetCurrentClocksEventReasons"], answers["nvmlDeviceGetTemperatureV"]
    _NvmlStandIn(monkeypatch, answers, refuse_with=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    sampler = Sampler([0])
    sampler.open()
    s = sampler.sample_once()[0]
    assert (s.reasons, s.temp_c) == (0x4, 66.0)
    assert sampler.unavailable == {}
    sampler.stop()


def test_memory_in_use_is_read_as_nvidia_smi_shows_it_without_the_drivers_reserve(monkeypatch):
    reserve = 900 * 2**20  # v1 counts the driver's reserve as used: a watched job would seem to leak it

    def memory(handle, version=None):
        used = 3 * 2**30 + (0 if version else reserve)
        return types.SimpleNamespace(total=80 * 2**30, used=used, free=80 * 2**30 - used)

    _NvmlStandIn(monkeypatch, _healthy_gpu_answers(nvmlDeviceGetMemoryInfo=memory))
    sampler = Sampler([0])
    sampler.open()
    assert sampler.sample_once()[0].mem_used_mib == 3 * 1024
    sampler.stop()


def test_an_old_nvidia_ml_py_without_memory_v2_still_gives_memory_every_tick(monkeypatch):
    old_call = lambda handle: types.SimpleNamespace(total=80 * 2**30, used=5 * 2**30, free=75 * 2**30)  # noqa: E731
    stand_in = _NvmlStandIn(monkeypatch, _healthy_gpu_answers(nvmlDeviceGetMemoryInfo=old_call))
    sampler = Sampler([0])
    sampler.open()
    assert [sampler.sample_once()[0].mem_used_mib for _ in range(3)] == [5 * 1024] * 3
    assert stand_in.calls["nvmlDeviceGetMemoryInfo"] == 4  # the v2 form refused once, then v1 only
    sampler.stop()


def test_a_gpu_that_cannot_be_opened_is_reported_and_the_others_sampled(monkeypatch):
    def handle(index):
        if index == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        return f"h{index}"

    _NvmlStandIn(monkeypatch, _healthy_gpu_answers(nvmlDeviceGetCount=3, nvmlDeviceGetHandleByIndex=handle))
    sampler = Sampler(None)  # None: every GPU NVML counts
    assert sampler.open()
    assert sorted(sampler.sample_once()) == [0, 2]
    assert sampler.error is None
    assert list(sampler.gpu_errors) == [1] and "no permission" in sampler.gpu_errors[1]
    assert sorted(sampler.stop()) == [0, 2]


def test_no_gpu_opened_is_an_error(monkeypatch):
    def handle(index):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    nvml = _NvmlStandIn(monkeypatch, _healthy_gpu_answers(nvmlDeviceGetHandleByIndex=handle))
    sampler = Sampler([0])
    sampler.start()
    assert sampler.stop() == {}
    assert "fallen off the bus" in sampler.error
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_power_limit_is_read_once_a_second(monkeypatch):
    nvml = _NvmlStandIn(monkeypatch, _healthy_gpu_answers())
    now = [1000.0]
    monkeypatch.setattr(telemetry, "_monotonic", lambda: now[0])
    sampler = Sampler([0])
    sampler.open()
    for tick in range(25):  # 2.5 s at 10 Hz
        now[0] = 1000.0 + tick / 10
        assert sampler.sample_once()[0].power_limit_w == 700.0
    assert nvml.calls["nvmlDeviceGetEnforcedPowerLimit"] == 3  # at 0 s, 1 s, 2 s
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == 25
    sampler.stop()


def test_samples_kept_are_capped():
    assert Sampler([0], interval_s=0.1).max_samples >= 36_000  # a 60-minute soak at 10 Hz fits


def test_the_cap_drops_the_oldest(monkeypatch):
    _NvmlStandIn(monkeypatch, _healthy_gpu_answers())
    sampler = Sampler([0], max_samples=3)
    sampler.open()
    taken = [sampler.sample_once()[0] for _ in range(5)]
    assert sampler.stop()[0] == taken[2:]


def test_start_stop_runs_the_thread_and_stop_twice_shuts_nvml_once(monkeypatch):
    nvml = _NvmlStandIn(monkeypatch, _healthy_gpu_answers())
    sampler = Sampler([0], interval_s=0.01)
    sampler.start()
    deadline = time.monotonic() + 10
    while not sampler.latest() and time.monotonic() < deadline:  # wait for the first sample, not for a time
        time.sleep(0.005)
    first = sampler.stop()
    assert first[0] and first[0][0].sm_mhz == 1980
    assert not sampler._thread.is_alive()
    assert sampler.sample_once() == {}  # no NVML calls after shutdown
    assert sampler.stop() == first  # the second stop returns the same samples, nothing new
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_stop_does_not_wait_out_the_interval(monkeypatch):
    _NvmlStandIn(monkeypatch, _healthy_gpu_answers())
    sampler = Sampler([0], interval_s=3600)  # a sleeping loop would hold stop() for an hour
    sampler.start()
    deadline = time.monotonic() + 10
    while not sampler.latest() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(sampler.stop()[0]) == 1
    assert not sampler._thread.is_alive()


def test_stop_without_start_or_after_failed_nvml_does_not_shut_down(monkeypatch):
    nvml = _NvmlStandIn(monkeypatch, _healthy_gpu_answers())

    def no_driver():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    assert Sampler([0]).stop() == {}
    failed = Sampler([0])
    failed.start()
    assert failed.stop() == {} and failed.stop() == {}
    assert "driver is not loaded" in failed.error
    assert nvml.shutdowns == 0  # shutting down an NVML that never started would unbalance its count


@pytest.mark.parametrize("previous, now, expected", [
    (10.0, 10.03, 10.1),  # work took 30 ms: sleep until the tick, not a full interval after the work
    (10.0, 10.0, 10.1),  # work took no time
    (10.0, 10.12, 10.2),  # overran one tick by a little: the next one on the grid
    (10.0, 10.35, 10.4),  # overran three ticks: skip them, do not burst
])
def test_ticks_keep_a_steady_cadence(previous, now, expected):
    assert samples.next_tick(previous, now, 0.1) == pytest.approx(expected)


def test_snapshot_reads_each_gpu_once(monkeypatch):
    nvml = _NvmlStandIn(monkeypatch, _healthy_gpu_answers(nvmlDeviceGetCount=2))
    samples, error = snapshot()
    assert error is None and sorted(samples) == [0, 1]
    assert samples[1].power_w == 612.345
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


# -- on this machine: no NVIDIA driver ---------------------------------------------------------------

def test_no_driver_here_gives_no_samples_and_says_why():
    sampler = Sampler([0])
    sampler.start()
    samples = sampler.stop()
    if sampler.error is None:  # pragma: no cover - only where a GPU is present
        pytest.skip("this machine has an NVIDIA driver")
    assert samples == {} and sampler.latest() == {}
    assert "driver" in sampler.error or "NVML" in sampler.error
    assert sampler.stop() == {}


def test_snapshot_without_driver_returns_the_reason():
    samples, error = snapshot()
    if error is None and samples:  # pragma: no cover - only where a GPU is present
        pytest.skip("this machine has an NVIDIA driver")
    assert samples == {} and ("driver" in error or "NVML" in error)


# -- to_series / summarize on synthetic samples -----------------------------------------------------

def _synthetic_samples() -> list[Sample]:
    """Four synthetic samples, 0.1 s apart: 350 W of a 700 W limit, then power-capped and hot."""
    t0 = 1_700_000_000.0
    masks = [0x0, 0x4, 0x44, 0x4]  # none, sw_power_cap, sw_power_cap | hw_thermal_slowdown, sw_power_cap
    return [
        Sample(t=t0 + i / 10, power_w=350.0 + 100 * i, power_limit_w=700.0, sm_mhz=1980 - 100 * i, mem_mhz=2619,
               temp_c=60.0 + i, util_pct=100 - i, mem_used_mib=1000, reasons=masks[i], pcie_gen=4 + (i > 0),
               pcie_width=16, violation_power_ns=2_000_000_000 + i * 100_000_000, violation_thermal_ns=None)
        for i in range(4)
    ]


def test_to_series_is_columnar_relative_and_json_safe():
    samples = _synthetic_samples()
    samples[1].temp_c = float("nan")  # a bogus reading must not break the record's JSON
    series = to_series(samples, "sustained_matmul", "gpu0", 0.1)
    assert series["columns"] == list(COLUMNS) and COLUMNS[0] == "t"
    assert (series["name"], series["subject"], series["interval_s"]) == ("sustained_matmul", "gpu0", 0.1)
    assert [row[0] for row in series["rows"]] == [0.0, 0.1, 0.2, 0.3]
    assert series["t0"] == samples[0].t
    power = COLUMNS.index("power_w")
    assert [row[power] for row in series["rows"]] == [350.0, 450.0, 550.0, 650.0]
    assert series["rows"][1][COLUMNS.index("temp_c")] is None
    assert json.loads(json.dumps(series, allow_nan=False)) == series


def test_to_series_of_nothing():
    assert to_series([], "x", "gpu0", 0.1)["rows"] == []


def test_summarize_gives_what_the_judge_needs():
    summary = summarize(_synthetic_samples())
    assert summary["count"] == 4 and summary["duration_s"] == 0.3
    assert summary["power"] == {"mean_w": 500.0, "max_w": 650.0, "mean_pct_of_limit": pytest.approx(71.43)}
    assert summary["sm_mhz"] == {"mean": 1830.0, "min": 1680, "max": 1980}
    assert summary["temp_c"] == {"max": 63.0} and summary["util_pct"] == {"mean": 98.5}
    # 0x44 counts for both of its flags; share is of samples, not of flags seen.
    assert summary["reasons"] == {"sw_power_cap": 0.75, "hw_thermal_slowdown": 0.25}
    assert summary["violation_s"] == {"power": 0.3, "thermal": None}
    assert summary["pcie"] == {"max_gen": 5, "max_width": 16}
    json.dumps(summary, allow_nan=False)


def test_summarize_unknown_is_not_zero():
    samples = [Sample(t=1.0), Sample(t=2.0)]  # synthetic: a GPU that gave no readings
    summary = summarize(samples)
    assert summary["reasons"] is None and summary["power"]["mean_w"] is None
    assert summary["violation_s"] == {"power": None, "thermal": None}
    assert summarize([])["count"] == 0 and summarize([])["duration_s"] is None


def test_summarize_names_unlisted_bits_and_ignores_a_reset_counter():
    # synthetic: pynvml's board-limit bit, and a counter reset by a driver reload
    samples = [Sample(t=0.0, reasons=0x200, violation_power_ns=9), Sample(t=1.0, reasons=0x0, violation_power_ns=1)]
    summary = summarize(samples)
    assert summary["reasons"] == {"0x200": 0.5}
    assert summary["violation_s"]["power"] is None


def test_the_mean_power_comes_from_the_energy_counter(monkeypatch):
    """Energy since the driver loaded, read each tick: the mean power of a window is the energy
    it used over its length, whatever the power did between samples."""
    clock = [1000.0]
    energy = iter([5_000_000, 5_650_000, 6_300_000])  # +650 J a second
    monkeypatch.setattr(time, "time", lambda: clock[0])
    _NvmlStandIn(monkeypatch, _healthy_gpu_answers(nvmlDeviceGetTotalEnergyConsumption=lambda handle: next(energy)))
    sampler = Sampler([0])
    assert sampler.open()
    for _ in range(3):
        sampler.sample_once()
        clock[0] += 1.0
    readings = sampler.energy()[0]
    assert telemetry.mean_power_w(readings) == pytest.approx(650.0)
    assert telemetry.mean_power_w(readings, start=1001.5) is None  # one reading left in the window
    assert telemetry.mean_power_w([(0.0, 10), (1.0, 5)]) is None  # the counter went back: a driver reload
