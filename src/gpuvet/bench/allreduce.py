"""B8: all-reduce latency and bus bandwidth with torch.distributed across local processes.

One process per rank (NCCL with one GPU each on CUDA; gloo on the CPU) sums a float32 buffer of
growing size. For each size: the time of one all-reduce (median over iterations of the slowest
rank's time), algbw = bytes / time / 1e9 and busbw = algbw * 2(n-1)/n, the nccl-tests definitions,
so busbw compares directly with what the slowest link (NVLink, PCIe) carries. The 1 MiB time is
the latency figure; busbw at the largest size is the bandwidth figure. Every size is checked: each
rank contributes rank+1, so every element must sum to n(n+1)/2.

The ranks are separate Python processes (`python -m gpuvet.bench.allreduce CONFIG`) in their own
session. NCCL initialisation can hang for ever on a broken fabric, so the parent holds a hard
deadline: when it passes, every rank is killed and the error names the ranks that hung and the
step each was in. Ranks are also killed when the parent dies (PR_SET_PDEATHSIG) and end themselves
shortly after the deadline, so none is ever left behind.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .common import BenchContext, Skip, measurement, summary

MiB = 1024 * 1024
LATENCY_BYTES = MiB
CUDA_MAX_BYTES = 1024 * MiB
CPU_MAX_BYTES = 4 * MiB
SIZE_STEP = 4  # sizes grow 1, 4, 16, ... MiB
MAX_ITERATIONS = 50
MIN_ITERATIONS = 3
WARMUP_ITERATIONS = 2
TEARDOWN_S = 3.0  # kept free at the end of the deadline for destroy_process_group and exit
RANK_GRACE_S = 10.0  # a rank ends itself this long after the deadline if nobody killed it
DTYPE = "float32"  # nccl-tests' default; sums of small integers are exact in it


@dataclass
class RankConfig:
    """What the parent tells every rank (as JSON, through a file)."""

    rank: int
    world_size: int
    backend: str  # "nccl" or "gloo"
    device: str  # "cuda:N" or "cpu"
    port: int
    deadline: float  # time.monotonic() (system-wide on Linux) by which the rank must be done
    workdir: str
    parent_pid: int
    max_bytes: int | None = None  # None: min(1 GiB, free GPU memory / 8), agreed between ranks
    hang: bool = False  # tests only: this rank never joins


class AllReduceHung(RuntimeError):
    def __init__(self, message: str, hung_ranks: list[int]):
        super().__init__(message)
        self.hung_ranks = hung_ranks


class RankFailed(RuntimeError):
    pass


def algbw_gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def busbw_gbps(algbw: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: each byte crosses 2(n-1)/n links."""
    return algbw * 2 * (world_size - 1) / world_size


def sweep_sizes(max_bytes: int, start: int = LATENCY_BYTES, step: int = SIZE_STEP) -> list[int]:
    """start, start*step, ... below max_bytes, then max_bytes itself (alone if it is below start)."""
    sizes = []
    size = start
    while size < max_bytes:
        sizes.append(size)
        size *= step
    return sizes + [max_bytes]


# --- parent ----------------------------------------------------------------------------------


def run(ctx: BenchContext) -> list[dict]:
    backend, devices = _placement(ctx)
    world_size = len(devices)
    if world_size < 2:
        raise Skip(f"all-reduce needs at least 2 ranks; world_size is {world_size}")
    timeout_s = min(float(ctx.params.get("timeout_s", ctx.budget.remaining())), ctx.budget.remaining())
    if timeout_s <= 0:
        raise Skip("no time left in the budget for the all-reduce")
    max_bytes = ctx.params.get("max_bytes", None if backend == "nccl" else CPU_MAX_BYTES)
    hang_rank = ctx.params.get("_test_hang_rank")  # tests: a rank that never joins
    ctx.progress(f"allreduce: {world_size} ranks ({backend})")
    started = time.monotonic()
    result = run_ranks(backend, devices, timeout_s, max_bytes=None if max_bytes is None else int(max_bytes),
                       hang_rank=None if hang_rank is None else int(hang_rank))
    result["wall_s"] = round(time.monotonic() - started, 3)
    return _measurements(result, backend, world_size)


def _placement(ctx: BenchContext) -> tuple[str, list[str]]:
    """The backend and each rank's device."""
    if not ctx.is_cuda:
        return "gloo", ["cpu"] * int(ctx.params.get("world_size", 2))
    import torch

    count = torch.cuda.device_count()
    gpus = [int(g) for g in ctx.params.get("gpus") or range(count)]
    world_size = int(ctx.params.get("world_size", len(gpus)))
    if world_size > len(gpus):
        raise Skip(f"all-reduce over {world_size} ranks needs {world_size} GPUs (one per rank); {len(gpus)} available")
    return "nccl", [f"cuda:{g}" for g in gpus[:world_size]]


def run_ranks(backend: str, devices: list[str], timeout_s: float, max_bytes: int | None = None,
              hang_rank: int | None = None) -> dict[str, Any]:
    """Start one process per device, wait at most `timeout_s`, return rank 0's report.
    Raises AllReduceHung (deadline passed) or RankFailed (a rank exited with an error)."""
    deadline = time.monotonic() + timeout_s
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="gpuvet-allreduce-") as workdir:
        configs = [RankConfig(rank=r, world_size=len(devices), backend=backend, device=d, port=port,
                              deadline=deadline, workdir=workdir, parent_pid=os.getpid(), max_bytes=max_bytes,
                              hang=r == hang_rank) for r, d in enumerate(devices)]
        procs: list[subprocess.Popen] = []
        try:
            for c in configs:
                procs.append(_start_rank(c))
            _wait(procs, deadline, timeout_s, Path(workdir))
            return _read_result(Path(workdir), len(devices))
        finally:  # also on Ctrl-C and on errors: no rank may survive
            _kill_all(procs)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the store binds it a moment later; a race is unlikely)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_rank(config: RankConfig) -> subprocess.Popen:
    workdir = Path(config.workdir)
    config_path = workdir / f"rank{config.rank}.json"
    config_path.write_text(json.dumps(asdict(config)))
    package_root = str(Path(__file__).resolve().parents[2])  # the folder that holds `gpuvet`
    env = dict(os.environ)
    env.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(config.port),
        "RANK": str(config.rank), "WORLD_SIZE": str(config.world_size),
        "LOCAL_RANK": str(config.rank), "LOCAL_WORLD_SIZE": str(config.world_size),
        "PYTHONPATH": os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p),
        "PYTHONUNBUFFERED": "1",
    })
    with open(workdir / f"rank{config.rank}.log", "wb") as log:
        # Own session: Ctrl-C in the terminal reaches only the parent, which then kills the ranks.
        return subprocess.Popen([sys.executable, "-m", "gpuvet.bench.allreduce", str(config_path)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)


def _wait(procs: list[subprocess.Popen], deadline: float, timeout_s: float, workdir: Path) -> None:
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, code in enumerate(codes) if code not in (None, 0)]
        if failed:  # the others would wait for it for ever; which failed first is unknown: name all
            raise RankFailed("all-reduce failed: " + "; ".join(
                f"rank {r} exited with {codes[r]} during '{last_step(workdir, r)}': {_log_tail(workdir, r)}"
                for r in failed))
        if all(code == 0 for code in codes):
            return
        if time.monotonic() >= deadline:
            running = [r for r, code in enumerate(codes) if code is None]
            if (workdir / "result.json").exists() and all(last_step(workdir, r) == "teardown" for r in running):
                return  # measured and reported; only the process group's teardown is slow
            steps = "; ".join(f"rank {r} in '{last_step(workdir, r)}'" for r in running)
            raise AllReduceHung(f"all-reduce did not finish in {timeout_s:.0f} s: ranks "
                                f"{', '.join(map(str, running))} hung ({steps})", running)
        try:
            procs[next(r for r, code in enumerate(codes) if code is None)].wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            pass


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the rank leads its own group: helpers go too
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # stuck in the driver; the kernel reaps it eventually
            pass


def last_step(workdir: Path, rank: int) -> str:
    try:
        lines = (workdir / f"rank{rank}.step").read_text().splitlines()
    except OSError:
        return "starting Python"
    return lines[-1] if lines else "starting Python"


def _log_tail(workdir: Path, rank: int, lines: int = 3) -> str:
    try:
        text = (workdir / f"rank{rank}.log").read_text(errors="replace")
    except OSError:
        return "no output"
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(tail)[-600:] or "no output"


def _read_result(workdir: Path, world_size: int) -> dict[str, Any]:
    try:
        result = json.loads((workdir / "result.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise RankFailed(f"all-reduce ranks exited without a report ({err}): {_log_tail(workdir, 0)}") from None
    result["devices"] = [_read_text(workdir / f"rank{r}.device") for r in range(world_size)]
    return result


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _measurements(result: dict[str, Any], backend: str, world_size: int) -> list[dict]:
    rows = result["rows"]
    largest = rows[-1]
    check_ok = all(row["wrong"] == 0 for row in rows)
    common = {"world_size": world_size, "backend": backend, "dtype": result["dtype"], "devices": result["devices"]}
    latency_row = next((row for row in rows if row["bytes"] == LATENCY_BYTES), rows[0])
    latency = measurement(
        "allreduce.latency_1mb", latency_row["time_us"], "us", "machine", bytes=latency_row["bytes"],
        iterations=latency_row["iterations"], summary=latency_row["summary_us"], **common,
        measures="median over iterations of the slowest rank's time for one all-reduce")
    busbw = measurement(
        "allreduce.busbw", largest["busbw_gbps"], "GB/s", "machine", largest_bytes=largest["bytes"],
        algbw_gbps=largest["algbw_gbps"], time_us=largest["time_us"], sizes=rows, check_ok=check_ok,
        expected_sum=world_size * (world_size + 1) // 2, wall_s=result.get("wall_s"), **common,
        formula="algbw = bytes / time / 1e9; busbw = algbw * 2(n-1)/n (nccl-tests)")
    return [latency, busbw]


# --- rank ------------------------------------------------------------------------------------


@dataclass
class _Rank:
    config: RankConfig
    torch: Any
    dist: Any
    device: Any
    step_file: Path
    rows: list[dict[str, Any]] = field(default_factory=list)

    def step(self, name: str) -> None:
        with open(self.step_file, "a") as f:
            f.write(name + "\n")


def rank_main(config_path: str) -> None:
    config = RankConfig(**json.loads(Path(config_path).read_text()))
    _die_with_parent(config.parent_pid)
    _exit_after(config.deadline + RANK_GRACE_S)
    step_file = Path(config.workdir) / f"rank{config.rank}.step"
    if config.hang:  # tests: a rank that never shows up; the others wait for it in init
        step_file.write_text("hanging on purpose (test)\n")
        threading.Event().wait()
    step_file.write_text("importing torch\n")
    import torch
    import torch.distributed as dist

    device = torch.device(config.device)
    if config.backend == "nccl":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # the ranks share the CPU; gloo has its own threads
    rank = _Rank(config, torch, dist, device, step_file)
    name = torch.cuda.get_device_name(device) if config.backend == "nccl" else "CPU"
    (Path(config.workdir) / f"rank{config.rank}.device").write_text(f"{config.device} ({name})")
    rank.step("init_process_group")
    # Past the parent's deadline: the parent, not a collective's timeout, decides what hung.
    timeout = datetime.timedelta(seconds=max(1.0, config.deadline - time.monotonic()) + RANK_GRACE_S)
    dist.init_process_group(config.backend, rank=config.rank, world_size=config.world_size, timeout=timeout)
    _sweep(rank)
    rank.step("teardown")
    dist.barrier()
    dist.destroy_process_group()


def _sweep(rank: _Rank) -> None:
    config = rank.config
    sizes = sweep_sizes(_agreed_max_bytes(rank))
    for left, nbytes in zip(range(len(sizes), 0, -1), sizes):
        rank.step(f"all_reduce of {nbytes} bytes")
        size_deadline = time.monotonic() + (config.deadline - TEARDOWN_S - time.monotonic()) / left
        rank.rows.append(_measure_size(rank, nbytes, size_deadline))
    if config.rank == 0:
        report = {"rows": rank.rows, "dtype": DTYPE}
        path = Path(config.workdir) / "result.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report))
        tmp.replace(path)  # the parent never reads half a report


def _agreed_max_bytes(rank: _Rank) -> int:
    """The largest size every rank can hold: the configured one, or min(1 GiB, free/8)."""
    torch = rank.torch
    if rank.config.max_bytes is not None:
        mine = rank.config.max_bytes
    else:
        free, _total = torch.cuda.mem_get_info(rank.device)
        mine = min(CUDA_MAX_BYTES, free // 8)
    mine = max(4096, mine - mine % 4)  # whole float32 elements
    value = torch.tensor([mine], dtype=torch.int64, device=rank.device)
    rank.dist.all_reduce(value, op=rank.dist.ReduceOp.MIN)
    return int(value.item())


def _measure_size(rank: _Rank, nbytes: int, size_deadline: float) -> dict[str, Any]:
    torch, dist, n = rank.torch, rank.dist, rank.config.world_size
    buffer = torch.empty(nbytes // 4, dtype=torch.float32, device=rank.device)
    wrong = _check(rank, buffer)
    buffer.zero_()  # sums of zeros stay zero: no overflow however many iterations run
    for _ in range(WARMUP_ITERATIONS):
        dist.all_reduce(buffer)
    (one,) = _timed(rank, buffer, 1)
    iterations = _agreed_iterations(rank, size_deadline - time.monotonic(), one)
    times = _timed(rank, buffer, iterations)
    median_s = statistics.median(times)
    algbw = algbw_gbps(nbytes, median_s)
    return {"bytes": nbytes, "iterations": iterations, "time_us": round(median_s * 1e6, 3),
            "algbw_gbps": algbw, "busbw_gbps": busbw_gbps(algbw, n), "wrong": wrong,
            "summary_us": summary([t * 1e6 for t in times])}


def _check(rank: _Rank, buffer: Any) -> int:
    """Elements, over all ranks, that did not sum to n(n+1)/2 when each rank gave rank+1."""
    torch, dist, n = rank.torch, rank.dist, rank.config.world_size
    buffer.fill_(rank.config.rank + 1)
    dist.all_reduce(buffer)
    wrong = (buffer != n * (n + 1) // 2).sum().to(torch.int64).reshape(1)
    dist.all_reduce(wrong)
    return int(wrong.item())


def _agreed_iterations(rank: _Rank, seconds: float, one: float) -> int:
    """Rank 0 decides (all ranks must run the same number of collectives) and tells the others."""
    torch = rank.torch
    mine = MIN_ITERATIONS if one <= 0 else max(MIN_ITERATIONS, min(MAX_ITERATIONS, int(seconds / one)))
    count = torch.tensor([mine], dtype=torch.int64, device=rank.device)
    rank.dist.broadcast(count, src=0)
    return int(count.item())


def _timed(rank: _Rank, buffer: Any, iterations: int) -> list[float]:
    """Seconds per all-reduce, each the slowest rank's: the operation ends when all ranks have it."""
    torch, dist = rank.torch, rank.dist
    if rank.config.backend == "nccl":
        # all_reduce makes the current stream wait for NCCL's, so events on it bracket the collective
        stream = torch.cuda.current_stream(rank.device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iterations)]
        for start, end in events:
            start.record(stream)
            dist.all_reduce(buffer)
            end.record(stream)
        stream.synchronize()
        mine = [start.elapsed_time(end) / 1000.0 for start, end in events]
    else:
        mine = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            dist.all_reduce(buffer)
            mine.append(time.perf_counter() - t0)
    slowest = torch.tensor(mine, dtype=torch.float64, device=rank.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist()


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to kill this rank when the parent dies, and stop now if it already has."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(3)


def _exit_after(deadline: float) -> None:
    """The last resort when the parent is gone and a collective never returns."""
    delay = max(0.0, deadline - time.monotonic())
    timer = threading.Timer(delay, os._exit, args=(4,))
    timer.daemon = True
    timer.start()


if __name__ == "__main__":
    rank_main(sys.argv[1])
