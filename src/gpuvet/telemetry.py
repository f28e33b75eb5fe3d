"""NVML telemetry: power, clocks, temperature and clock-event reasons, sampled in the background.

Benchmarks run a `Sampler` (~10 Hz) around a sustained load so the judge can see whether the GPU
held its clocks or was held back by power or heat; `gpuvet watch` shows `Sampler.latest()` live.

Tolerant like `probe.nvml`: a reading the GPU or driver lacks stays None (and is not asked again),
a GPU that cannot be opened is skipped with its reason, and nothing raises out of this module.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from .probe.nvml import error_reason, init_error, pynvml
# Re-exported: benchmarks and tests take the sample type and its record forms from here too.
from .samples import COLUMNS, Sample, next_tick, summarize, to_series  # noqa: F401

_MIB = 1024 * 1024
_KEEP_S = 65 * 60  # samples kept per GPU: a 60-minute soak plus margin, whatever the interval
_JOIN_TIMEOUT_S = 2.0  # a sick GPU can block one NVML call for a while; stop() does not wait longer

# Swapped out by tests that drive time by hand.
_monotonic = time.monotonic


# -- what is read, and how -------------------------------------------------------------------------

@dataclass(frozen=True)
class _Reading:
    """One Sample field: the NVML calls that give it (preferred first) and how to turn the answer
    into the field's value."""

    field: str
    calls: tuple[tuple[str, tuple[Any, ...]], ...]  # (pynvml function name, args after the handle)
    convert: Callable[[Any], Any] = lambda value: value
    every_s: float = 0.0  # read at most this often; the last value is reused in between


def _watts(milliwatts: int) -> float:
    return milliwatts / 1000.0


@functools.lru_cache(maxsize=1)
def _readings() -> tuple[_Reading, ...]:
    # Built on first use: the constants need pynvml, which a broken install may lack.
    p = pynvml
    return (
        # nvmlDeviceGetPowerUsage: what nvidia-smi shows as power.draw, a 1 s average on Ampere and
        # newer; the exact mean of a window comes from the energy counter (Sampler.energy).
        _Reading("power_w", (("nvmlDeviceGetPowerUsage", ()),), _watts),
        # The enforced limit only changes when someone sets it: once a second is plenty.
        _Reading("power_limit_w", (("nvmlDeviceGetEnforcedPowerLimit", ()),), _watts, every_s=1.0),
        _Reading("sm_mhz", (("nvmlDeviceGetClockInfo", (p.NVML_CLOCK_SM,)),)),
        _Reading("mem_mhz", (("nvmlDeviceGetClockInfo", (p.NVML_CLOCK_MEM,)),)),
        # TemperatureV replaces the deprecated call; old drivers only have the latter.
        _Reading("temp_c", (("nvmlDeviceGetTemperatureV", (p.NVML_TEMPERATURE_GPU,)),
                            ("nvmlDeviceGetTemperature", (p.NVML_TEMPERATURE_GPU,))), float),
        _Reading("util_pct", (("nvmlDeviceGetUtilizationRates", ()),), lambda u: u.gpu),
        # v2 (drivers 510+) as the probe reads it: "used" without the driver's reserve, which v1
        # counts as used; old drivers lack it (FunctionNotFound) and answer v1.
        _Reading("mem_used_mib", (("nvmlDeviceGetMemoryInfo", (p.nvmlMemory_v2,)), ("nvmlDeviceGetMemoryInfo", ())),
                 lambda m: int(m.used // _MIB)),
        # "Event" is the name since driver 535; the "throttle" name is gone in CUDA 14.
        _Reading("reasons", (("nvmlDeviceGetCurrentClocksEventReasons", ()),
                             ("nvmlDeviceGetCurrentClocksThrottleReasons", ()))),
        _Reading("pcie_gen", (("nvmlDeviceGetCurrPcieLinkGeneration", ()),)),
        _Reading("pcie_width", (("nvmlDeviceGetCurrPcieLinkWidth", ()),)),
        # Not nvmlDeviceGetPcieThroughput here: it blocks ~20 ms per call.
        _Reading("violation_power_ns", (("nvmlDeviceGetViolationStatus", (p.NVML_PERF_POLICY_POWER,)),),
                 lambda v: v.violationTime),
        _Reading("violation_thermal_ns", (("nvmlDeviceGetViolationStatus", (p.NVML_PERF_POLICY_THERMAL,)),),
                 lambda v: v.violationTime),
    )


def gpu_gone_reason(err: BaseException) -> str | None:
    """Why the whole GPU can no longer be read, for an NVML error that says so and stays (the GPU
    fell off the bus, needs a reset, the driver went away or was replaced under us); None for any
    other error. The watch shows it as the GPU's state instead of dashes."""
    code = getattr(err, "value", None)
    if pynvml is None or code is None:
        return None
    return {
        pynvml.NVML_ERROR_GPU_IS_LOST: "NVML: GPU is lost",
        pynvml.NVML_ERROR_RESET_REQUIRED: "NVML: GPU requires a reset",
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "NVML: the NVIDIA kernel driver is not loaded any more",
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "NVML: the driver was replaced under the running library "
                                                   "(library/kernel version mismatch)",
        pynvml.NVML_ERROR_GPU_NOT_FOUND: "NVML: GPU not found",
    }.get(code)


def is_permanent_error(err: BaseException) -> bool:
    """A failure that would repeat on every tick: the GPU, driver or nvidia-ml-py lacks the call."""
    if isinstance(err, (AttributeError, TypeError)):  # function missing from this nvidia-ml-py, or older arguments
        return True
    return getattr(err, "value", None) in (
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
        getattr(pynvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", pynvml.NVML_ERROR_INVALID_ARGUMENT),
    )


class _GpuReader:
    """Reads one GPU. A call the GPU or driver lacks is dropped for good (asking for NotSupported
    ten times a second only costs time) and its reason kept in `unavailable`; an error that says
    the whole GPU is gone (gpu_gone_reason) is kept in `lost`, and the GPU is not asked again (its
    samples carry the time alone); any other failure leaves the field None for this tick only."""

    def __init__(self, index: int, handle: Any):
        self.index = index
        self.handle = handle
        self.unavailable: dict[str, str] = {}
        self.lost: str | None = None
        self._calls = {r.field: list(r.calls) for r in (*_readings(), _ENERGY)}
        self._last: dict[str, tuple[float, Any]] = {}  # field -> (monotonic read time, value)
        self.last_energy: tuple[float, int] | None = None  # (time.time(), mJ since the driver loaded)

    def read(self) -> Sample:
        sample = Sample(t=time.time())
        for reading in _readings():
            if self.lost is not None:
                break
            setattr(sample, reading.field, self._value(reading))
        if self.lost is not None:  # what was read before the GPU went is not a reading of it either
            return Sample(t=sample.t)
        millijoules = self._call(_ENERGY)
        self.unavailable.pop(_ENERGY.field, None)  # not a sample's field: its absence only leaves the mean to the samples
        self.last_energy = (sample.t, millijoules) if isinstance(millijoules, int) else None
        return sample

    def _value(self, reading: _Reading) -> Any:
        if reading.every_s:
            now = _monotonic()
            last = self._last.get(reading.field)
            if last is not None and now - last[0] < reading.every_s:
                return last[1]
            value = self._call(reading)
            self._last[reading.field] = (now, value)
            return value
        return self._call(reading)

    def _call(self, reading: _Reading) -> Any:
        calls = self._calls[reading.field]
        while calls:
            name, args = calls[0]
            try:
                return reading.convert(getattr(pynvml, name)(self.handle, *args))
            except Exception as err:  # NVMLError, a missing function, an odd struct
                gone = gpu_gone_reason(err)
                if gone is not None:
                    self.lost = gone
                    return None
                if not is_permanent_error(err):
                    return None
                calls.pop(0)  # try the next call from now on
                if not calls:
                    self.unavailable[reading.field] = error_reason(err)
        return None


# Volta and newer: the total energy since the driver loaded, in mJ.
_ENERGY = _Reading("energy_mj", (("nvmlDeviceGetTotalEnergyConsumption", ()),), int)


def mean_power_w(energy: list[tuple[float, int]], start: float | None = None, end: float | None = None) -> float | None:
    """Mean power over [start, end] (epoch seconds; None: all) from the energy counter's readings;
    None with fewer than two readings in it or a counter that went back (driver reload)."""
    inside = [(t, mj) for t, mj in energy if (start is None or t >= start) and (end is None or t <= end)]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0] or inside[-1][1] < inside[0][1]:
        return None
    return (inside[-1][1] - inside[0][1]) / 1000.0 / (inside[-1][0] - inside[0][0])


def _open_gpus(indices: list[int] | None) -> tuple[list[_GpuReader], dict[int, str], str | None]:
    """(readers, per-GPU reasons for those that could not be opened, error when none could be listed)."""
    if indices is None:
        try:
            indices = list(range(pynvml.nvmlDeviceGetCount()))
        except Exception as err:
            return [], {}, f"NVML cannot count the GPUs: {error_reason(err)}"
    readers, errors = [], {}
    for index in indices:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as err:
            errors[index] = f"cannot open GPU {index}: {error_reason(err)}"
            continue
        readers.append(_GpuReader(index, handle))
    return readers, errors, None


# -- the sampler -----------------------------------------------------------------------------------

class Sampler:
    """Samples the given GPUs every `interval_s` on a background thread.

    Single use: start() once, stop() when done (stop() again is harmless). `error` says why there
    are no samples (no driver, NVML failed, no GPU could be opened) or why sampling ended early;
    `gpu_errors` says why a given GPU was skipped; `unavailable` says, per GPU, which readings it
    does not give and why; `lost` names the GPUs that went away while sampled (fell off the bus...).
    """

    def __init__(self, gpu_indices: list[int] | None, interval_s: float = 0.1, max_samples: int | None = None):
        self.gpu_indices = None if gpu_indices is None else list(gpu_indices)  # None: every GPU
        self.interval_s = interval_s
        self.max_samples = max_samples or max(1, math.ceil(_KEEP_S / interval_s))
        self.error: str | None = None
        self.gpu_errors: dict[int, str] = {}
        self._readers: list[_GpuReader] = []
        self._samples: dict[int, deque[Sample]] = {}
        # The energy counter's readings, apart from the samples: the mean power of any window, exactly.
        self._energy: dict[int, deque[tuple[float, int]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._opened = False
        self._nvml_started = False
        self._closed = False

    @property
    def unavailable(self) -> dict[int, dict[str, str]]:
        return {r.index: dict(r.unavailable) for r in self._readers if r.unavailable}

    @property
    def lost(self) -> dict[int, str]:
        """GPU index -> why it can no longer be read (gpu_gone_reason), for the GPUs that went away."""
        return {r.index: r.lost for r in self._readers if r.lost is not None}

    def open(self) -> bool:
        """Start NVML and open the GPUs, without a thread. start() calls it; tests and snapshot()
        call it directly and drive sample_once() themselves. False when nothing can be sampled."""
        if self._opened:
            return bool(self._readers) and not self._closed
        self._opened = True
        try:
            self.error = init_error()
            if self.error is None:
                self._nvml_started = True
                self._readers, self.gpu_errors, self.error = _open_gpus(self.gpu_indices)
                self._samples = {r.index: deque(maxlen=self.max_samples) for r in self._readers}
                if not self._readers and self.gpu_errors:
                    self.error = "; ".join(self.gpu_errors.values())
        except Exception as err:  # never raise into a benchmark; say why instead
            self.error = f"telemetry could not start: {type(err).__name__}: {err}"
            self._readers = []
        return bool(self._readers)

    def start(self) -> None:
        if self._thread is not None or self._closed or not self.open():
            return
        self._thread = threading.Thread(target=self._run, name="gpuvet-telemetry", daemon=True)
        self._thread.start()

    def sample_once(self) -> dict[int, Sample]:
        """Read every open GPU once and keep the samples. The background thread calls this each tick."""
        if self._closed:
            return {}
        taken = {reader.index: reader.read() for reader in self._readers}
        with self._lock:
            for index, sample in taken.items():
                self._samples[index].append(sample)
            for reader in self._readers:
                if reader.last_energy is not None:
                    self._energy.setdefault(reader.index, deque(maxlen=self.max_samples)).append(reader.last_energy)
        return taken

    def latest(self) -> dict[int, Sample]:
        with self._lock:
            return {index: kept[-1] for index, kept in self._samples.items() if kept}

    def energy(self) -> dict[int, list[tuple[float, int]]]:
        """GPU index -> (time, mJ) readings of the energy counter, for the GPUs that have one."""
        with self._lock:
            return {index: list(kept) for index, kept in self._energy.items()}

    def stop(self) -> dict[int, list[Sample]]:
        """Stop sampling, release NVML, and return the samples kept per opened GPU."""
        self._stop.set()
        if self._thread is not None:  # the Event wakes it at once: only a pass in progress is waited for
            self._thread.join(timeout=_JOIN_TIMEOUT_S)
        self._closed = True
        # A thread stuck inside an NVML call must not have NVML shut down under it; the process
        # releases NVML at exit (the thread is a daemon).
        if self._thread is None or not self._thread.is_alive():
            self._shutdown_nvml()
        with self._lock:
            return {index: list(kept) for index, kept in self._samples.items()}

    def _shutdown_nvml(self) -> None:
        # NVML counts nvmlInit calls: exactly one shutdown for our one init.
        if self._nvml_started:
            self._nvml_started = False
            try:
                pynvml.nvmlShutdown()
            except Exception:
                pass

    def _run(self) -> None:
        tick = _monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as err:  # a bug, not a GPU answer: stop sampling and say why
                self.error = f"sampling stopped: {type(err).__name__}: {err}"
                return
            tick = next_tick(tick, _monotonic(), self.interval_s)
            self._stop.wait(max(0.0, tick - _monotonic()))


def snapshot(gpu_indices: list[int] | None = None) -> tuple[dict[int, Sample], str | None]:
    """One reading of every (or the given) GPU: (samples, error). The error names the GPUs that could
    not be read. Each call starts and stops NVML; a live monitor should keep a Sampler instead."""
    sampler = Sampler(gpu_indices, interval_s=1.0, max_samples=1)
    sampler.open()
    samples = sampler.sample_once()
    sampler.stop()
    error = sampler.error or ("; ".join(sampler.gpu_errors.values()) or None)
    return samples, error


