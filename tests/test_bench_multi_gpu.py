"""The multi-GPU benchmarks (p2p, allreduce) on a machine without a GPU: what a user would notice
on a real node (a hung copy named with the figures kept, a slow fabric's sizes kept and called
incomplete, a bad GPU list named) checked through the CPU paths, gloo and stand-ins for torch.cuda;
the CUDA-only logic through its pure helpers."""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import time

import psutil
import pytest
import torch

from gpuvet.bench import allreduce, p2p
from gpuvet.bench.common import STUCK_ON_GPU, BenchContext, Budget
from cuda_stand_in import CpuTorch

MiB = 1024 * 1024


def live_children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


# --- a stand-in for torch.cuda for p2p ----------------------------------------------------------
# Tensors stay on the CPU; "events" are done unless the pair being measured is the stuck one.


class _Event:
    def __init__(self, cuda: "_Cuda", enable_timing: bool = False):
        self.cuda, self.at = cuda, None

    def record(self, stream=None):
        if self.cuda.pair in self.cuda.too_many_peers:  # the first copy of the pair enables peer access
            raise RuntimeError("CUDA error: peer mapping resources exhausted\nCUDA kernel errors might be "
                               "asynchronously reported at some other API call")
        self.at = time.perf_counter()

    def query(self) -> bool:
        self.cuda.queries += 1
        return self.cuda.pair != self.cuda.stuck

    def elapsed_time(self, end: "_Event") -> float:
        return (end.at - self.at) * 1000.0 + 1e-3

    def synchronize(self):
        raise AssertionError("p2p must poll events, never block on them")


class _Cuda:
    def __init__(self, gpus: int, stuck=None, too_many_peers=()):
        self.gpus, self.stuck, self.too_many_peers = gpus, stuck, set(too_many_peers)
        self.pair = None
        self.queries = 0
        self.emptied = 0

    def Event(self, enable_timing: bool = False):
        return _Event(self, enable_timing)

    def device_count(self):
        return self.gpus

    def can_device_access_peer(self, src, dst):
        self.pair = (src, dst)  # p2p asks this first for every pair
        return True

    def current_stream(self, device=None):
        return object()

    def synchronize(self, device=None):
        raise AssertionError("p2p must poll events, never block on a device")

    def empty_cache(self):
        self.emptied += 1


@pytest.fixture
def gpus(monkeypatch):
    def install(count: int = 3, **behaviour) -> _Cuda:
        cuda = _Cuda(count, **behaviour)
        monkeypatch.setattr(p2p, "torch", CpuTorch(cuda))
        monkeypatch.setattr(p2p, "free_memory_bytes", lambda device: 64 << 30)
        return cuda
    yield install
    STUCK_ON_GPU.clear()


def p2p_ctx(budget_s: float = 30.0, progress=None, **params) -> BenchContext:
    return BenchContext("cuda:0", "machine", Budget(budget_s), {"gpus": [0, 1, 2], "bytes": 8 * MiB, **params},
                        progress=progress or (lambda message: None))


# --- p2p -----------------------------------------------------------------------------------------


def test_p2p_names_each_pair_before_it_runs_and_frees_its_buffers(gpus):
    cuda = gpus()
    said = []
    results = p2p.run(p2p_ctx(progress=said.append))
    pairs = p2p.pairs_in_ring_order([0, 1, 2])
    assert said == ["p2p: 6 GPU pairs"] + [f"p2p: gpu{s} -> gpu{d} ({i}/6)" for i, (s, d) in enumerate(pairs, 1)]
    assert len(results) == 7 and results[-1]["details"]["failed_pairs"] == []
    assert cuda.queries > 0  # waited by polling, never by blocking (the stand-in refuses to block)
    assert cuda.emptied == 1  # the ~768 MiB per GPU goes back before all-reduce and the workload
    assert STUCK_ON_GPU == []


def test_p2p_hung_copy_names_the_pair_and_keeps_the_pairs_measured(gpus, monkeypatch):
    cuda = gpus(stuck=(1, 2))
    monkeypatch.setattr(p2p, "pair_timeout_s", lambda budget_left_s: 0.05)
    started = time.monotonic()
    results = p2p.run(p2p_ctx())
    assert time.monotonic() - started < 5.0  # the stuck copy cost its pair's deadline, not for ever
    copies = [m for m in results if m["name"] == "p2p.copy"]
    assert [(m["details"]["src"], m["details"]["dst"]) for m in copies] == [(0, 1)]
    matrix = next(m for m in results if m["name"] == "p2p.matrix")["details"]
    assert [(f["src"], f["dst"]) for f in matrix["failed_pairs"]] == [(1, 2)]
    assert "copy gpu1->gpu2 did not finish" in matrix["failed_pairs"][0]["reason"]
    assert matrix["left_out"] == [[2, 0], [0, 2], [1, 0], [2, 1]] and matrix["pairs_measured"] == 1
    note = next(m for m in results if m["name"] == "bench.p2p")
    assert note["subject"] == "machine" and note["details"]["outcome"] == "failed"
    assert "gpu1->gpu2 did not finish" in note["details"]["reason"] and "1 pairs measured" in note["details"]["reason"]
    # cudaFree would wait for the stuck copy for ever, and the copy may still write the buffers
    assert cuda.emptied == 0 and len(STUCK_ON_GPU) == 1


def test_p2p_too_many_peers_is_recorded_for_that_pair_and_the_rest_go_on(gpus):
    cuda = gpus(too_many_peers=[(2, 0)])
    results = p2p.run(p2p_ctx())
    copies = {(m["details"]["src"], m["details"]["dst"]) for m in results if m["name"] == "p2p.copy"}
    assert copies == {(0, 1), (1, 2), (0, 2), (1, 0), (2, 1)}
    matrix = results[-1]["details"]
    assert [(f["src"], f["dst"]) for f in matrix["failed_pairs"]] == [(2, 0)]
    assert "cudaErrorTooManyPeers" in matrix["failed_pairs"][0]["reason"]
    assert "gpu2->gpu0" in matrix["failed_pairs"][0]["reason"] and matrix["left_out"] == []
    assert matrix["matrix_gbps"][2][0] is None and not any(m["name"] == "bench.p2p" for m in results)
    assert cuda.emptied == 1


def test_p2p_other_cuda_errors_still_fail_the_benchmark(gpus, monkeypatch):
    cuda = gpus()

    def broken(src, dst):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(cuda, "can_device_access_peer", broken)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        p2p.run(p2p_ctx())
    assert cuda.emptied == 1  # freed on the way out too


def test_p2p_wait_polls_until_done_or_the_deadline():
    class Pending:
        def __init__(self, done_after: int):
            self.left = done_after

        def query(self):
            self.left -= 1
            return self.left < 0

    now = [0.0]
    pauses = []

    def pause(seconds):
        pauses.append(seconds)
        now[0] += seconds

    p2p.wait_for(Pending(3), deadline=10.0, on_timeout=lambda: AssertionError("no"), clock=lambda: now[0], pause=pause)
    assert len(pauses) == 3
    with pytest.raises(p2p.PairHung, match=r"copy gpu3->gpu4 did not finish in 2 s \(copy 1 of 5\)"):
        p2p.wait_for(Pending(10**9), deadline=now[0] + 0.01,
                     on_timeout=lambda: p2p.PairHung(3, 4, 2.0, "copy 1 of 5"), clock=lambda: now[0], pause=pause)
    assert p2p.pair_timeout_s(0.0) == p2p.PAIR_TIMEOUT_FLOOR_S and p2p.pair_timeout_s(40.0) == 40.0


def test_too_many_peers_is_told_from_other_errors():
    assert p2p.is_too_many_peers(RuntimeError("CUDA error: peer mapping resources exhausted"))
    assert p2p.is_too_many_peers(RuntimeError("cudaErrorTooManyPeers"))
    assert not p2p.is_too_many_peers(RuntimeError("CUDA error: out of memory"))


def test_a_bad_gpu_list_is_named_in_one_reason():
    assert p2p.validate_gpus(None, 4) == [0, 1, 2, 3]
    assert p2p.validate_gpus([3, "1"], 4) == [3, 1]
    with pytest.raises(ValueError) as caught:
        p2p.validate_gpus([0, 1, 1, 9, -1], 8)
    message = str(caught.value)
    assert message == ("bad GPU list [0, 1, 1, 9, -1]: no GPU with ordinal -1, 9 (8 visible to PyTorch: 0-7); "
                       "ordinal 1 listed more than once")
    with pytest.raises(ValueError, match="must be integers"):
        p2p.validate_gpus(["gpu0"], 8)


def test_p2p_rejects_a_duplicated_gpu(gpus):
    gpus(4)
    with pytest.raises(ValueError, match="ordinal 2 listed more than once"):
        p2p.run(p2p_ctx(gpus=[0, 2, 2]))


# --- allreduce: pure helpers -----------------------------------------------------------------


def test_allreduce_bad_gpu_list_fails_before_any_rank_starts(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    before = live_children()
    ctx = BenchContext("cuda:0", "machine", Budget(20.0), {"gpus": [0, 1, 1, 7], "world_size": 4})
    with pytest.raises(ValueError) as caught:
        allreduce.run(ctx)
    assert str(caught.value) == ("bad GPU list [0, 1, 1, 7]: no GPU with ordinal 7 (4 visible to PyTorch: 0-3); "
                                 "ordinal 1 listed more than once")
    assert "CUDA" not in str(caught.value)  # the judge would read that as the machine's fault
    assert live_children() <= before


def test_next_size_is_skipped_when_its_estimate_does_not_fit():
    # 1 MiB took 100 us per all-reduce: 4 MiB ~400 us, times the all-reduces one size needs
    per_size = allreduce.COLLECTIVES_PER_SIZE
    assert allreduce.estimated_size_s(MiB, 100e-6, 4 * MiB) == pytest.approx(400e-6 * per_size)
    assert allreduce.size_skip_reason(MiB, 100e-6, 4 * MiB, left_s=1.0) is None
    reason = allreduce.size_skip_reason(64 * MiB, 0.01, 256 * MiB, left_s=0.3)
    assert reason == (f"268435456 bytes and larger skipped: about {0.04 * per_size:.1f} s needed ({per_size} all-reduces "
                      "at 10000 us x 4, from the 67108864-byte size) but 0.3 s left")
    assert allreduce.size_skip_reason(MiB, 1e-3, 4 * MiB, left_s=-2.0).endswith("but 0.0 s left")


def test_batches_fill_the_time_within_bounds_and_the_gpu_sleeps_ahead_of_the_host():
    assert allreduce.batch_iterations(1.0, 0.001) == allreduce.MAX_ITERATIONS
    assert allreduce.batch_iterations(0.0, 0.001) == allreduce.MIN_ITERATIONS
    assert allreduce.batch_iterations(0.1, 0.001, batches=5) == 20
    assert allreduce.batch_iterations(1.0, 0.0) == allreduce.MIN_ITERATIONS
    # 50 launches at <= 50 us each fit in the sleep; the sleep stays short
    assert allreduce.host_ahead_cycles(50, clock_hz=2e9) == int(3e-3 * 2e9)
    assert allreduce.host_ahead_cycles(10**6, clock_hz=2e9) == int(allreduce.HOST_AHEAD_MAX_S * 2e9)


def test_reaping_shares_one_wait_across_all_ranks():
    now = [0.0]
    waited = []

    class Stuck:  # a rank in the driver: SIGKILL does not end it yet
        def wait(self, timeout):
            waited.append(timeout)
            now[0] += timeout
            raise subprocess.TimeoutExpired("rank", timeout)

    class Gone:
        def wait(self, timeout):
            return -9

    procs = [Stuck(), Gone()] + [Stuck() for _ in range(7)]
    assert allreduce.reap(procs, 10.0, clock=lambda: now[0]) == [0, 2, 3, 4, 5, 6, 7, 8]
    assert sum(waited) == pytest.approx(10.0) and now[0] == pytest.approx(10.0)  # not 8 x 10 s


def test_ranks_get_nccl_debug_warn_unless_the_user_chose(tmp_path):
    config = allreduce.RankConfig(rank=1, world_size=2, backend="nccl", device="cuda:1", deadline=0.0,
                                  workdir=str(tmp_path), parent_pid=1)
    env = allreduce.rank_env(config, {"PATH": "/bin"})
    assert env["NCCL_DEBUG"] == "WARN" and env["RANK"] == "1" and env["WORLD_SIZE"] == "2"
    assert "MASTER_PORT" not in env  # the ranks meet through a file, not a port
    assert allreduce.rank_env(config, {"NCCL_DEBUG": "INFO"})["NCCL_DEBUG"] == "INFO"
    assert allreduce.store_url(tmp_path) == f"file://{tmp_path.resolve()}/store"


def test_a_failed_ranks_tail_keeps_nccls_warning(tmp_path):
    (tmp_path / "rank1.log").write_text(
        "host:123:456 [1] transport/p2p.cc:275 NCCL WARN Cuda failure 'peer access is not supported between these two devices'\n"
        "Traceback (most recent call last):\n  File \"allreduce.py\", line 1\n"
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error\n")
    tail = allreduce._log_tail(tmp_path, 1)
    assert tail.startswith("host:123:456 [1] transport/p2p.cc:275 NCCL WARN Cuda failure 'peer access is not supported")
    assert tail.endswith("unhandled cuda error")
    (tmp_path / "rank0.log").write_text("one\n\ntwo\n")
    assert allreduce._log_tail(tmp_path, 0) == "one | two"
    assert allreduce._log_tail(tmp_path, 5) == "no output"


# --- allreduce: the CUDA timing, with stand-ins for torch.cuda and torch.distributed -------------


class _Timeline:
    """A GPU clock that only all-reduces advance (20 us each), and a log of what was enqueued."""

    def __init__(self):
        self.t = 0.0
        self.log: list[str] = []


class _NcclEvent:
    def __init__(self, timeline, enable_timing=False):
        self.timeline, self.at = timeline, None

    def record(self, stream=None):
        self.at = self.timeline.t
        self.timeline.log.append("event")

    def synchronize(self):
        self.timeline.log.append("event.synchronize")

    def elapsed_time(self, end):
        return (end.at - self.at) * 1000.0


class _NcclCuda:
    def __init__(self, timeline):
        self.timeline = timeline

    def Event(self, enable_timing=False):
        return _NcclEvent(self.timeline, enable_timing)

    def current_stream(self, device=None):
        return object()

    def _sleep(self, cycles):
        self.timeline.log.append(f"sleep {cycles}")

    def synchronize(self, device=None):
        self.timeline.log.append("device.synchronize")


class _NcclTorch:
    def __init__(self, timeline):
        self.cuda = _NcclCuda(timeline)

    def __getattr__(self, name):
        return getattr(torch, name)

    def zeros(self, *shape, device=None, **kw):
        return torch.zeros(*shape, **kw)

    def tensor(self, data, device=None, **kw):
        return torch.tensor(data, **kw)


class _Dist:
    ReduceOp = torch.distributed.ReduceOp

    def __init__(self, timeline, buffer):
        self.timeline, self.buffer = timeline, buffer

    def all_reduce(self, tensor, op=None):
        if tensor is self.buffer:
            self.timeline.t += 20e-6
            self.timeline.log.append("all_reduce")
        elif op == self.ReduceOp.MAX:
            self.timeline.log.append("max over ranks")
        else:
            self.timeline.log.append("align")


def test_nccl_batches_are_timed_as_a_whole_behind_a_gpu_sleep(tmp_path):
    timeline = _Timeline()
    buffer = torch.zeros(4)
    config = allreduce.RankConfig(rank=0, world_size=8, backend="nccl", device="cuda:0", deadline=0.0,
                                  workdir=str(tmp_path), parent_pid=1)
    rank = allreduce.Rank(config, _NcclTorch(timeline), _Dist(timeline, buffer), "cuda:0", tmp_path / "steps")
    times = allreduce._timed(rank, buffer, iterations=4, batches=2)
    assert times == pytest.approx([20e-6, 20e-6])  # the batch's time / 4, not one call's launch
    one_batch = (["align", "device.synchronize", f"sleep {allreduce.host_ahead_cycles(4)}", "event"]
                 + ["all_reduce"] * 4 + ["event", "event.synchronize"])
    assert timeline.log == one_batch * 2 + ["max over ranks"]
    assert "torch.cuda._sleep" in allreduce.timing_method("nccl", True)
    assert "wall clock" in allreduce.timing_method("gloo", False)


# --- allreduce: the sweep, in this process over a one-rank gloo group --------------------------


@pytest.fixture
def one_rank_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=allreduce.store_url(tmp_path), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def _rank(dist, tmp_path, deadline_s: float, max_bytes: int) -> allreduce.Rank:
    config = allreduce.RankConfig(rank=0, world_size=1, backend="gloo", device="cpu",
                                  deadline=time.monotonic() + deadline_s, workdir=str(tmp_path), parent_pid=1,
                                  max_bytes=max_bytes)
    return allreduce.Rank(config, torch, dist, torch.device("cpu"), tmp_path / "rank0.step")


def test_sweep_skips_sizes_that_cannot_fit_and_says_so(one_rank_group, tmp_path, monkeypatch):
    def slow_fabric(rank, nbytes, size_deadline):  # 0.2 s per 1 MiB all-reduce
        seconds = 0.2 * nbytes / MiB
        return {"bytes": nbytes, "iterations": 3, "batches": 5, "time_us": seconds * 1e6,
                "algbw_gbps": allreduce.algbw_gbps(nbytes, seconds), "busbw_gbps": 0.0, "wrong": 0,
                "summary_us": {"median": seconds * 1e6}}

    monkeypatch.setattr(allreduce, "measure_size", slow_fabric)
    allreduce._sweep(_rank(one_rank_group, tmp_path, deadline_s=6.0, max_bytes=16 * MiB))
    report = json.loads((tmp_path / "result.json").read_text())
    assert [row["bytes"] for row in report["rows"]] == [MiB] and report["finished"] is True
    assert report["skipped"] == [4 * MiB, 16 * MiB]
    assert report["skip_reason"].startswith(f"4194304 bytes and larger skipped: about {0.8 * allreduce.COLLECTIVES_PER_SIZE:.1f} s needed")

    report["devices"] = ["cpu (CPU)"]
    latency, busbw = allreduce._measurements(report, "gloo", 1)
    assert latency["value"] == pytest.approx(0.2e6)
    d = busbw["details"]
    assert d["outcome"] == "incomplete" and d["sizes_not_measured"] == [4 * MiB, 16 * MiB]
    assert d["reason"] == report["skip_reason"] and d["largest_bytes"] == MiB


def test_sweep_rewrites_the_report_after_every_size(one_rank_group, tmp_path, monkeypatch):
    seen = []
    measure = allreduce.measure_size

    def watched(rank, nbytes, size_deadline):
        path = tmp_path / "result.json"
        seen.append([row["bytes"] for row in json.loads(path.read_text())["rows"]] if path.exists() else None)
        return measure(rank, nbytes, size_deadline)

    monkeypatch.setattr(allreduce, "measure_size", watched)
    rank = _rank(one_rank_group, tmp_path, deadline_s=30.0, max_bytes=4 * MiB)
    allreduce._sweep(rank)
    assert seen == [None, [MiB]]  # 1 MiB was on disk before 4 MiB started
    report = json.loads((tmp_path / "result.json").read_text())
    assert report["finished"] is True and report["skipped"] == [] and len(report["rows"]) == 2
    for row in report["rows"]:  # timed in batches: N all-reduces per batch, BATCHES batches
        assert row["batches"] == allreduce.BATCHES and row["iterations"] >= allreduce.MIN_ITERATIONS
        assert row["summary_us"]["n"] == allreduce.BATCHES and row["wrong"] == 0
    assert "batches" in report["method"] and "wall clock" in report["method"]


# --- allreduce: real ranks over gloo ---------------------------------------------------------


def test_allreduce_stuck_inside_a_size_is_a_hang_that_keeps_the_sizes_measured_before_it():
    """Rank 0 only starts a size its estimate says fits: one still running at the deadline is stuck."""
    before = live_children()
    said = []
    ctx = BenchContext("cpu", "cpu", Budget(10.0), {"world_size": 2, "_test_stall_after_sizes": 1},
                       progress=said.append)
    latency, busbw = allreduce.run(ctx)
    assert latency["value"] > 0 and latency["details"]["bytes"] == MiB
    assert "batch" in latency["details"]["method"]
    d = busbw["details"]
    assert busbw["value"] > 0 and d["outcome"] == "hung" and d["check_ok"] is True
    assert [row["bytes"] for row in d["sizes"]] == [MiB] and d["sizes_not_measured"] == [4 * MiB]
    assert d["reason"].startswith("all-reduce hung: ranks 0, 1 did not finish 4194304 bytes by the 10 s deadline")
    assert "in 'all_reduce of 4194304 bytes'" in d["reason"] and d["reason"].endswith("measured 1048576 bytes before it")
    assert said[-1] == f"allreduce: {d['reason']}"
    assert live_children() <= before


def test_allreduce_complete_sweep_says_so():
    latency, busbw = allreduce.run(BenchContext("cpu", "cpu", Budget(30.0), {"world_size": 2}))
    d = busbw["details"]
    assert d["outcome"] == "complete" and d["sizes_not_measured"] == [] and "reason" not in d
    assert [row["bytes"] for row in d["sizes"]] == [MiB, 4 * MiB]
    assert latency["details"]["batches"] == allreduce.BATCHES


def test_allreduce_budget_starts_when_every_rank_has_started():
    """Ranks that take longer to start than the whole budget (importing torch on a loaded machine)
    still get the whole budget to measure in: the sweep completes."""
    before = live_children()
    latency, busbw = allreduce.run(BenchContext("cpu", "cpu", Budget(6.0), {"world_size": 2, "_test_slow_start_s": 7.0}))
    d = busbw["details"]
    assert d["outcome"] == "complete" and d["sizes_not_measured"] == [] and "reason" not in d
    assert [row["bytes"] for row in d["sizes"]] == [MiB, 4 * MiB]
    assert live_children() <= before


def test_allreduce_ranks_that_do_not_start_in_their_limit_skip_the_benchmark_and_say_why():
    """A loaded machine, not a broken one: skipped (never failed), naming the ranks still starting."""
    from gpuvet.bench import worker

    before = live_children()
    params = {"world_size": 2, "_test_slow_start_s": 600.0, "start_timeout_s": 2.0}
    with pytest.raises(allreduce.RanksDidNotStart) as caught:
        allreduce.run(BenchContext("cpu", "cpu", Budget(10.0), params))
    message = str(caught.value)
    # Each still importing torch, or (on a loaded machine) still starting Python.
    starting = "(?:importing torch|starting Python)"
    assert re.match(rf"the all-reduce ranks did not start within 2 s \(rank 0 in '{starting}'; rank 1 in '{starting}'; "
                    r"a loaded machine\? see `uptime`\): nothing measured", message), message
    assert caught.value.slow_ranks == [0, 1]
    result = worker.run_job({"module": "allreduce", "device": "cpu", "subject": "cpu", "budget_s": 10.0,
                             "params": params}, emit=lambda message: None)
    assert result["ok"] is False and "error" not in result and "did not start within 2 s" in result["skip"]
    assert live_children() <= before
