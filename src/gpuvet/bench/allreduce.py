"""B8: all-reduce latency and bus bandwidth with torch.distributed across local processes.

One process per rank (NCCL with one GPU each on CUDA; gloo on the CPU) sums a float32 buffer of
growing size. For each size, the time of one all-reduce is timed as nccl-tests does: over a batch
of N back-to-back all-reduces (one start event, N all-reduces enqueued, one end event, divided by
N; on CUDA a GPU sleep is enqueued first so that the host runs ahead and Python's launch cost is
not what gets timed; on gloo the wall clock around N calls), the slowest rank's batch counting
(max over ranks), median over a few batches. From it algbw = bytes / time / 1e9 and busbw =
algbw * 2(n-1)/n, the nccl-tests definitions, so busbw compares directly with what the slowest link
(NVLink, PCIe) carries. The 1 MiB time is the latency figure; busbw at the largest size measured is
the bandwidth figure. Every size is checked: each rank contributes rank+1, so every element must
sum to n(n+1)/2.

The ranks are separate Python processes (`python -m gpuvet.bench.allreduce CONFIG`) in their own
session, meeting through a FileStore in a private folder (no TCP port to pick). Rank 0 rewrites
its report after every size. A size whose estimated time (the last size's time per all-reduce,
scaled by the size ratio, times the all-reduces a size needs) does not fit in the time left is
skipped, with the larger ones. Starting the ranks (Python, importing torch) is not measuring: on a
loaded machine it can take tens of seconds, so it has a limit of its own (START_UP_S), and the
budget starts when every rank has started (they meet in the store). Ranks that do not start in
that limit are a loaded machine, not a fault: the benchmark is skipped and says so
(RanksDidNotStart). NCCL initialisation can hang for ever on a broken fabric, so the
parent holds a hard deadline from there: when it passes, every rank is killed and the ranks that hung are
named with the step each was in; the sizes measured before it are kept (outcome "hung"). A sweep
whose larger sizes were skipped for time is "incomplete". Ranks are also killed when the parent dies (PR_SET_PDEATHSIG) and end
themselves shortly after the deadline, so none is ever left behind.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .common import ASSUMED_GPU_CLOCK_HZ, BenchContext, Skip, measurement, summary
from .leftovers import scratch_dir, signals_deferred

MiB = 1024 * 1024
LATENCY_BYTES = MiB
CUDA_MAX_BYTES = 1024 * MiB
CPU_MAX_BYTES = 4 * MiB
SIZE_STEP = 4  # sizes grow 1, 4, 16, ... MiB
MAX_ITERATIONS = 50  # all-reduces in one timed batch, at most
MIN_ITERATIONS = 1  # ... and at least (a large size on a slow PCIe box takes ~0.2 s a call: one is enough)
BATCHES = 5  # timed batches per size; the figure is their median
WARMUP_ITERATIONS = 2
CALIBRATION_ITERATIONS = 2  # one short timed batch that sizes the real ones
# All-reduces of the buffer one size needs at the least: the sum check, warm-up, calibration, batches.
COLLECTIVES_PER_SIZE = 1 + WARMUP_ITERATIONS + CALIBRATION_ITERATIONS + BATCHES * MIN_ITERATIONS
TEARDOWN_S = 3.0  # kept free at the end of the deadline for destroy_process_group and exit
RANK_GRACE_S = 10.0  # a rank ends itself this long after the deadline if nobody killed it
# How long the ranks may take to start (Python, import torch) before the budget starts: generous,
# since a loaded machine is slow there. Within the worker's deadline for the job (twice its budget
# plus 45 s, bench/plan.py): start_up_limit_s keeps start-up, budget and reaping inside it.
START_UP_S = 60.0
START_UP_BEYOND_BUDGET_S = 25.0
REAP_S = 10.0  # after SIGKILL, how long the parent waits in all for the ranks to be reaped
DTYPE = "float32"  # nccl-tests' default; sums of small integers are exact in it
# The GPU sleep ahead of a timed batch: long enough for the host to enqueue the whole batch.
HOST_AHEAD_BASE_S = 0.5e-3
LAUNCH_ALLOWANCE_S = 50e-6  # per all-reduce enqueued from Python (~10-30 us in practice)
HOST_AHEAD_MAX_S = 0.05


@dataclass
class RankConfig:
    """What the parent tells every rank (as JSON, through a file)."""

    rank: int
    world_size: int
    backend: str  # "nccl" or "gloo"
    device: str  # "cuda:N" or "cpu"
    deadline: float  # time.monotonic() (system-wide on Linux) by which the rank must be done
    workdir: str  # private to the run: the ranks' FileStore, reports and logs
    parent_pid: int
    max_bytes: int | None = None  # None: min(1 GiB, free GPU memory / 8), agreed between ranks
    # With budget_s: every rank must have started by start_by, and `deadline` becomes budget_s
    # after the moment the last one did (start-up is not the measurement's time).
    start_by: float | None = None
    budget_s: float | None = None
    hang: bool = False  # tests only: this rank starts, then never joins the process group
    stall_after_sizes: int | None = None  # tests only: stop for ever before measuring this many sizes
    slow_start_s: float | None = None  # tests only: importing torch takes this much longer (a loaded machine)


class AllReduceHung(RuntimeError):
    def __init__(self, message: str, hung_ranks: list[int]):
        super().__init__(message)
        self.hung_ranks = hung_ranks


class RankFailed(RuntimeError):
    pass


class RanksDidNotStart(Skip):
    """The ranks had not all started (Python, import torch) within the start-up limit: a loaded
    machine, not a fault of its GPUs or links; nothing was measured."""

    def __init__(self, message: str, slow_ranks: list[int]):
        super().__init__(message)
        self.slow_ranks = slow_ranks


def start_up_limit_s(timeout_s: float) -> float:
    """The ranks' start-up limit for a sweep of `timeout_s`: START_UP_S, less for short budgets so
    that start-up, budget and reaping fit in the worker's deadline for the job."""
    return min(START_UP_S, timeout_s + START_UP_BEYOND_BUDGET_S)


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


def estimated_size_s(last_bytes: int, last_call_s: float, next_bytes: int,
                     collectives: int = COLLECTIVES_PER_SIZE) -> float:
    """Seconds the next size should take: the last size's time per all-reduce, scaled by the size
    ratio (pessimistic: small sizes are latency-bound), times the all-reduces a size needs."""
    return last_call_s * (next_bytes / last_bytes) * collectives


def size_skip_reason(last_bytes: int, last_call_s: float, next_bytes: int, left_s: float,
                     collectives: int = COLLECTIVES_PER_SIZE) -> str | None:
    """Why the next size (and every larger one) is not run, or None when it fits in `left_s`."""
    estimate = estimated_size_s(last_bytes, last_call_s, next_bytes, collectives)
    if estimate <= left_s:
        return None
    return (f"{next_bytes} bytes and larger skipped: about {estimate:.1f} s needed ({collectives} all-reduces at "
            f"{last_call_s * 1e6:.0f} us x {next_bytes / last_bytes:g}, from the {last_bytes}-byte size) "
            f"but {max(0.0, left_s):.1f} s left")


def host_ahead_cycles(calls: int, clock_hz: float = ASSUMED_GPU_CLOCK_HZ) -> int:
    """GPU clock cycles to sleep ahead of a timed batch of `calls` all-reduces, so that the host has
    enqueued them all before the first starts and the batch measures the fabric, not Python."""
    seconds = min(HOST_AHEAD_MAX_S, HOST_AHEAD_BASE_S + calls * LAUNCH_ALLOWANCE_S)
    return int(seconds * clock_hz)


def timing_method(backend: str, host_ahead: bool) -> str:
    per_batch = ("one CUDA event pair around N back-to-back all-reduces"
                 + (" enqueued behind a GPU sleep (torch.cuda._sleep) so the host runs ahead" if host_ahead else "")
                 if backend == "nccl" else "the wall clock around N back-to-back all-reduce calls")
    return (f"per size: {BATCHES} timed batches of N all-reduces (N = {MIN_ITERATIONS}-{MAX_ITERATIONS}, "
            f"to fit the time), ranks aligned by a small all-reduce before each; a batch is timed with {per_batch}, "
            "divided by N; each batch counts as its slowest rank's (max over ranks); the figure is the median "
            "over batches (nccl-tests' method)")


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
    stall = ctx.params.get("_test_stall_after_sizes")  # tests: the ranks stop for ever after this many sizes
    slow_start = ctx.params.get("_test_slow_start_s")  # tests: the ranks take this much longer to start
    start_timeout = ctx.params.get("start_timeout_s")
    ctx.progress(f"allreduce: {world_size} ranks ({backend})")
    started = time.monotonic()
    result = run_ranks(backend, devices, timeout_s, max_bytes=None if max_bytes is None else int(max_bytes),
                       hang_rank=None if hang_rank is None else int(hang_rank),
                       stall_after_sizes=None if stall is None else int(stall),
                       start_timeout_s=None if start_timeout is None else float(start_timeout),
                       slow_start_s=None if slow_start is None else float(slow_start))
    result["wall_s"] = round(time.monotonic() - started, 3)
    measurements = _measurements(result, backend, world_size)
    if measurements[-1]["details"]["outcome"] != "complete":
        ctx.progress(f"allreduce: {measurements[-1]['details']['reason']}")
    return measurements


def _placement(ctx: BenchContext) -> tuple[str, list[str]]:
    """The backend and each rank's device."""
    if not ctx.is_cuda:
        return "gloo", ["cpu"] * int(ctx.params.get("world_size", 2))
    import torch

    from .p2p import validate_gpus  # the same checks as the copies: each ordinal once, and visible

    gpus = validate_gpus(ctx.params.get("gpus") or None, torch.cuda.device_count())
    world_size = int(ctx.params.get("world_size", len(gpus)))
    if world_size > len(gpus):
        raise Skip(f"all-reduce over {world_size} ranks needs {world_size} GPUs (one per rank); {len(gpus)} available")
    return "nccl", [f"cuda:{g}" for g in gpus[:world_size]]


def run_ranks(backend: str, devices: list[str], timeout_s: float, max_bytes: int | None = None,
              hang_rank: int | None = None, stall_after_sizes: int | None = None,
              start_timeout_s: float | None = None, slow_start_s: float | None = None) -> dict[str, Any]:
    """Start one process per device, give them `start_timeout_s` (start_up_limit_s) to start, then
    `timeout_s` from when the last one did; return rank 0's report (with "hung" set, saying where,
    when the deadline passed after some sizes were measured). Raises RanksDidNotStart (start-up
    limit passed), AllReduceHung (deadline passed, nothing measured) or RankFailed (a rank exited
    with an error)."""
    start_s = start_up_limit_s(timeout_s) if start_timeout_s is None else start_timeout_s
    start_by = time.monotonic() + start_s
    with scratch_dir("gpuvet-allreduce-") as workdir:  # removed on SIGTERM too (the worker's handler)
        configs = [RankConfig(rank=r, world_size=len(devices), backend=backend, device=d,
                              deadline=start_by + timeout_s, workdir=workdir, parent_pid=os.getpid(), max_bytes=max_bytes,
                              start_by=start_by, budget_s=timeout_s,
                              hang=r == hang_rank, stall_after_sizes=stall_after_sizes, slow_start_s=slow_start_s)
                   for r, d in enumerate(devices)]
        procs: list[subprocess.Popen] = []
        try:
            with signals_deferred():  # a Ctrl-C inside a fork would leave a rank not in `procs`
                for c in configs:
                    procs.append(_start_rank(c))
            hung = _wait(procs, Limits(start_by, start_s, timeout_s), Path(workdir))
            result = _read_result(Path(workdir), len(devices))
            if hung:
                result["hung"] = hung
            return result
        finally:  # also on Ctrl-C and on errors: no rank may survive
            _kill_all(procs)


def store_url(workdir: str | Path) -> str:
    """The ranks' rendezvous: a FileStore in the run's private folder (one machine; no port to pick)."""
    return f"file://{Path(workdir).resolve() / 'store'}"


def _start_rank(config: RankConfig) -> subprocess.Popen:
    workdir = Path(config.workdir)
    config_path = workdir / f"rank{config.rank}.json"
    config_path.write_text(json.dumps(asdict(config)))
    with open(workdir / f"rank{config.rank}.log", "wb") as log:
        # Own session: Ctrl-C in the terminal reaches only the parent, which then kills the ranks.
        return subprocess.Popen([sys.executable, "-m", "gpuvet.bench.allreduce", str(config_path)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=rank_env(config, os.environ), start_new_session=True)


def rank_env(config: RankConfig, base: dict[str, str] | os._Environ) -> dict[str, str]:
    """A rank's environment: the parent's, its place in the group, and NCCL_DEBUG=WARN unless the
    user chose a level, so that a failed rank's log tail names NCCL's own reason."""
    package_root = str(Path(__file__).resolve().parents[2])  # the folder that holds `gpuvet`
    env = dict(base)
    env.update({
        "RANK": str(config.rank), "WORLD_SIZE": str(config.world_size),
        "LOCAL_RANK": str(config.rank), "LOCAL_WORLD_SIZE": str(config.world_size),
        "PYTHONPATH": os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p),
        "PYTHONUNBUFFERED": "1",
    })
    env.setdefault("NCCL_DEBUG", "WARN")
    return env


@dataclass
class Limits:
    """The parent's clock for the ranks: start-up by `start_by` (`start_s` after they were
    started), then `timeout_s` from when the last rank started."""

    start_by: float
    start_s: float
    timeout_s: float


def _wait(procs: list[subprocess.Popen], limits: Limits, workdir: Path) -> str | None:
    """Until every rank has exited, or the deadline. Returns None when the sweep finished, or why
    it was cut short when the deadline passed after some sizes were measured (those are kept)."""
    timeout_s = limits.timeout_s
    deadline: float | None = None  # known once every rank has started
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, code in enumerate(codes) if code not in (None, 0)]
        if failed:  # the others would wait for it for ever; which failed first is unknown: name all
            raise RankFailed("all-reduce failed: " + "; ".join(
                f"rank {r} exited with {codes[r]} during '{last_step(workdir, r)}': {_log_tail(workdir, r)}"
                for r in failed))
        if all(code == 0 for code in codes):
            return None
        if deadline is None:
            budget_from = read_budget_from(workdir)
            if budget_from is not None:
                deadline = budget_from + timeout_s
            elif time.monotonic() >= limits.start_by:
                _did_not_start(workdir, len(procs), limits.start_s)
        elif time.monotonic() >= deadline:
            running = [r for r, code in enumerate(codes) if code is None]
            report = _read_report(workdir)
            if report and report.get("finished"):
                return None  # measured and reported; only the process group's teardown is slow
            steps = "; ".join(f"rank {r} in '{last_step(workdir, r)}'" for r in running)
            if report and report.get("rows"):
                # Rank 0 only starts a size that its estimate says fits, so a size still running at
                # the deadline is stuck (a dead link, an NCCL hang): a hang, with the sizes before it kept.
                done = [row["bytes"] for row in report["rows"]]
                rest = [size for size in report.get("sizes", []) if size not in done]
                return (f"all-reduce hung: ranks {', '.join(map(str, running))} did not finish "
                        f"{rest[0] if rest else 'the next'} bytes by the {timeout_s:.0f} s deadline ({steps}); "
                        f"measured {', '.join(map(str, done))} bytes before it")
            raise AllReduceHung(f"all-reduce did not finish in {timeout_s:.0f} s: ranks "
                                f"{', '.join(map(str, running))} hung ({steps})", running)
        try:
            procs[next(r for r, code in enumerate(codes) if code is None)].wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            pass


def _did_not_start(workdir: Path, world_size: int, start_s: float) -> None:
    """Raise RanksDidNotStart, naming the ranks still starting and where each was."""
    steps = {r: last_step(workdir, r) for r in range(world_size)}
    slow = [r for r, step in steps.items() if step != WAITING_FOR_RANKS] or list(steps)
    where = "; ".join(f"rank {r} in '{steps[r]}'" for r in slow)
    raise RanksDidNotStart(f"the all-reduce ranks did not start within {start_s:.0f} s ({where}; a loaded machine? "
                           "see `uptime`): nothing measured, which says nothing against the GPUs or their links", slow)


def read_budget_from(workdir: Path) -> float | None:
    """When the last rank started (time.monotonic()), as rank 0 wrote it; None before."""
    try:
        return float((workdir / "budget_from").read_text())
    except (OSError, ValueError):
        return None


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the rank leads its own group: helpers go too
            except ProcessLookupError:
                pass
    reap(procs, REAP_S)


def reap(procs: list[Any], total_s: float, clock: Any = time.monotonic) -> list[int]:
    """Wait for the killed ranks, at most `total_s` for all of them together (not each: eight ranks
    stuck in the driver must not hold the parent past the worker's own deadline and lose the
    message that says what hung). Returns the indices of those not reaped; the kernel reaps them
    eventually."""
    until = clock() + total_s
    left = []
    for i, p in enumerate(procs):
        try:
            p.wait(timeout=max(0.0, until - clock()))
        except subprocess.TimeoutExpired:
            left.append(i)
    return left


def last_step(workdir: Path, rank: int) -> str:
    try:
        lines = (workdir / f"rank{rank}.step").read_text().splitlines()
    except OSError:
        return "starting Python"
    return lines[-1] if lines else "starting Python"


def _log_tail(workdir: Path, rank: int, lines: int = 3) -> str:
    """The rank's last lines, led by NCCL's last warning (NCCL_DEBUG=WARN) when the traceback
    after it would push it out: that line names NCCL's own cause."""
    try:
        text = (workdir / f"rank{rank}.log").read_text(errors="replace")
    except OSError:
        return "no output"
    kept = [line for line in text.splitlines() if line.strip()]
    tail = kept[-lines:]
    warnings = [line.strip() for line in kept[:-lines] if "NCCL WARN" in line]
    if warnings:
        return (warnings[-1][:300] + " | " + " | ".join(tail)[-300:])
    return " | ".join(tail)[-600:] or "no output"


def _read_report(workdir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((workdir / "result.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _read_result(workdir: Path, world_size: int) -> dict[str, Any]:
    try:
        result = json.loads((workdir / "result.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise RankFailed(f"all-reduce ranks exited without a report ({err}): {_log_tail(workdir, 0)}") from None
    if not result.get("rows"):
        raise RankFailed(f"all-reduce ranks exited without measuring a size: {_log_tail(workdir, 0)}")
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
    method = result.get("method") or timing_method(backend, backend == "nccl")
    latency_row = next((row for row in rows if row["bytes"] == LATENCY_BYTES), rows[0])
    latency = measurement(
        "allreduce.latency_1mb", latency_row["time_us"], "us", "machine", bytes=latency_row["bytes"],
        iterations=latency_row["iterations"], batches=latency_row.get("batches"), summary=latency_row["summary_us"],
        **common, measures="time of one all-reduce: a batch's time divided by its all-reduces, slowest rank, "
                           "median over batches", method=method)
    measured = [row["bytes"] for row in rows]
    not_measured = [size for size in result.get("sizes", measured) if size not in measured]
    reason = result.get("hung") or result.get("skip_reason")
    if not_measured and not reason:
        reason = "sweep incomplete: sizes not measured"
    outcome = "hung" if result.get("hung") else "incomplete" if not_measured else "complete"
    busbw = measurement(
        "allreduce.busbw", largest["busbw_gbps"], "GB/s", "machine", largest_bytes=largest["bytes"],
        algbw_gbps=largest["algbw_gbps"], time_us=largest["time_us"], sizes=rows, check_ok=check_ok,
        expected_sum=world_size * (world_size + 1) // 2, wall_s=result.get("wall_s"), **common,
        outcome=outcome, sizes_not_measured=not_measured,
        **({"reason": reason} if not_measured else {}), method=method,
        formula="algbw = bytes / time / 1e9; busbw = algbw * 2(n-1)/n (nccl-tests)")
    return [latency, busbw]


# --- rank ------------------------------------------------------------------------------------


@dataclass
class Rank:
    config: RankConfig
    torch: Any
    dist: Any
    device: Any
    step_file: Path
    rows: list[dict[str, Any]] = field(default_factory=list)

    def step(self, name: str) -> None:
        with open(self.step_file, "a") as f:
            f.write(name + "\n")


WAITING_FOR_RANKS = "waiting for the other ranks to start"


def rank_main(config_path: str) -> None:
    config = RankConfig(**json.loads(Path(config_path).read_text()))
    rank_dies_with_parent(config.parent_pid)
    exit_after(config.deadline + RANK_GRACE_S)  # the latest: every rank started at start_by, then the budget
    step_file = Path(config.workdir) / f"rank{config.rank}.step"
    step_file.write_text("importing torch\n")
    if config.slow_start_s:  # tests: a loaded machine, where starting takes longer
        threading.Event().wait(config.slow_start_s)
    import torch
    import torch.distributed as dist

    store = _meet(config, dist, step_file)
    if config.hang:  # tests: a rank that never shows up; the others wait for it in init
        with open(step_file, "a") as f:
            f.write("hanging on purpose (test)\n")
        threading.Event().wait()
    device = torch.device(config.device)
    if config.backend == "nccl":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # the ranks share the CPU; gloo has its own threads
    rank = Rank(config, torch, dist, device, step_file)
    name = torch.cuda.get_device_name(device) if config.backend == "nccl" else "CPU"
    (Path(config.workdir) / f"rank{config.rank}.device").write_text(f"{config.device} ({name})")
    rank.step("init_process_group")
    # Past the parent's deadline: the parent, not a collective's timeout, decides what hung.
    timeout = datetime.timedelta(seconds=max(1.0, config.deadline - time.monotonic()) + RANK_GRACE_S)
    store.set_timeout(timeout)  # the process group's rendezvous in the store, as its collectives
    dist.init_process_group(config.backend, store=store, rank=config.rank, world_size=config.world_size, timeout=timeout)
    _sweep(rank)
    rank.step("teardown")
    dist.barrier()
    dist.destroy_process_group()


def _meet(config: RankConfig, dist: Any, step_file: Path) -> Any:
    """Wait in the store until every rank has started; from then on the budget runs (config.deadline,
    the same moment on every rank: rank 0 tells the parent by the file `budget_from`). The store,
    for the process group."""
    with open(step_file, "a") as f:
        f.write(WAITING_FOR_RANKS + "\n")
    store = dist.FileStore(store_url(config.workdir).removeprefix("file://"), config.world_size)
    if config.start_by is None or config.budget_s is None:
        return store
    # Past the parent's start-up limit: the parent, not the store's timeout, decides who was slow.
    store.set_timeout(datetime.timedelta(seconds=max(1.0, config.start_by - time.monotonic()) + RANK_GRACE_S))
    if store.add("gpuvet/started", 1) == config.world_size:
        store.set("gpuvet/budget_from", repr(time.monotonic()))
    store.wait(["gpuvet/budget_from"])
    budget_from = float(store.get("gpuvet/budget_from"))
    config.deadline = budget_from + config.budget_s
    if config.rank == 0:
        path = Path(config.workdir) / "budget_from"
        path.with_suffix(".tmp").write_text(repr(budget_from))
        path.with_suffix(".tmp").replace(path)
    return store


def _sweep(rank: Rank) -> None:
    """Every size in turn, rank 0 rewriting its report after each (a kill at the deadline loses
    nothing measured); a size that cannot fit in the time left is skipped with the larger ones."""
    config = rank.config
    sizes = sweep_sizes(agreed_max_bytes(rank))
    report: dict[str, Any] = {"rows": rank.rows, "dtype": DTYPE, "sizes": sizes, "finished": False,
                              "skipped": [], "skip_reason": None,
                              "method": timing_method(config.backend, _host_ahead(rank) is not None)}
    for index, nbytes in enumerate(sizes):
        if rank.rows:
            reason = _agreed_skip(rank, nbytes)
            if reason is not None:
                report["skipped"], report["skip_reason"] = sizes[index:], reason
                break
        rank.step(f"all_reduce of {nbytes} bytes")
        if config.stall_after_sizes is not None and index >= config.stall_after_sizes:
            threading.Event().wait()  # tests: a fabric too slow to finish this size in time
        size_deadline = time.monotonic() + (config.deadline - TEARDOWN_S - time.monotonic()) / (len(sizes) - index)
        rank.rows.append(measure_size(rank, nbytes, size_deadline))
        _write_report(rank, report)
    report["finished"] = True
    _write_report(rank, report)


def _write_report(rank: Rank, report: dict[str, Any]) -> None:
    if rank.config.rank != 0:
        return
    path = Path(rank.config.workdir) / "result.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report))
    tmp.replace(path)  # the parent never reads half a report


def _agreed_skip(rank: Rank, nbytes: int) -> str | None:
    """Rank 0 decides whether `nbytes` still fits in the time left (every rank must run the same
    collectives) and tells the others; the reason is only known to rank 0, which reports it."""
    torch, config = rank.torch, rank.config
    last = rank.rows[-1]
    reason = None
    if config.rank == 0:
        left_s = config.deadline - TEARDOWN_S - time.monotonic()
        reason = size_skip_reason(last["bytes"], last["time_us"] / 1e6, nbytes, left_s)
    flag = torch.tensor([0 if reason is None else 1], dtype=torch.int64, device=rank.device)
    rank.dist.broadcast(flag, src=0)
    if int(flag.item()) == 0:
        return None
    return reason or "skipped by rank 0: not enough time left"


def agreed_max_bytes(rank: Rank) -> int:
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


def measure_size(rank: Rank, nbytes: int, size_deadline: float) -> dict[str, Any]:
    """One size: the sum check, then BATCHES timed batches; `iterations` is the all-reduces per batch."""
    torch, dist, n = rank.torch, rank.dist, rank.config.world_size
    buffer = torch.empty(nbytes // 4, dtype=torch.float32, device=rank.device)
    wrong = _check(rank, buffer)
    buffer.zero_()  # sums of zeros stay zero: no overflow however many iterations run
    for _ in range(WARMUP_ITERATIONS):
        dist.all_reduce(buffer)
    (one,) = _timed(rank, buffer, CALIBRATION_ITERATIONS, batches=1)
    iterations = _agreed_iterations(rank, size_deadline - time.monotonic(), one)
    times = _timed(rank, buffer, iterations, batches=BATCHES)
    median_s = statistics.median(times)
    algbw = algbw_gbps(nbytes, median_s)
    return {"bytes": nbytes, "iterations": iterations, "batches": len(times), "time_us": round(median_s * 1e6, 3),
            "algbw_gbps": algbw, "busbw_gbps": busbw_gbps(algbw, n), "wrong": wrong,
            "summary_us": summary([t * 1e6 for t in times])}


def _check(rank: Rank, buffer: Any) -> int:
    """Elements, over all ranks, that did not sum to n(n+1)/2 when each rank gave rank+1."""
    torch, dist, n = rank.torch, rank.dist, rank.config.world_size
    buffer.fill_(rank.config.rank + 1)
    dist.all_reduce(buffer)
    wrong = (buffer != n * (n + 1) // 2).sum().to(torch.int64).reshape(1)
    dist.all_reduce(wrong)
    return int(wrong.item())


def batch_iterations(seconds: float, one: float, batches: int = BATCHES) -> int:
    """All-reduces per timed batch so that `batches` batches fill `seconds`, within the bounds."""
    if one <= 0:
        return MIN_ITERATIONS
    return max(MIN_ITERATIONS, min(MAX_ITERATIONS, int(seconds / (one * batches))))


def _agreed_iterations(rank: Rank, seconds: float, one: float) -> int:
    """Rank 0 decides (all ranks must run the same number of collectives) and tells the others."""
    torch = rank.torch
    mine = batch_iterations(seconds, one)
    count = torch.tensor([mine], dtype=torch.int64, device=rank.device)
    rank.dist.broadcast(count, src=0)
    return int(count.item())


def _timed(rank: Rank, buffer: Any, iterations: int, batches: int = BATCHES) -> list[float]:
    """Seconds per all-reduce, one figure per batch: the batch's time divided by `iterations`,
    each batch the slowest rank's (the operation ends when all ranks have it).

    Timing each call alone would measure Python's launch cost (~10-30 us, as long as a 1 MiB
    all-reduce over NVSwitch), so a batch is timed as a whole, as nccl-tests does."""
    torch, dist = rank.torch, rank.dist
    nccl = rank.config.backend == "nccl"
    sleep = _host_ahead(rank)
    mine = []
    for _ in range(batches):
        _align(rank)  # all ranks start the batch together: no rank's time holds another's lateness
        if nccl:
            # all_reduce makes the current stream wait for NCCL's, so events on it bracket the batch
            stream = torch.cuda.current_stream(rank.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if sleep is not None:
                sleep(host_ahead_cycles(iterations))  # the GPU waits while the host enqueues the batch
            start.record(stream)
            for _ in range(iterations):
                dist.all_reduce(buffer)
            end.record(stream)
            end.synchronize()
            mine.append(start.elapsed_time(end) / 1000.0 / iterations)
        else:
            t0 = time.perf_counter()
            for _ in range(iterations):
                dist.all_reduce(buffer)
            mine.append((time.perf_counter() - t0) / iterations)
    slowest = torch.tensor(mine, dtype=torch.float64, device=rank.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist()


def _host_ahead(rank: Rank) -> Any:
    """torch.cuda._sleep on NCCL (a private PyTorch helper: None where it is missing), else None."""
    if rank.config.backend != "nccl":
        return None
    return getattr(rank.torch.cuda, "_sleep", None)


def _align(rank: Rank) -> None:
    """A barrier that works on NCCL and gloo alike and returns to the host only when all ranks
    have reached it."""
    flag = rank.torch.zeros(1, device=rank.device)
    rank.dist.all_reduce(flag)
    if rank.config.backend == "nccl":
        rank.torch.cuda.synchronize(rank.device)


def rank_dies_with_parent(parent_pid: int) -> None:
    """Ask Linux to kill this rank when the parent dies, and stop now if it already has."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(3)


def exit_after(deadline: float) -> None:
    """The last resort when the parent is gone and a collective never returns."""
    delay = max(0.0, deadline - time.monotonic())
    timer = threading.Timer(delay, os._exit, args=(4,))
    timer.daemon = True
    timer.start()


if __name__ == "__main__":
    rank_main(sys.argv[1])
