"""A cross-node rank (a process of its own; a thread for gloo): joins the cross-node process group,
sweeps the all-reduce and runs the ring rounds, rewriting its report file after every step so that
a kill loses nothing done."""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..bench.allreduce import LATENCY_BYTES, sweep_sizes
from ..judge.cluster import IMPORTING_TORCH, WAITING_FOR_RANKS
from .options import pause
from .plan import Plan

CHILD_GRACE_S = 5.0  # a child that reported everything gets this long to tear down


@dataclass
class CrossRankConfig:
    plan: dict[str, Any]
    member: int  # this node's index in plan.members
    local_rank: int
    master_addr: str
    master_port: int
    prefix: str
    workdir: str
    parent_pid: int
    # time.monotonic(), shared with the parent (same machine): every rank of every node must have
    # started by start_by; the measurements then get timeout_s from when the rank saw all started.
    start_by: float
    timeout_s: float
    # tests only: where this rank stands still, as a stuck one would: "start-up" (importing torch,
    # a loaded machine) or "device" (opening its device, after every rank has started: a hang)
    pause_at: str | None = None
    backend_env: dict[str, str] = field(default_factory=dict)  # set before an in-process rank starts


class _RankReport:
    """What a rank measured so far, rewritten after every step so a kill loses nothing done."""

    def __init__(self, path: Path):
        self.path = path
        # "deadline": the rank's, once every rank has started (before: still starting up)
        self.data: dict[str, Any] = {"allreduce": None, "ring": [], "error": None, "step": "starting", "finished": False,
                                     "deadline": None}

    def step(self, name: str) -> None:
        self.data["step"] = name
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(self.data))
            tmp.replace(self.path)
        except OSError:  # an abandoned rank thread outliving its node's folder: nobody reads it any more
            pass


def run_rank(config: CrossRankConfig) -> int:
    """One cross-node rank, start to end; what it measured is in its report file either way."""
    report = _RankReport(Path(config.workdir) / f"local{config.local_rank}.json")
    try:
        report.step(IMPORTING_TORCH)
        if config.pause_at == "start-up":
            pause("cross-node start-up")
        _cross_node_rank(config, report)
        report.data["finished"] = True
        report.write()
        return 0
    except Exception as err:
        report.data["error"] = {"step": report.data["step"], "error": f"{type(err).__name__}: {one_line(str(err))}"}
        report.write()
        return 1


def child_main(config_path: str) -> None:
    """A rank in its own process (`python -m gpuvet.cluster --cross-node-rank CONFIG`)."""
    from ..bench.allreduce import rank_dies_with_parent, exit_after

    config = CrossRankConfig(**json.loads(Path(config_path).read_text()))
    rank_dies_with_parent(config.parent_pid)
    exit_after(config.start_by + config.timeout_s + CHILD_GRACE_S)  # the latest it can end
    code = run_rank(config)
    sys.stdout.flush()
    os._exit(code)  # after a failure the process group may be broken: never wait in its destructor


def one_line(text: str, limit: int = 300) -> str:
    first = next((line.strip() for line in text.splitlines() if line.strip()), text)
    return first[:limit]


def _cross_node_rank(config: CrossRankConfig, report: _RankReport) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed import PrefixStore, TCPStore

    plan = Plan(**config.plan)
    rank = config.member * plan.ranks_per_node + config.local_rank
    world_size = len(plan.members) * plan.ranks_per_node
    report.step(WAITING_FOR_RANKS)
    # Past the node's start-up limit: the node, not the store's timeout, decides who was slow.
    starting = timedelta(seconds=max(1.0, config.start_by - time.monotonic()) + CHILD_GRACE_S)
    base = TCPStore(config.master_addr, config.master_port, None, False, timeout=starting)
    deadline = _all_started(PrefixStore(config.prefix + "start/", base), world_size, starting) + config.timeout_s
    report.data["deadline"] = deadline
    report.step(OPENING_DEVICE)
    if config.pause_at == "device":
        pause("cross-node")
    device = torch.device(f"cuda:{config.local_rank}" if plan.device == "cuda" else "cpu")
    if plan.device == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    left = max(1.0, deadline - time.monotonic())
    report.step("init_process_group")
    base.set_timeout(timedelta(seconds=left))
    store = PrefixStore(config.prefix + "pg/", base)
    dist.init_process_group(plan.backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=left))
    allreduce_until = time.monotonic() + (deadline - time.monotonic()) * 0.5
    report.data["allreduce"] = _allreduce_sweep(plan, rank, world_size, device, report, allreduce_until)
    report.write()
    for index, ring in enumerate(plan.rounds):
        report.data["ring"].append(_ring_round(plan, config, index, ring, device, report))
        report.write()
    report.step("teardown")
    _barrier(dist, torch, device)
    dist.destroy_process_group()


def _all_started(store: Any, world_size: int, timeout: timedelta) -> float:
    """Wait until every rank of every node has started (imported torch, reached the store);
    when this rank saw it (time.monotonic()): its measurements' time runs from then."""
    if store.add("ranks", 1) >= world_size:
        store.set("all", "1")
    store.wait(["all"], timeout)
    return time.monotonic()


def _allreduce_sweep(plan: Plan, rank: int, world_size: int, device: Any, report: _RankReport,
                     until: float) -> dict[str, Any]:
    """bench.allreduce's own measurement (slowest rank's time, nccl-tests algbw/busbw, the
    n(n+1)/2 check) over the cross-node group: the same maths as inside one machine."""
    import torch
    import torch.distributed as dist

    from ..bench.allreduce import DTYPE, RankConfig, agreed_max_bytes, measure_size, Rank

    # On GPUs: no larger than 1/8 of the free memory of the fullest GPU, agreed by every rank.
    config = RankConfig(rank=rank, world_size=world_size, backend=plan.backend, device=str(device),
                        deadline=until, workdir=str(report.path.parent), parent_pid=os.getppid(),
                        max_bytes=None if plan.device == "cuda" else plan.allreduce_max_bytes)
    measuring = Rank(config, torch, dist, device, report.path.parent / f"{report.path.stem}.steps")
    largest = min(plan.allreduce_max_bytes, agreed_max_bytes(measuring))
    sizes = sweep_sizes(largest, start=min(LATENCY_BYTES, largest))
    rows = []
    for left, nbytes in zip(range(len(sizes), 0, -1), sizes):
        report.step(f"all-reduce of {nbytes} bytes")
        rows.append(measure_size(measuring, nbytes, time.monotonic() + (until - time.monotonic()) / left))
    return {"rows": rows, "dtype": DTYPE}


def _barrier(dist: Any, torch: Any, device: Any) -> None:
    """A barrier that works on NCCL and gloo alike."""
    dist.all_reduce(torch.zeros(1, device=device))


def _ring_round(plan: Plan, config: CrossRankConfig, index: int, ring: list[int], device: Any,
                report: _RankReport) -> dict[str, Any]:
    """Send to the next node in this round's ring while receiving from the previous one; each GPU
    talks to the same local rank on the other node (rail to rail). Seconds: median of repeats."""
    import torch
    import torch.distributed as dist

    position = ring.index(config.member)
    dst_member, src_member = ring[(position + 1) % len(ring)], ring[(position - 1) % len(ring)]
    dst = dst_member * plan.ranks_per_node + config.local_rank
    src = src_member * plan.ranks_per_node + config.local_rank
    elements = plan.ring_bytes // 4
    outgoing = torch.full((elements,), float(config.member + 1), dtype=torch.float32, device=device)
    incoming = torch.empty(elements, dtype=torch.float32, device=device)

    def exchange() -> float:
        started = time.perf_counter()
        requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, outgoing, dst), dist.P2POp(dist.irecv, incoming, src)])
        for request in requests:
            request.wait()
        if plan.device == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started

    report.step(f"ring round {index + 1}: barrier")
    _barrier(dist, torch, device)
    report.step(transfer_step(index))
    exchange()  # warm-up: NCCL opens the pair's connection on the first transfer
    seconds = statistics.median(exchange() for _ in range(plan.ring_repeats))
    wrong = int((incoming != float(src_member + 1)).sum().item())
    return {"round": index, "src_member": src_member, "bytes": plan.ring_bytes, "seconds": seconds, "wrong": wrong}


OPENING_DEVICE = "opening its device"


def transfer_step(index: int) -> str:
    return f"ring round {index + 1}: transfer"


FINISHED = "finished"
_RING_STEP = re.compile(r"ring round (\d+): (barrier|transfer)")


def step_progress(step: str | None) -> tuple[int, ...]:
    """How far a rank got, comparable across ranks: in a collective every rank waits for the last
    one, so the ranks furthest behind are those that held the others up."""
    if step == FINISHED:
        return (10,)
    if step == "teardown":
        return (9,)
    ring = _RING_STEP.fullmatch(step or "")
    if ring:
        return (8, int(ring.group(1)), ring.group(2) == "transfer")
    if (step or "").startswith("all-reduce of "):
        size = (step or "").split()[2]
        return (7, int(size) if size.isdigit() else 0)
    return (_EARLY_STEPS.get(step or "", 0),)


_EARLY_STEPS = {"starting Python": 1, "starting": 2, IMPORTING_TORCH: 3, WAITING_FOR_RANKS: 4, OPENING_DEVICE: 5,
                "init_process_group": 6}
