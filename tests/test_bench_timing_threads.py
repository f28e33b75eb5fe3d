"""Eight GPUs timed at once measure what one does (issue 24).

gpuvet runs every GPU's benchmark as a thread of one process. Each timed call is queued from
Python; with eight threads sharing the interpreter lock the host can take longer to queue a call
than a small shape takes to run (H100 bf16 2048x2048x13312, mamf-finder's best: ~141 us), and the
gap before each call was timed as GPU time: a healthy 8x H100 read WARN where one GPU passed.

Here a simulated GPU stands in for CUDA: each stream runs its kernels one after another in host
time, a kernel starting when it is queued or when the one before it ends, whichever is later; an
event completes when the stream reaches it. That is the arithmetic CUDA events measure, with no
GPU. The host work per call is real Python (it holds the lock), so eight threads contend as they
would in the worker.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from contextlib import contextmanager

import pytest
import torch

from gpuvet.bench import common

GPU_CALL_S = 150e-6  # about the published-best H100 shape's time on the GPU
GPUS = 8


def release_the_lock() -> None:
    """What torch does around each CUDA call: let the other threads run Python meanwhile."""
    time.sleep(0)  # a yield, not a wait


class SimStream:
    def __init__(self) -> None:
        self.free_at = 0.0
        self.lock = threading.Lock()

    def run(self, seconds: float) -> None:
        release_the_lock()
        with self.lock:
            self.free_at = max(time.perf_counter(), self.free_at) + seconds

    def reached(self) -> float:
        release_the_lock()
        with self.lock:
            return max(time.perf_counter(), self.free_at)


class SimEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        self.at = 0.0

    def record(self, stream: SimStream) -> None:
        self.at = stream.reached()

    def elapsed_time(self, end: SimEvent) -> float:
        return (end.at - self.at) * 1000.0


class SimCuda:
    """torch.cuda as time_each uses it: streams per device, events, _sleep, device()."""

    def __init__(self) -> None:
        self.streams: dict[str, SimStream] = {}
        self.local = threading.local()
        self.lock = threading.Lock()
        self.Event = SimEvent

    def current_stream(self, device: str | None = None) -> SimStream:
        device = device or self.local.device
        with self.lock:
            return self.streams.setdefault(device, SimStream())

    @contextmanager
    def device(self, device: str):
        self.local.device = device
        yield

    def _sleep(self, cycles: int) -> None:
        self.current_stream().run(cycles / common.ASSUMED_GPU_CLOCK_HZ)

    def synchronize(self, device: str | None = None) -> None:
        pass  # the events already hold the times the simulated stream reached them


def host_work(loops: int) -> int:
    """Python work that holds the interpreter lock, as queuing a torch call does."""
    total = 0
    for i in range(loops):
        total += i
    return total


def loops_for(seconds: float) -> int:
    """Loops of host_work that take `seconds` alone (the quickest of three tries: another process
    can only slow one down)."""
    tries = []
    for _ in range(3):
        t0 = time.perf_counter()
        host_work(100_000)
        tries.append((time.perf_counter() - t0) / 100_000)
    return max(1, int(seconds / min(tries)))


@pytest.fixture
def sim_cuda(monkeypatch):
    cuda = SimCuda()
    monkeypatch.setattr(torch, "cuda", cuda)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # torch hands the lock over at every call; a pure-Python loop would keep it 5 ms
    yield cuda
    sys.setswitchinterval(interval)


def median_call_s(gpus: int, loops: int, repeats: int = 160) -> float:
    """The median time each GPU's timer gives a GPU_CALL_S kernel, `gpus` timers at once."""
    medians: dict[int, float] = {}
    together = threading.Barrier(gpus)  # threads start one at a time; the timers must overlap

    def one(index: int) -> None:
        device = f"cuda:{index}"

        def call() -> None:
            host_work(loops)
            torch.cuda.current_stream(device).run(GPU_CALL_S)
        with torch.cuda.device(device):
            together.wait()
            medians[index] = statistics.median(common.time_each(device, call, repeats))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(gpus)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statistics.median(medians.values())


def test_eight_concurrent_timers_measure_what_one_does(sim_cuda):
    loops = loops_for(100e-6)  # 100 us of host work per call alone, under the GPU's 150; ~8x that with eight threads
    alone = median_call_s(1, loops)
    together = median_call_s(GPUS, loops)
    assert alone == pytest.approx(GPU_CALL_S, rel=0.1)
    assert together == pytest.approx(alone, rel=0.1)


def test_without_the_gpu_side_wait_eight_timers_time_the_host(sim_cuda, monkeypatch):
    monkeypatch.setattr(common, "host_ahead_wait", lambda device: None)
    loops = loops_for(100e-6)
    together = median_call_s(GPUS, loops)
    assert together > 1.5 * GPU_CALL_S  # the old timing: launch gaps counted as GPU time
