"""The CUDA paths of pcie, latency and membw on a machine without a GPU, run against a stand-in for
torch.cuda that records what the code asks of CUDA: where the pinned host buffer comes from and
from which thread, when it is unpinned, the span of the pinned load the parent samples the link
in, which device is current while launches are timed, and which caches are emptied. Tensors stay
on the CPU and "events" read the host clock: this checks control flow and bookkeeping, not CUDA."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gpuvet.bench import latency, membw, pcie
from gpuvet.bench.common import BenchContext, Budget
from gpuvet.judge import judge
from gpuvet.probe import capture
from gpuvet.record import Measurement
from cuda_stand_in import CpuTorch, HostClockEvent

MiB = 1024 * 1024
affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")


# --- the stand-in ----------------------------------------------------------------------------


class FakeStream:
    def __init__(self, cuda: "FakeCuda"):
        self.cuda = cuda

    def synchronize(self):
        self.cuda.log.append(("stream.synchronize", self.cuda.current))

    def wait_stream(self, other):
        pass


class FakeCudart:
    """cudaHostRegister/Unregister as the runtime answers them; `fail_with` makes registering fail,
    and a failure becomes the thread's last error, as in the CUDA runtime."""

    def __init__(self, cuda: "FakeCuda", fail_with: int = 0):
        self.cuda, self.fail_with = cuda, fail_with
        self.registered: dict[int, dict] = {}

    def cudaHostRegister(self, ptr, size, flags):  # noqa: N802 - CUDA's name
        self.cuda.log.append(("register", ptr))
        self.registered[ptr] = {
            "size": size, "flags": flags, "affinity": os.sched_getaffinity(0),
            "first_byte": ctypes.string_at(ptr, 1), "last_byte": ctypes.string_at(ptr + size - 1, 1),
        }
        if self.fail_with:
            self.cuda.last_error = self.fail_with
            del self.registered[ptr]
        return self.fail_with

    def cudaHostUnregister(self, ptr):  # noqa: N802
        self.cuda.log.append(("unregister", ptr))
        return 0 if self.registered.pop(ptr, None) is not None else 1


class FakeCuda:
    Event = HostClockEvent

    def __init__(self, cudart: bool = True, fail_with: int = 0):
        self.log: list[tuple] = []
        self.current = "cuda:0"
        self.device_entries = 0
        self.last_error = 0
        self._cudart = FakeCudart(self, fail_with) if cudart else None
        self.empty_cache_calls = 0

    def Stream(self, device=None):  # noqa: N802 - torch's name
        return FakeStream(self)

    def current_stream(self, device=None):
        return FakeStream(self)

    def current_device(self):
        return int(self.current.split(":")[1])

    @contextlib.contextmanager
    def device(self, device):
        self.device_entries += 1
        previous, self.current = self.current, str(device)
        try:
            yield
        finally:
            self.current = previous

    def stream(self, stream):
        return contextlib.nullcontext()

    def synchronize(self, device=None):
        self.log.append(("synchronize", device))

    def empty_cache(self):
        self.empty_cache_calls += 1

    def launch(self):
        """A kernel launch: PyTorch's check after it raises (and so clears) the last error."""
        if self.last_error:
            code, self.last_error = self.last_error, 0
            raise RuntimeError(f"CUDA error: code {code}")


def _cudart_getter(cuda: FakeCuda):
    def cudart():
        return cuda._cudart

    return cudart


class FakeTorch(CpuTorch):
    """torch with `cuda` replaced; tensor factories keep tensors on the CPU and log pinned
    allocations and kernel launches."""

    def __init__(self, cuda: FakeCuda, host_cache: str | None = "accelerator"):
        self.cuda = cuda
        if cuda._cudart is not None:
            cuda.cudart = _cudart_getter(cuda)
        self.pinned_allocations = 0
        self.host_cache_emptied = 0
        empty = lambda: setattr(self, "host_cache_emptied", self.host_cache_emptied + 1)  # noqa: E731
        # torch 2.0-2.4 have neither call; later releases have one or the other.
        self.accelerator = SimpleNamespace(empty_host_cache=empty) if host_cache == "accelerator" else SimpleNamespace()
        self._C = SimpleNamespace()

    def empty(self, *shape, device=None, pin_memory=False, **kw):
        if pin_memory:
            self.pinned_allocations += 1
        return super().empty(*shape, **kw)

    def ones(self, *shape, device=None, **kw):
        if device is not None:
            self.cuda.launch()
        return super().ones(*shape, **kw)


@pytest.fixture
def fake(monkeypatch):
    """Install a stand-in; returns a function that builds one (cudart, failure code, cache call)."""

    def install(cudart: bool = True, fail_with: int = 0, host_cache: str | None = "accelerator") -> FakeTorch:
        stand_in = FakeTorch(FakeCuda(cudart, fail_with), host_cache)
        monkeypatch.setattr(pcie, "torch", stand_in)
        monkeypatch.setattr(pcie, "PHASE_CAP_S", 0.02)  # short phases; the load window still holds
        return stand_in

    return install


def one_cpu() -> int:
    return min(os.sched_getaffinity(0))


def pcie_ctx(budget_s: float = 10.0, min_load_s: float = 0.2, cpus=None, progress=None) -> BenchContext:
    params = {"bytes": 8 * MiB, "min_load_s": min_load_s}
    if cpus is not None:
        params["cpu_affinity"] = cpus
    return BenchContext("cuda:0", "gpu0", Budget(budget_s), params, progress=progress or (lambda message: None))


def by_name(measurements: list[dict]) -> dict[str, dict]:
    return {m["name"]: m for m in measurements}


# --- pcie: the pinned buffer -----------------------------------------------------------------


@affinity
def test_pinned_buffer_is_fresh_pages_touched_by_the_bound_thread_then_registered(fake, monkeypatch):
    stand_in = fake()
    cuda_calls = []
    monkeypatch.setattr(pcie, "free_memory_bytes",
                        lambda device: cuda_calls.append((device, os.sched_getaffinity(0))) or 64 << 30)
    cpu, before = one_cpu(), os.sched_getaffinity(0)
    results = by_name(pcie.run(pcie_ctx(cpus=[cpu])))

    # The first CUDA call of the job (it creates the context when pcie runs alone) came from the bound thread.
    assert cuda_calls[0] == ("cuda:0", {cpu})
    # One registration: the whole buffer, default flags, from the bound thread, its pages already written.
    cudart = stand_in.cuda._cudart
    registers = [e for e in stand_in.cuda.log if e[0] == "register"]
    assert len(registers) == 1
    assert stand_in.pinned_allocations == 0  # PyTorch's pinned cache is never involved
    # Unpinned at the end, once nothing can still be copying.
    assert stand_in.cuda.log[-1] == ("unregister", registers[0][1])
    assert stand_in.cuda.log[-2][0] == "synchronize"
    assert cudart.registered == {}
    assert os.sched_getaffinity(0) == before

    for name in ("pcie.h2d_pinned", "pcie.d2h_pinned"):
        d = results[name]["details"]
        assert results[name]["value"] > 0
        assert d["numa_bound"] is True and d["cpu_affinity"] == [cpu] and d["pinned_via"] == "cudaHostRegister"
    for name in ("pcie.h2d_pageable", "pcie.d2h_pageable"):
        assert results[name]["value"] > 0 and results[name]["details"]["numa_bound"] is True


@affinity
def test_registration_sees_the_whole_buffer_written_from_the_bound_cpus(fake, monkeypatch):
    stand_in = fake()
    seen = {}
    real_register = stand_in.cuda._cudart.cudaHostRegister

    def spy(ptr, size, flags):
        code = real_register(ptr, size, flags)
        seen.update(stand_in.cuda._cudart.registered[ptr], ptr=ptr)
        return code

    stand_in.cuda._cudart.cudaHostRegister = spy
    monkeypatch.setattr(pcie, "free_memory_bytes", lambda device: 64 << 30)
    cpu = one_cpu()
    pcie.run(pcie_ctx(cpus=[cpu]))
    assert seen["size"] == 8 * MiB and seen["flags"] == 0 and seen["ptr"] % 4096 == 0
    assert seen["affinity"] == {cpu}
    assert seen["first_byte"] == seen["last_byte"] == b"\x01"  # first touch happened before pinning


def test_fresh_host_buffer_is_page_aligned_written_and_writable():
    host = pcie.fresh_host_buffer(2 * MiB)
    assert host.dtype == torch.uint8 and host.numel() == 2 * MiB and host.data_ptr() % 4096 == 0
    assert int(host.sum()) == 2 * MiB  # every byte written (value 1) by the calling thread
    host.copy_(torch.zeros(2 * MiB, dtype=torch.uint8))  # the copies write into it
    assert int(host.sum()) == 0


@affinity
def test_failed_registration_falls_back_to_pytorchs_allocator_and_leaves_no_stale_cuda_error(fake, monkeypatch):
    stand_in = fake(fail_with=1)  # cudaErrorInvalidValue
    monkeypatch.setattr(pcie, "free_memory_bytes", lambda device: 64 << 30)
    results = by_name(pcie.run(pcie_ctx(cpus=[one_cpu()])))
    assert stand_in.pinned_allocations == 1
    assert stand_in.cuda.last_error == 0  # the thread's next kernel will not fail with the registration's error
    assert not [e for e in stand_in.cuda.log if e[0] == "unregister"]
    d = results["pcie.h2d_pinned"]["details"]
    assert results["pcie.h2d_pinned"]["value"] > 0 and "cudaHostRegister failed" in d["pinned_via"]
    assert d["numa_bound"] is True  # this torch empties its pinned cache: the buffer is a fresh one
    assert stand_in.host_cache_emptied >= 2  # before allocating, and after the buffer went back to the cache


@affinity
def test_without_registration_or_a_cache_call_the_pinned_copies_are_not_called_numa_bound(fake, monkeypatch):
    # torch 2.0-2.4 as seen by pcie: no way to empty the pinned cache; and no cudaHostRegister here.
    stand_in = fake(cudart=False, host_cache=None)
    monkeypatch.setattr(pcie, "free_memory_bytes", lambda device: 64 << 30)
    results = by_name(pcie.run(pcie_ctx(cpus=[one_cpu()])))
    assert stand_in.pinned_allocations == 1
    for name in ("pcie.h2d_pinned", "pcie.d2h_pinned"):
        d = results[name]["details"]
        assert results[name]["value"] > 0
        assert d["numa_bound"] is False and "cannot empty its pinned-memory cache" in d["numa_note"]
    for name in ("pcie.h2d_pageable", "pcie.d2h_pageable"):
        assert results[name]["details"]["numa_bound"] is True  # those pages are this job's own


def test_unbound_job_stays_unbound_in_the_pinned_details(fake, monkeypatch):
    fake(cudart=False, host_cache=None)
    monkeypatch.setattr(pcie, "free_memory_bytes", lambda device: 64 << 30)
    d = by_name(pcie.run(pcie_ctx(cpus=None)))["pcie.h2d_pinned"]["details"]
    assert d["numa_bound"] is False and d["numa_note"] == "no CPU list for this GPU's NUMA node"


# --- pcie: the load window -------------------------------------------------------------------


def test_load_window_is_the_pinned_load_phase_on_the_host_clock(fake, monkeypatch):
    stand_in = fake()
    monkeypatch.setattr(pcie, "free_memory_bytes", lambda device: 64 << 30)
    stamps = []  # the host clock at each event the copies record, in order

    class StampedEvent(HostClockEvent):
        def record(self, stream=None):
            stamps.append(time.time())
            super().record(stream)

    stand_in.cuda.Event = StampedEvent
    announced = []
    job_start = time.time()
    results = by_name(pcie.run(pcie_ctx(min_load_s=0.2, progress=lambda m: announced.append((m, time.time())))))
    job_end = time.time()

    d = results["pcie.h2d_pinned"]["details"]
    start, end = d["load_window"]
    assert announced[0][0] == pcie.LOAD_PHASE  # the progress line stays
    assert job_start <= announced[0][1] <= start + 0.001 and start <= end <= job_end + 0.001
    assert end - start >= 0.2 - 0.001  # the copies held the link as long as asked (ends rounded to the ms)
    assert end - start >= d["load_s"] - 0.002  # the window holds the whole load phase...
    # ...and nothing else: it starts after the calibration copy's events and ends before the
    # first event of the next copy (d2h), on the same clock (ordering, not how long anything took).
    next_phase = 2 * (2 + d["iterations"])  # warm-up, calibration, the load
    assert stamps[3] <= start + 0.001 and end <= stamps[next_phase] + 0.001
    assert json.loads(json.dumps(d["load_window"])) == [start, end]  # plain numbers in the record
    # Only the load phase carries a window: the parent keeps the link samples taken inside it.
    assert [n for n, m in results.items() if "load_window" in m["details"]] == ["pcie.h2d_pinned"]


def test_load_window_rounds_to_the_millisecond():
    assert pcie.load_window(1700000000.12345, 1700000001.98765) == [1700000000.123, 1700000001.988]


def test_setup_does_not_eat_the_load_window(fake, monkeypatch):
    """A first CUDA context can take most of the budget (about a second under vGPU); the copies'
    budget starts after it, so the load phase still holds the link as long as asked."""
    fake()
    ctx = pcie_ctx(budget_s=3.0, min_load_s=0.3)

    def slow_first_context(device):
        if device.startswith("cuda"):
            ctx.budget.start -= 2.95  # as if creating the context had taken 2.95 s of the 3 s budget
        return 64 << 30

    monkeypatch.setattr(pcie, "free_memory_bytes", slow_first_context)
    results = by_name(pcie.run(ctx))
    assert all(m["value"] is not None for m in results.values())  # every direction measured
    d = results["pcie.h2d_pinned"]["details"]
    assert d["load_s"] >= 0.3 and d["load_window"][1] - d["load_window"][0] >= 0.3 - 0.001  # ms rounding
    assert d["setup_s"] >= 0


def test_copies_that_slow_down_after_the_calibration_end_their_phase_on_time(fake, monkeypatch):
    """A batch is sized from one calibration copy; when the copies then get slower (a contended
    host), queuing stops at the phase's end, so the load phase does not eat the other copies'
    budget. The clock is the test's: each copy after the first phase's calibration takes 0.2 s."""
    stand_in = fake()
    monkeypatch.setattr(pcie, "free_memory_bytes", lambda device: 64 << 30)
    lag = [0.0]
    records = [0]
    for name in ("perf_counter", "monotonic", "time"):
        real = getattr(time, name)
        monkeypatch.setattr(time, name, lambda real=real: real() + lag[0])

    class SlowingEvent(HostClockEvent):
        def record(self, stream=None):
            records[0] += 1
            if records[0] > 4:  # after the warm-up and the calibration copy (two events each)
                lag[0] += 0.1
            super().record(stream)

    stand_in.cuda.Event = SlowingEvent
    results = by_name(pcie.run(pcie_ctx(budget_s=4.5, min_load_s=0.3)))
    assert all(m["value"] is not None for m in results.values()), results  # every direction measured
    d = results["pcie.h2d_pinned"]["details"]
    assert 0.3 <= d["load_s"] < 1.0  # held as long as asked, not the 300 copies the calibration aimed at


def test_out_of_budget_phases_say_why_and_keep_their_numa_details(fake, monkeypatch):
    fake(cudart=False, host_cache=None)
    monkeypatch.setattr(pcie, "free_memory_bytes", lambda device: 64 << 30)
    results = by_name(pcie.run(pcie_ctx(budget_s=0.0)))
    assert set(results) == {"pcie.h2d_pinned", "pcie.d2h_pinned", "pcie.bidir_pinned", "pcie.h2d_pageable", "pcie.d2h_pageable"}
    for m in results.values():
        assert m["value"] is None and "budget ran out" in m["details"]["reason"] and "numa_bound" in m["details"]
        assert "load_window" not in m["details"]


# --- latency: kernel launch ------------------------------------------------------------------


class LaunchTensor:
    """A 1-element GPU tensor whose add_ records the device current at each launch."""

    def __init__(self, cuda: FakeCuda):
        self.cuda, self.launched_on = cuda, []

    def add_(self, value):
        self.launched_on.append(self.cuda.current)
        return self


class LatencyTorch:
    def __init__(self, cuda: FakeCuda):
        self.cuda, self.gpu_tensors = cuda, []

    def __getattr__(self, name):
        return getattr(torch, name)

    def zeros(self, *shape, device=None, **kw):
        if device is None:
            return torch.zeros(*shape, **kw)
        tensor = LaunchTensor(self.cuda)
        self.gpu_tensors.append(tensor)
        return tensor


def test_kernel_launches_run_with_their_gpu_current_and_sync_its_stream(monkeypatch):
    cuda = FakeCuda()
    cuda.current = "cuda:0"
    cuda.synchronize = lambda device=None: pytest.fail("torch.cuda.synchronize(device) enters a device context each call")
    stand_in = LatencyTorch(cuda)
    monkeypatch.setattr(latency, "torch", stand_in)
    m = latency.measure_kernel_launch("cuda:1", "gpu1", Budget(2.0))

    (x,) = stand_in.gpu_tensors
    assert x.launched_on and set(x.launched_on) == {"cuda:1"}  # no launch switched the current device
    assert cuda.device_entries == 1 and cuda.current == "cuda:0"  # entered once, and left as found
    syncs = [e for e in cuda.log if e[0] == "stream.synchronize"]
    assert syncs and {current for _, current in syncs} == {"cuda:1"}
    assert len(syncs) >= latency.ROUNDTRIPS
    assert m["value"] > 0 and m["details"]["sync_roundtrip_us"] > 0
    assert "current stream" in m["details"]["measures"]


# --- membw -----------------------------------------------------------------------------------


def test_membw_on_one_gpu_leaves_the_other_gpus_caches_alone(monkeypatch):
    cuda = FakeCuda()
    monkeypatch.setattr(membw, "torch", SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(membw, "free_memory_bytes", lambda device: 80 << 30)
    monkeypatch.setattr(membw, "time_copies", lambda ctx, size: [size * 2 / 3.0e12] * 5)  # 3 TB/s
    (m,) = membw.run(BenchContext("cuda:1", "gpu1", Budget(3.0)))
    assert m["value"] == pytest.approx(3000.0)
    assert cuda.empty_cache_calls == 0  # it would free every GPU's cached blocks mid-measurement
    assert cuda.device_entries == 1


# --- judge: the kernel-launch source ---------------------------------------------------------

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("us, status", [(8.0, "pass"), (20.0, "pass"), (35.0, "warn")])
def test_kernel_launch_finding_does_not_pass_off_superbench_gpu_time_as_its_baseline(us, status):
    m = capture.merge(capture.read_captures(str(FIXTURES / "smi_text/q-h100-80gb-hbm3-vm-590.48.01-idle.txt")))
    figures = [Measurement("latency.kernel_launch", us, "us", "gpu0", {"sync_roundtrip_us": us + 10})]
    findings = [f for f in judge(m, figures, {"benchmarks": ["latency"], "device": "cuda"}) if f.check == "gpu.kernel_launch"]
    (f,) = findings
    assert f.status == status and f.evidence.expected == "<= 20 us"
    source = f.evidence.source
    assert "host time" in source and "add_" in source
    assert "baseline: 5.7" not in source and "GPU-side" in source  # SuperBench's figure named as a different one
