"""Transfer and latency benchmarks (pcie, latency, p2p, allreduce) on a machine without a GPU:
the GPU-only ones skip with a reason, their pure parts are checked directly, the context-creation
child runs against a fake libcuda, and the all-reduce really runs over gloo."""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess

import psutil
import pytest

from gpuvet.bench import allreduce, latency, p2p, pcie
from gpuvet.bench.common import BenchContext, Budget, Skip
from cuda_stand_in import CpuTorch, HostClockEvent

MiB = 1024 * 1024


def cpu_ctx(budget_s: float = 30.0, **params) -> BenchContext:
    return BenchContext(device="cpu", subject="cpu", budget=Budget(budget_s), params=params)


def live_children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


# --- GPU-only benchmarks skip on the CPU -------------------------------------------------------


@pytest.mark.parametrize("module", [pcie, p2p, latency], ids=["pcie", "p2p", "latency"])
def test_gpu_only_benchmarks_skip_on_cpu_with_a_reason(module):
    with pytest.raises(Skip, match="CUDA"):
        module.run(cpu_ctx())


def test_kernel_launch_skips_on_cpu():
    with pytest.raises(Skip, match="kernel launch latency needs a CUDA GPU"):
        latency.measure_kernel_launch("cpu", "cpu")


# --- pcie ----------------------------------------------------------------------------------


def test_pcie_buffer_is_256_mib_unless_memory_is_short():
    assert pcie.buffer_bytes(256 * MiB, gpu_free=80 << 30, host_available=64 << 30) == 256 * MiB
    assert pcie.buffer_bytes(256 * MiB, gpu_free=400 * MiB + 123, host_available=64 << 30) == 100 * MiB
    assert pcie.buffer_bytes(256 * MiB, gpu_free=80 << 30, host_available=800 * MiB) == 100 * MiB
    with pytest.raises(Skip, match="not enough free memory"):
        pcie.buffer_bytes(256 * MiB, gpu_free=20 * MiB, host_available=64 << 30)


def test_pcie_repeats_fill_the_load_window():
    assert pcie.repeats_for(1.0, 0.005, at_most=5000) == 200  # 256 MiB at ~55 GB/s
    assert pcie.repeats_for(0.01, 0.5, at_most=100) == pcie.MIN_REPEATS
    assert pcie.repeats_for(10.0, 0.0001, at_most=100) == 100
    assert pcie.load_window_s({}) == 1.0
    assert pcie.load_window_s({"min_load_s": 2.5}) == 2.5


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")
def test_pcie_binds_the_thread_to_the_numa_cpus_and_restores_it():
    before = os.sched_getaffinity(0)
    cpu = min(before)
    with pcie.bound_to_cpus([cpu]) as numa:
        assert numa == {"numa_bound": True, "cpu_affinity": [cpu]}
        assert os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == before


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")
def test_pcie_binding_that_cannot_apply_says_why():
    before = os.sched_getaffinity(0)
    with pcie.bound_to_cpus([100000]) as numa:
        assert numa["numa_bound"] is False and "could not bind" in numa["numa_note"]
    assert os.sched_getaffinity(0) == before
    with pcie.bound_to_cpus(None) as numa:
        assert numa["numa_bound"] is False


# --- latency: context creation -------------------------------------------------------------


def test_context_init_without_a_driver_is_a_clean_skip():
    with pytest.raises(Skip, match=r"no CUDA driver \(libgpuvet-missing.so.1 not found"):
        latency.measure_context_init(0, "gpu0", runs=3, libcuda="libgpuvet-missing.so.1")


def test_context_init_on_this_machine_skips_when_libcuda_is_absent():
    try:
        import ctypes

        ctypes.CDLL(latency.LIBCUDA)
        pytest.skip("this machine has a CUDA driver")
    except OSError:
        pass
    with pytest.raises(Skip, match=r"no CUDA driver \(libcuda.so.1 not found"):
        latency.measure_context_init(0, "gpu0")


def test_child_output_parser_reads_good_and_bad_reports():
    good = latency.parse_child_output('noise\n{"ok": true, "load_ms": 3.5, "cuinit_ms": 40.2, "context_ms": 95.1}\n')
    assert good == latency.InitTiming(cuinit_ms=40.2, context_ms=95.1, load_ms=3.5)

    with pytest.raises(Skip, match="no CUDA driver"):
        latency.parse_child_output('{"ok": false, "no_driver": true, "error": "no CUDA driver (libcuda.so.1 not found)"}')
    with pytest.raises(latency.ContextInitError, match="EXCLUSIVE_PROCESS"):
        latency.parse_child_output('{"ok": false, "call": "cuDevicePrimaryCtxRetain", "code": 46, '
                                   '"error": "cuDevicePrimaryCtxRetain failed: CUDA_ERROR_DEVICE_UNAVAILABLE (46)"}')
    with pytest.raises(latency.ContextInitError, match=r"exited with -11: Segmentation fault"):
        latency.parse_child_output("", returncode=-11, stderr="Segmentation fault\n")
    with pytest.raises(latency.ContextInitError, match="exited with 1: Traceback line"):
        latency.parse_child_output("not json at all", returncode=1, stderr="Traceback line\n")
    with pytest.raises(latency.ContextInitError, match="unexpected report"):
        latency.parse_child_output('{"ok": true, "cuinit_ms": "fast"}')
    with pytest.raises(latency.ContextInitError, match="inconsistent"):
        latency.parse_child_output('{"ok": true, "cuinit_ms": 90.0, "context_ms": 10.0}')


FAKE_LIBCUDA = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int step(const char *name) {
    const char *log = getenv("FAKE_CUDA_LOG"), *fail = getenv("FAKE_CUDA_FAIL");
    if (log) { FILE *f = fopen(log, "a"); fprintf(f, "%s\n", name); fclose(f); }
    return fail && strcmp(fail, name) == 0 ? 46 : 0;
}
int cuInit(unsigned int flags) { return flags == 0 ? step("cuInit") : 1; }
int cuDeviceGet(int *dev, int ordinal) { if (ordinal != 0) return 101; *dev = 7; return step("cuDeviceGet"); }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { if (dev != 7) return 101; *ctx = (void *)0x1234; return step("cuDevicePrimaryCtxRetain"); }
int cuCtxSetCurrent(void *ctx) { return ctx == (void *)0x1234 ? step("cuCtxSetCurrent") : 201; }
int cuCtxSynchronize(void) { return step("cuCtxSynchronize"); }
int cuDevicePrimaryCtxRelease_v2(int dev) { return step("cuDevicePrimaryCtxRelease_v2"); }
int cuGetErrorName(int code, const char **name) {
    *name = code == 46 ? "CUDA_ERROR_DEVICE_UNAVAILABLE" : code == 101 ? "CUDA_ERROR_INVALID_DEVICE" : "CUDA_ERROR_UNKNOWN";
    return 0;
}
"""


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler for the fake libcuda")
    folder = tmp_path_factory.mktemp("fakecuda")
    (folder / "fake.c").write_text(FAKE_LIBCUDA)
    library = folder / "libcuda.so.1"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(folder / "fake.c")], check=True)
    return str(library)


def test_context_init_child_calls_the_driver_in_order(fake_libcuda, tmp_path, monkeypatch):
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("FAKE_CUDA_LOG", str(calls))
    m = latency.measure_context_init(0, "gpu0", runs=3, libcuda=fake_libcuda)
    assert m["name"] == "latency.context_init" and m["unit"] == "ms" and m["subject"] == "gpu0"
    assert len(m["details"]["runs"]) == 3 and m["value"] == sorted(m["details"]["runs"])[1]
    assert 0 <= m["details"]["cuinit_ms"] <= m["value"] < 1000
    assert m["details"]["gpu"] == 0 and "cuInit" in m["details"]["measures"]
    sequence = ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuCtxSynchronize",
                "cuDevicePrimaryCtxRelease_v2"]
    assert calls.read_text().split() == sequence * 3


def test_context_init_child_names_the_failing_call(fake_libcuda, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_FAIL", "cuDevicePrimaryCtxRetain")
    with pytest.raises(latency.ContextInitError,
                       match=r"cuDevicePrimaryCtxRetain failed: CUDA_ERROR_DEVICE_UNAVAILABLE \(46\): the GPU is busy"):
        latency.run_child(0, libcuda=fake_libcuda)
    monkeypatch.delenv("FAKE_CUDA_FAIL")
    with pytest.raises(latency.ContextInitError, match=r"cuDeviceGet failed: CUDA_ERROR_INVALID_DEVICE \(101\)"):
        latency.run_child(3, libcuda=fake_libcuda)


def test_context_init_child_that_hangs_is_ended(tmp_path):
    # A "python" that never answers stands in for a driver call that never returns.
    sleeper, pid_file = tmp_path / "python", tmp_path / "pid"
    sleeper.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    sleeper.chmod(0o755)
    before = live_children()
    with pytest.raises(latency.ContextInitError, match="did not finish in 1 s"):
        latency.run_child(0, timeout_s=1.0, python=str(sleeper))
    # Ended, not waited for: the child that never answered is gone when run_child returns.
    assert not psutil.pid_exists(int(pid_file.read_text()))
    assert live_children() <= before


# --- p2p -----------------------------------------------------------------------------------


def test_p2p_pairs_cover_every_ordered_pair_neighbours_first():
    pairs = p2p.pairs_in_ring_order([0, 1, 2, 3])
    assert sorted(pairs) == [(s, d) for s in range(4) for d in range(4) if s != d]
    first = pairs[:4]  # one round: every GPU once a source and once a destination
    assert sorted(s for s, _ in first) == [0, 1, 2, 3] and sorted(d for _, d in first) == [0, 1, 2, 3]
    assert p2p.pairs_in_ring_order([2, 5]) == [(2, 5), (5, 2)]


def test_p2p_buffer_fits_the_fullest_gpu():
    assert p2p.buffer_bytes(256 * MiB, 80 << 30) == 256 * MiB
    assert p2p.buffer_bytes(256 * MiB, 100 * MiB) == 25 * MiB
    with pytest.raises(Skip, match="not enough free GPU memory"):
        p2p.buffer_bytes(256 * MiB, 16 * MiB)


# --- the CUDA paths, run with a stand-in for torch.cuda --------------------------------------
# The stand-in keeps tensors on the CPU and times "events" with the host clock. It checks the
# control flow (budgets, the load window, what is reported), not CUDA semantics.


class _FakeStream:
    def __init__(self, device=None):
        pass

    def synchronize(self):
        pass

    def wait_stream(self, other):
        pass


class _FakeCuda:
    Event, Stream = HostClockEvent, _FakeStream

    def __init__(self, gpus: int):
        self.gpus = gpus

    def device_count(self):
        return self.gpus

    def can_device_access_peer(self, src, dst):
        return (src, dst) != (2, 0)

    def current_stream(self, device=None):
        return _FakeStream()

    def synchronize(self, device=None):
        pass

    def device(self, device):
        return contextlib.nullcontext()

    def stream(self, stream):
        return contextlib.nullcontext()

    def empty_cache(self):
        pass

    def cudart(self):
        return _FakeCudart()


class _FakeCudart:
    """Pins nothing: the CPU stand-in's host buffer is plain memory."""

    def cudaHostRegister(self, ptr, size, flags):
        return 0

    def cudaHostUnregister(self, ptr):
        return 0


@pytest.fixture
def fake_gpus(monkeypatch):
    stand_in = CpuTorch(_FakeCuda(gpus=3))
    for module in (pcie, p2p, latency):
        monkeypatch.setattr(module, "torch", stand_in)
    monkeypatch.setattr(pcie, "free_memory_bytes", lambda device: 64 << 30)
    monkeypatch.setattr(p2p, "free_memory_bytes", lambda device: 64 << 30)


def test_pcie_path_reports_each_direction_both_at_once_and_holds_the_load_window(fake_gpus, monkeypatch):
    monkeypatch.setattr(pcie, "PHASE_CAP_S", 0.05)  # short phases; the load window still holds
    announced = []
    ctx = BenchContext("cuda:0", "gpu0", Budget(10.0), {"bytes": 8 * MiB, "min_load_s": 0.3, "cpu_affinity": [0]},
                       progress=announced.append)
    results = {m["name"]: m for m in pcie.run(ctx)}
    assert list(results) == ["pcie.h2d_pinned", "pcie.d2h_pinned", "pcie.bidir_pinned", "pcie.h2d_pageable", "pcie.d2h_pageable"]
    assert announced == [pcie.LOAD_PHASE]
    for m in results.values():
        assert m["unit"] == "GB/s" and m["subject"] == "gpu0" and m["value"] > 0
        assert m["details"]["bytes"] == 8 * MiB and m["details"]["iterations"] >= pcie.MIN_REPEATS
        assert m["details"]["numa_bound"] is True and m["details"]["summary"]["median"] == m["value"]
    assert results["pcie.h2d_pinned"]["details"]["load_s"] >= 0.3


def test_p2p_path_reports_each_pair_and_the_matrix(fake_gpus):
    results = p2p.run(BenchContext("cuda:0", "machine", Budget(30.0), {"gpus": [0, 1, 2], "bytes": 8 * MiB}))
    copies, matrix = results[:-1], results[-1]
    assert sorted((m["details"]["src"], m["details"]["dst"]) for m in copies) == [
        (0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    assert all(m["name"] == "p2p.copy" and m["unit"] == "GB/s" and m["details"]["check_ok"] for m in copies)
    assert {m["subject"] for m in copies} == {"gpu0", "gpu1", "gpu2"}
    d = matrix["details"]
    assert matrix["name"] == "p2p.matrix" and d["left_out"] == [] and d["pairs_measured"] == 6
    assert [row[i] for i, row in enumerate(d["matrix_gbps"])] == [None, None, None]
    assert d["peer_access"][2][0] is False and d["peer_access"][0][2] is True
    assert matrix["value"] == pytest.approx(statistics.median(m["value"] for m in copies))


def test_p2p_path_out_of_budget_lists_the_pairs_left_out(fake_gpus):
    results = p2p.run(BenchContext("cuda:0", "machine", Budget(0.0), {"gpus": [0, 1, 2], "bytes": 8 * MiB}))
    assert len(results) == 2  # the first pair, then the matrix
    assert results[-1]["details"]["left_out"] == [[1, 2], [2, 0], [0, 2], [1, 0], [2, 1]]


def test_kernel_launch_path_reports_async_and_sync_times(fake_gpus):
    m = latency.measure_kernel_launch("cuda:0", "gpu0", Budget(5.0))
    assert m["name"] == "latency.kernel_launch" and m["unit"] == "us" and m["value"] > 0
    assert m["details"]["sync_roundtrip_us"] > 0 and m["details"]["rounds"] == latency.LAUNCH_ROUNDS


# --- allreduce -----------------------------------------------------------------------------


def test_allreduce_formulas_are_nccl_tests():
    assert allreduce.algbw_gbps(1_000_000_000, 0.5) == 2.0
    assert allreduce.busbw_gbps(100.0, 8) == pytest.approx(175.0)
    assert allreduce.busbw_gbps(100.0, 2) == pytest.approx(100.0)
    assert allreduce.sweep_sizes(1024 * MiB) == [MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB]
    assert allreduce.sweep_sizes(700 * MiB)[-2:] == [256 * MiB, 700 * MiB]
    assert allreduce.sweep_sizes(4 * MiB) == [MiB, 4 * MiB]
    assert allreduce.sweep_sizes(MiB // 2) == [MiB // 2]


def test_allreduce_needs_two_ranks():
    with pytest.raises(Skip, match="at least 2 ranks"):
        allreduce.run(cpu_ctx(world_size=1))


@pytest.fixture(scope="module")
def gloo_run():
    before = live_children()
    return allreduce.run(cpu_ctx(budget_s=60.0, world_size=2)), before


def test_allreduce_on_cpu_measures_latency_and_bus_bandwidth(gloo_run):
    measurements, _ = gloo_run
    by_name = {m["name"]: m for m in measurements}
    assert set(by_name) == {"allreduce.latency_1mb", "allreduce.busbw"}
    latency_1mb, busbw = by_name["allreduce.latency_1mb"], by_name["allreduce.busbw"]
    assert latency_1mb["unit"] == "us" and latency_1mb["value"] > 0 and latency_1mb["subject"] == "machine"
    assert latency_1mb["details"]["bytes"] == MiB and latency_1mb["details"]["iterations"] >= allreduce.MIN_ITERATIONS

    d = busbw["details"]
    assert busbw["unit"] == "GB/s" and d["backend"] == "gloo" and d["world_size"] == 2 and d["dtype"] == "float32"
    assert d["check_ok"] is True and d["expected_sum"] == 3
    rows = d["sizes"]
    assert [row["bytes"] for row in rows] == [MiB, 4 * MiB]
    assert rows[0]["time_us"] == latency_1mb["value"]
    n = d["world_size"]
    for row in rows:
        assert row["wrong"] == 0
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / (row["time_us"] * 1e-6) / 1e9, rel=1e-6)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * (n - 1) / n)
    assert busbw["value"] == rows[-1]["busbw_gbps"] and d["largest_bytes"] == 4 * MiB


def test_allreduce_on_cpu_finishes_its_sweep_and_leaves_no_process(gloo_run):
    measurements, before = gloo_run
    d = measurements[1]["details"]
    assert d["outcome"] == "complete" and d["sizes_not_measured"] == [] and "reason" not in d
    assert live_children() <= before


def test_allreduce_rank_that_hangs_is_killed_at_the_deadline():
    before = live_children()
    with pytest.raises(allreduce.AllReduceHung, match=r"did not finish in 6 s: ranks .*1.* hung") as caught:
        allreduce.run(cpu_ctx(budget_s=6.0, world_size=2, _test_hang_rank=1))
    assert 1 in caught.value.hung_ranks
    assert "rank 1 in 'hanging on purpose (test)'" in str(caught.value)
    assert live_children() <= before


def test_allreduce_rank_that_fails_is_reported_with_its_step():
    before = live_children()
    with pytest.raises(allreduce.RankFailed, match=r"rank \d exited with 1 during 'init_process_group'"):
        allreduce.run_ranks("no-such-backend", ["cpu", "cpu"], timeout_s=60.0)
    assert live_children() <= before


def test_pcie_together_copies_only_the_pinned_directions_under_their_own_names(fake_gpus, monkeypatch):
    """The orchestrator starts every GPU's job at once with params["together"]: each reports its
    pinned copies as *_together, beside (not instead of) the figures it gave alone."""
    monkeypatch.setattr(pcie, "PHASE_CAP_S", 0.05)
    ctx = BenchContext("cuda:1", "gpu1", Budget(1.0), {"bytes": 8 * MiB, "together": True, "cpu_affinity": [0]})
    results = {m["name"]: m for m in pcie.run(ctx)}
    assert list(results) == ["pcie.h2d_pinned_together", "pcie.d2h_pinned_together"]
    assert all(m["value"] > 0 and m["details"]["numa_bound"] for m in results.values())
