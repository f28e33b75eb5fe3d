"""Cluster mode (D4): every node of a multi-node job vetted at once, the network between the nodes
measured, the stragglers named.

Started by the launcher the user already has, one process per node:

    torchrun --nnodes N --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:PORT -m gpuvet.cluster [options]
    srun --ntasks-per-node=1 --kill-on-bad-exit=0 python -m gpuvet.cluster [options]

Rank, world size and the master address come from the environment either way (`Launch`).
Each node:
  1. joins: connects to the launcher's TCPStore (rank 0 hosts one under Slurm; torchrun's agent
     hosts it under torchrun), says who it is, and beats a heartbeat from a thread;
  2. runs the standard local vet (`runner.run_live`: facts, and benchmarks unless --quick) under a
     deadline, saves the record in its own store, and posts it, time series summarised;
  3. meets the others: rank 0 waits until every node is ready, failed, silent or missing, then
     posts a plan; the members start one process per GPU (NCCL; one process with gloo on nodes
     without GPU) that together sweep an all-reduce (nccl-tests bus bandwidth) and run a ring of
     node-to-node transfers, shuffled every round;
  4. rank 0 collects the cross-node results and the records by a deadline, judges the cluster
     (judge/cluster.py), writes the cluster record (gpuvet.cluster/1) and prints the report.

Why the store and not gather_object: a collective needs every rank and blocks on a dead one; with
keys in the store rank 0 takes whoever posted by the deadline and names the rest. Why the
cross-node ranks are child processes: a hung NCCL call cannot be interrupted from Python, and the
NCCL watchdog aborts the process it runs in; in a child, the node kills it at its deadline and
still reports what was measured.

Store keys (under gpuvet/cluster/<cluster id>/): joined/R, beat/R (a counter: rank 0 watches it
change on its own clock, so clocks need not agree), step/R, record/R (zlib JSON), ready/R,
failed/R, cross/R, plan, abort, final; the logs log/{joined,record,ready,failed,cross,bye} list
ranks, so rank 0 reads six keys per poll, not one per node.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

import click

from . import __version__, runner
from .bench.allreduce import LATENCY_BYTES, MiB, sweep_sizes
from .facts import from_dict
from .judge.cluster import ALLREDUCE_BUSBW, ALLREDUCE_LATENCY, FAILED, MISSING, NOTE, OK, RING, NodeEntry, judge_cluster
from .record import FAIL, Measurement, RunRecord, verdict_of

CLUSTER_SCHEMA = "gpuvet.cluster/1"
PREFIX = "gpuvet/cluster"
EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_LOST = 0, 1, 2, 3

POLL_S = 0.5
ABORT_CHECK_S = 1.0
BYE_WAIT_S = 10.0  # rank 0 keeps the store up this long for the others to read the verdict
CHILD_GRACE_S = 5.0  # a child that reported everything gets this long to tear down
GATHER_GRACE_S = 20.0  # after the cross-node deadline, for the nodes to post what they measured

GPU_ALLREDUCE_MAX_MIB = 1024.0
CPU_ALLREDUCE_MAX_MIB = 64.0
GPU_RING_MIB = 256.0
CPU_RING_MIB = 16.0
RING_ROUNDS = 3
RING_REPEATS = 5


class LaunchError(Exception):
    """Not started by a launcher gpuvet understands, or started wrongly; the message says how."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


# == where am I: the launcher's environment ==================================================

@dataclass
class Launch:
    kind: str  # "torchrun" or "slurm"
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    agent_store: bool = False  # torchrun's agent hosts the store: no rank starts one
    job_id: str | None = None
    expected_nodes: list[str] = field(default_factory=list)  # host per rank, where the launcher says

    @property
    def cluster_id(self) -> str:
        return self.job_id or f"{self.master_addr}-{self.master_port}"


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list: "node[01-04,07],gpu-a[1-2]-x" -> node01..node04, node07,
    gpu-a1-x, gpu-a2-x (zero padding kept; several bracket groups multiply)."""
    hosts: list[str] = []
    for item in _split_top_level(text.strip()):
        hosts += _expand_one(item)
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_one(item: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", item)
    if not match:
        return [item]
    head, tail = item[:match.start()], item[match.end():]
    return [head + value + rest for value in _range_values(match.group(1)) for rest in _expand_one(tail)]


def _range_values(spec: str) -> list[str]:
    values = []
    for part in spec.split(","):
        low, _, high = part.strip().partition("-")
        if not high:
            values.append(low)
            continue
        if not (low.isdigit() and high.isdigit()):
            raise LaunchError(f"cannot read the host range [{spec}]")
        width = len(low) if low.startswith("0") else 0
        values += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return values


def launch_from_env(env: dict[str, str] | os._Environ = os.environ, port: int | None = None) -> Launch:
    """The rank, world size and master from torchrun's or Slurm's variables."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return _torchrun_launch(env, port)
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return _slurm_launch(env, port)
    raise LaunchError("not started by torchrun or srun (no RANK/WORLD_SIZE or SLURM_PROCID/SLURM_NTASKS); "
                      f"start it on every node with:\n  {print_launch(env)}")


def _torchrun_launch(env: dict[str, str] | os._Environ, port: int | None) -> Launch:
    if int(env.get("LOCAL_WORLD_SIZE", "1")) > 1:
        raise LaunchError(f"one gpuvet process per node vets all its GPUs: use --nproc-per-node 1 "
                          f"(this node has {env['LOCAL_WORLD_SIZE']})")
    if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
        raise LaunchError("torchrun did not set MASTER_ADDR and MASTER_PORT")
    run_id = env.get("TORCHELASTIC_RUN_ID")
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return Launch("torchrun", int(env["RANK"]), int(env["WORLD_SIZE"]), env["MASTER_ADDR"], port or int(env["MASTER_PORT"]),
                  agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
                  job_id=f"{run_id}-{attempt}" if run_id else None)


def _slurm_launch(env: dict[str, str] | os._Environ, port: int | None) -> Launch:
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    hosts = expand_hostlist(nodelist) if nodelist else []
    world_size = int(env["SLURM_NTASKS"])
    if hosts and world_size > len(hosts):
        raise LaunchError(f"{world_size} tasks on {len(hosts)} nodes: one gpuvet process per node vets all its GPUs; "
                          "use srun --ntasks-per-node=1")
    master = env.get("MASTER_ADDR") or (hosts[0] if hosts else None)
    if not master:
        raise LaunchError("no SLURM_JOB_NODELIST and no MASTER_ADDR: cannot tell which node is rank 0")
    job = env.get("SLURM_JOB_ID")
    if port is None:
        port = int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else 20000 + (int(job) % 20000 if job and job.isdigit() else 0)
    step = env.get("SLURM_STEP_ID")
    return Launch("slurm", int(env["SLURM_PROCID"]), world_size, master, port,
                  job_id=f"slurm-{job}" + (f".{step}" if step else "") if job else None,
                  expected_nodes=hosts if len(hosts) == world_size else [])


def print_launch(env: dict[str, str] | os._Environ = os.environ, options: list[str] | None = None,
                 python: str | None = None) -> str:
    """The command line that starts gpuvet on every node from here: srun inside a Slurm
    allocation, else torchrun with placeholders to fill in."""
    extra = " ".join(options or [])
    job = env.get("SLURM_JOB_ID")
    if job:
        nodes = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
        if not nodes and env.get("SLURM_JOB_NODELIST"):
            nodes = str(len(expand_hostlist(env["SLURM_JOB_NODELIST"])))
        line = (f"srun --nodes={nodes or '<NODES>'} --ntasks-per-node=1 --kill-on-bad-exit=0 {python or sys.executable} "
                f"-m gpuvet.cluster --out gpuvet-cluster-{job}.json")
    else:
        line = ("torchrun --nnodes <NUMBER_OF_NODES> --nproc-per-node 1 --rdzv-backend c10d "
                f"--rdzv-endpoint <FIRST_NODE_HOST>:29400 --rdzv-id gpuvet-{random.randrange(16**6):06x} --max-restarts 0 "
                "-m gpuvet.cluster --out gpuvet-cluster.json")
    return f"{line} {extra}".strip()


def interface_towards(address: str) -> str | None:
    """The local network interface the kernel routes `address` through (gloo otherwise picks the
    interface of the hostname, which on multi-NIC nodes and in containers is often wrong)."""
    import psutil

    try:
        family, kind, proto, _, target = socket.getaddrinfo(address, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(target)  # UDP: no packet is sent, the kernel only picks the route
            local = probe.getsockname()[0]
    except OSError:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == local for a in addresses):
            return name
    return None


# == the run options every node gets =========================================================

@dataclass
class Options:
    quick: bool = False
    device: str = "cuda"
    benchmarks: list[str] | None = None
    soak_minutes: float | None = None
    force: bool = False
    preemptible: bool | None = None
    expect: str | None = None
    workdir: str | None = None
    node_name: str | None = None
    nodes: list[str] = field(default_factory=list)  # the node names expected (--nodes hostlist)
    out: str | None = None
    as_json: bool = False
    verbose: bool = False
    quiet: bool = False
    db: str | None = None
    no_save: bool = False
    label: str | None = None
    price: float | None = None
    full_records: bool = False
    cross: bool = True
    allreduce_max_mib: float | None = None
    ring_mib: float | None = None
    ring_rounds: int = RING_ROUNDS
    tolerance: float | None = None
    join_timeout: float = 300.0
    vet_timeout: float | None = None  # None: from the profile
    cross_timeout: float = 300.0
    dead_after: float = 60.0
    port: int | None = None
    rank_processes: bool = False  # gloo ranks in processes of their own, as NCCL's (tests of that path)
    test_pause_at: str | None = None  # tests only: "vet", "meet" or "cross": this node stops there

    def vet_deadline_s(self) -> float:
        if self.vet_timeout:
            return self.vet_timeout
        if self.quick and not self.benchmarks:
            return 120.0
        return 1200.0 + 60.0 * (self.soak_minutes or 0.0)


# == the store: keys every node reads and writes =============================================

class Rendezvous:
    """The launcher's TCPStore under gpuvet's prefix, with the few operations the flow needs."""

    def __init__(self, launch: Launch, connect_timeout_s: float, op_timeout_s: float = 60.0):
        from torch.distributed import TCPStore

        self.launch = launch
        self.prefix = f"{PREFIX}/{launch.cluster_id}/"
        host = launch.rank == 0 and not launch.agent_store
        self._base = TCPStore(launch.master_addr, launch.master_port, None, host,
                              timeout=timedelta(seconds=connect_timeout_s), wait_for_workers=False, multi_tenant=host)
        self._base.set_timeout(timedelta(seconds=op_timeout_s))
        self.op_timeout_s = op_timeout_s
        if not self._base.has_extended_api():
            raise LaunchError("this PyTorch's TCPStore lacks append/multi_get, which cluster mode needs; use a newer PyTorch")
        self.store = self._wrap(self._base)

    def _wrap(self, base: Any) -> Any:
        from torch.distributed import PrefixStore

        return PrefixStore(self.prefix, base)

    def another_connection(self) -> Rendezvous:
        """A second client for another thread (one client is not shared between threads)."""
        from torch.distributed import TCPStore

        other = object.__new__(Rendezvous)
        other.launch, other.prefix, other.op_timeout_s = self.launch, self.prefix, self.op_timeout_s
        other._base = TCPStore(self.launch.master_addr, self.launch.master_port, None, False,
                               timeout=timedelta(seconds=self.op_timeout_s))
        other.store = other._wrap(other._base)
        return other

    def log(self, name: str, rank: int) -> None:
        self.store.append(f"log/{name}", f"{rank},")

    def logged(self, name: str) -> set[int]:
        key = f"log/{name}"
        if not self.store.check([key]):
            return set()
        return {int(r) for r in self.store.get(key).decode().split(",") if r}

    def put(self, key: str, value: Any) -> None:
        self.store.set(key, json.dumps(value))

    def get(self, key: str) -> Any:
        """The JSON value of `key`, or None when nobody has posted it."""
        if not self.store.check([key]):
            return None
        return json.loads(self.store.get(key))

    def put_packed(self, key: str, value: Any) -> None:
        self.store.set(key, zlib.compress(json.dumps(value, separators=(",", ":")).encode(), 6))

    def get_packed_many(self, keys: list[str]) -> list[Any]:
        if not keys:
            return []
        return [json.loads(zlib.decompress(blob)) for blob in self.store.multi_get(keys)]

    def counters(self, keys: list[str]) -> list[int]:
        return [int(v) for v in self.store.multi_get(keys)] if keys else []

    def wait_for(self, key: str, seconds: float) -> Any:
        """The value of `key` once posted, or None after `seconds`. The store answers when the key
        appears, so a thousand waiting nodes do not poll it; if rank 0 dies the wait fails at once."""
        from torch.distributed import DistStoreError

        try:
            self.store.wait([key], timedelta(seconds=max(0.001, seconds)))
        except DistStoreError as err:
            if "timeout" not in str(err).lower():
                raise
            return None
        return self.get(key)


class Heartbeat:
    """A counter the node bumps from a thread, on its own connection, with the step it is in."""

    def __init__(self, rendezvous: Rendezvous, rank: int, interval_s: float):
        self.rank, self.interval_s = rank, interval_s
        self.step = "joining"
        self._store = rendezvous.another_connection()
        self._stop = threading.Event()
        self._posted_step: str | None = None
        self._thread = threading.Thread(target=self._run, name="gpuvet-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self.beat()  # the first beat exists before the node says it joined: rank 0 can read it at once
        self._thread.start()
        return self

    def beat(self) -> None:
        self._store.store.add(f"beat/{self.rank}", 1)
        if self.step != self._posted_step:
            self._posted_step = self.step
            self._store.store.set(f"step/{self.rank}", self.step)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except Exception:  # rank 0 (the store) went away: the main flow finds out by itself
                return

    def stop(self) -> None:
        self._stop.set()


# == what a node ships: its record, time series summarised ===================================

def summarise_series(series: dict[str, Any]) -> dict[str, Any]:
    """A time series as min/median/max/first/last per column instead of every row."""
    columns, rows = series.get("columns") or [], series.get("rows") or []
    stats = {}
    for i, column in enumerate(columns):
        values = [row[i] for row in rows if i < len(row) and isinstance(row[i], (int, float))]
        if column != "t" and values:
            stats[column] = {"min": min(values), "median": statistics.median(values), "max": max(values),
                             "first": values[0], "last": values[-1]}
    return {"name": series.get("name"), "subject": series.get("subject"), "interval_s": series.get("interval_s"),
            "rows": len(rows), "stats": stats}


def summarise_record(record: dict[str, Any], keep_series: bool = False) -> dict[str, Any]:
    """The run record a node ships to rank 0: whole, except its time series (summarised unless
    asked), which are most of its size and live on in the node's own store."""
    if keep_series or not record.get("series"):
        return record
    shipped = dict(record)
    shipped["series_summary"] = [summarise_series(s) for s in record["series"]]
    shipped["series"] = []
    return shipped


# == the local vet, under a deadline =========================================================

@dataclass
class VetOutcome:
    record: RunRecord | None = None
    error: str | None = None
    hung: bool = False  # the vet thread is still running: the process must not wait for it


def vet_with_deadline(options: Options, timeout_s: float, on_step: Callable[[str], None]) -> VetOutcome:
    """runner.run_live in a thread; a vet that outlives `timeout_s` is reported, not waited for."""
    outcome = VetOutcome()
    last_step = ["starting"]

    def progress(message: str) -> None:
        last_step[0] = message
        on_step(f"local vet: {message}")

    def work() -> None:
        try:
            if options.test_pause_at == "vet":
                _pause("vet")
            outcome.record = runner.run_live(
                quick=options.quick, expect=options.expect, workdir=options.workdir, benchmarks=options.benchmarks,
                device=options.device, soak_minutes=options.soak_minutes, force=options.force,
                **({"preemptible": options.preemptible} if options.preemptible is not None else {}), progress=progress)
        except Exception as err:  # reported to rank 0 by name, with the others' results
            outcome.error = f"the local vet crashed: {type(err).__name__}: {err}"

    thread = threading.Thread(target=work, name="gpuvet-vet", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        outcome.hung = True
        outcome.error = f"the local vet did not finish in {timeout_s:.0f} s (last step: {last_step[0]})"
    return outcome


def _pause(where: str) -> None:
    """Tests only: stand still here, as a hung node would, until killed."""
    print(f"gpuvet cluster: paused at {where} (test)", file=sys.stderr, flush=True)
    threading.Event().wait()


# == the meeting: what rank 0 decides ========================================================

@dataclass
class Plan:
    members: list[int]  # ranks taking part, in member order
    names: list[str]  # their node names
    ranks_per_node: int
    backend: str  # nccl / gloo
    device: str  # cuda / cpu
    allreduce_max_bytes: int
    ring_bytes: int
    ring_repeats: int
    rounds: list[list[int]]  # per round: member indices in ring order (each sends to the next)
    timeout_s: float
    notes: list[str] = field(default_factory=list)


def shuffled_rings(members: int, rounds: int, rng: random.Random) -> list[list[int]]:
    """`rounds` rings over the members, each a fresh shuffle, so that a node has different
    partners every round: a bad node is slow with all of them, a bad link with one."""
    if members < 2:
        return []
    rings = []
    for _ in range(rounds):
        order = list(range(members))
        rng.shuffle(order)
        rings.append(order)
    return rings


def make_plan(ready: dict[int, dict[str, Any]], options: Options, rng: random.Random) -> Plan:
    """NCCL with one rank per GPU when every member has GPUs and --device cuda; else gloo, one
    rank per node on the CPU."""
    members = sorted(ready)
    names = [ready[r]["name"] for r in members]
    without_gpu = [ready[r]["name"] for r in members if not ready[r].get("gpus")]
    notes = []
    if options.device == "cuda" and not without_gpu:
        backend, device, ranks_per_node = "nccl", "cuda", min(int(ready[r]["gpus"]) for r in members)
        max_mib, ring_mib = options.allreduce_max_mib or GPU_ALLREDUCE_MAX_MIB, options.ring_mib or GPU_RING_MIB
    else:
        backend, device, ranks_per_node = "gloo", "cpu", 1
        max_mib, ring_mib = options.allreduce_max_mib or CPU_ALLREDUCE_MAX_MIB, options.ring_mib or CPU_RING_MIB
        if options.device == "cuda":
            notes.append(f"gloo on the CPUs: no usable GPU on {', '.join(without_gpu[:8])}")
    return Plan(members, names, ranks_per_node, backend, device, _whole_floats(max_mib), _whole_floats(ring_mib),
                RING_REPEATS, shuffled_rings(len(members), options.ring_rounds, rng), options.cross_timeout, notes)


def _whole_floats(mib: float) -> int:
    nbytes = int(mib * MiB)
    return max(4096, nbytes - nbytes % 4)


# == a cross-node rank (a process of its own; a thread for gloo) =============================

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
    deadline: float  # time.monotonic(), shared with the parent (same machine)
    pause: bool = False  # tests only
    backend_env: dict[str, str] = field(default_factory=dict)  # set before an in-process rank starts


class _RankReport:
    """What a rank measured so far, rewritten after every step so a kill loses nothing done."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, Any] = {"allreduce": None, "ring": [], "error": None, "step": "starting", "finished": False}

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
        report.step("importing torch")
        if config.pause:
            _pause("cross-node")
        _cross_node_rank(config, report)
        report.data["finished"] = True
        report.write()
        return 0
    except Exception as err:
        report.data["error"] = {"step": report.data["step"], "error": f"{type(err).__name__}: {_one_line(str(err))}"}
        report.write()
        return 1


def child_main(config_path: str) -> None:
    """A rank in its own process (`python -m gpuvet.cluster --cross-node-rank CONFIG`)."""
    from .bench.allreduce import _die_with_parent, _exit_after

    config = CrossRankConfig(**json.loads(Path(config_path).read_text()))
    _die_with_parent(config.parent_pid)
    _exit_after(config.deadline + CHILD_GRACE_S)
    code = run_rank(config)
    sys.stdout.flush()
    os._exit(code)  # after a failure the process group may be broken: never wait in its destructor


def _one_line(text: str, limit: int = 300) -> str:
    first = next((line.strip() for line in text.splitlines() if line.strip()), text)
    return first[:limit]


def _cross_node_rank(config: CrossRankConfig, report: _RankReport) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed import PrefixStore, TCPStore

    plan = Plan(**config.plan)
    rank = config.member * plan.ranks_per_node + config.local_rank
    world_size = len(plan.members) * plan.ranks_per_node
    device = torch.device(f"cuda:{config.local_rank}" if plan.device == "cuda" else "cpu")
    if plan.device == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    left = max(1.0, config.deadline - time.monotonic())
    report.step("init_process_group")
    base = TCPStore(config.master_addr, config.master_port, None, False, timeout=timedelta(seconds=left))
    store = PrefixStore(config.prefix + "pg/", base)
    dist.init_process_group(plan.backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=left))
    allreduce_until = time.monotonic() + (config.deadline - time.monotonic()) * 0.5
    report.data["allreduce"] = _allreduce_sweep(plan, rank, world_size, device, report, allreduce_until)
    report.write()
    for index, ring in enumerate(plan.rounds):
        report.data["ring"].append(_ring_round(plan, config, index, ring, device, report))
        report.write()
    report.step("teardown")
    _barrier(dist, torch, device)
    dist.destroy_process_group()


def _allreduce_sweep(plan: Plan, rank: int, world_size: int, device: Any, report: _RankReport,
                     until: float) -> dict[str, Any]:
    """bench.allreduce's own measurement (slowest rank's time, nccl-tests algbw/busbw, the
    n(n+1)/2 check) over the cross-node group: the same maths as inside one machine."""
    import torch
    import torch.distributed as dist

    from .bench.allreduce import DTYPE, RankConfig, _agreed_max_bytes, _measure_size, _Rank

    # On GPUs: no larger than 1/8 of the free memory of the fullest GPU, agreed by every rank.
    config = RankConfig(rank=rank, world_size=world_size, backend=plan.backend, device=str(device), port=0,
                        deadline=until, workdir=str(report.path.parent), parent_pid=os.getppid(),
                        max_bytes=None if plan.device == "cuda" else plan.allreduce_max_bytes)
    measuring = _Rank(config, torch, dist, device, report.path.parent / f"{report.path.stem}.steps")
    largest = min(plan.allreduce_max_bytes, _agreed_max_bytes(measuring))
    sizes = sweep_sizes(largest, start=min(LATENCY_BYTES, largest))
    rows = []
    for left, nbytes in zip(range(len(sizes), 0, -1), sizes):
        report.step(f"all-reduce of {nbytes} bytes")
        rows.append(_measure_size(measuring, nbytes, time.monotonic() + (until - time.monotonic()) / left))
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
    report.step(_transfer_step(index))
    exchange()  # warm-up: NCCL opens the pair's connection on the first transfer
    seconds = statistics.median(exchange() for _ in range(plan.ring_repeats))
    wrong = int((incoming != float(src_member + 1)).sum().item())
    return {"round": index, "src_member": src_member, "bytes": plan.ring_bytes, "seconds": seconds, "wrong": wrong}


# == the meeting on one node: start the ranks, watch them, report ============================

def _transfer_step(index: int) -> str:
    return f"ring round {index + 1}: transfer"


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[1])


class RankThread:
    """A gloo rank inside the node process: no second PyTorch import (seconds per node), and safe
    because gloo honours its timeouts. NCCL ranks always get a process of their own."""

    abandoned: list[threading.Thread] = []  # still running when their node finished

    def __init__(self, config: CrossRankConfig):
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, args=(config,), name="gpuvet-rank", daemon=True)
        self.thread.start()

    def _run(self, config: CrossRankConfig) -> None:
        if config.backend_env:
            os.environ.update(config.backend_env)
        self.code = run_rank(config)

    def poll(self) -> int | None:
        return self.code

    def stop(self) -> None:
        if self.thread.is_alive():  # cannot be killed: it ends at gloo's timeout; the node does not wait
            RankThread.abandoned.append(self.thread)


def run_cross_node(plan: Plan, member: int, rendezvous: Rendezvous, options: Options,
                   should_abort: Callable[[], str | None]) -> dict[str, Any]:
    """Start this node's ranks, wait for them (or the deadline, or an abort), and combine what
    they measured into this node's cross-node result."""
    deadline = time.monotonic() + plan.timeout_s
    env = _rank_env(rendezvous.launch, plan)
    in_processes = plan.backend == "nccl" or options.rank_processes
    with tempfile.TemporaryDirectory(prefix="gpuvet-cluster-") as workdir:
        configs = [CrossRankConfig(asdict(plan), member, local, rendezvous.launch.master_addr, rendezvous.launch.master_port,
                               rendezvous.prefix, workdir, os.getpid(), deadline, pause=options.test_pause_at == "cross",
                               backend_env={} if in_processes else _gloo_env(env))
                   for local in range(plan.ranks_per_node)]
        ranks = [_start_rank_process(c, env) if in_processes else RankThread(c) for c in configs]
        stopped: set[int] = set()
        try:
            aborted = _watch_ranks(ranks, Path(workdir), deadline, should_abort)
        finally:  # also on Ctrl-C: no rank may outlive the node
            stopped = _stop_ranks(ranks)
        reports = [_with_exit(_read_rank_report(Path(workdir), local), rank.poll(), local in stopped)
                   for local, rank in enumerate(ranks)]
    return combine_rank_reports(plan, member, reports, aborted)


def _with_exit(report: dict[str, Any], code: int | None, stopped: bool) -> dict[str, Any]:
    """A rank that died by itself (the NCCL watchdog aborts the process, a driver fault kills it)
    failed at the step it was in; one this node stopped did not."""
    if stopped or code in (None, 0) or report.get("error") or report.get("finished"):
        return report
    how = f"signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else f"exit code {code}"
    return {**report, "error": {"step": report.get("step"), "error": f"the rank process died ({how})"}}


def _gloo_env(env: dict[str, str]) -> dict[str, str]:
    return {"GLOO_SOCKET_IFNAME": env["GLOO_SOCKET_IFNAME"]} if "GLOO_SOCKET_IFNAME" in env else {}


def _rank_env(launch: Launch, plan: Plan) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # cuda:N is nvidia-smi's GPU N
    if plan.backend == "gloo" and "GLOO_SOCKET_IFNAME" not in env:
        interface = interface_towards(launch.master_addr)
        if interface:
            env["GLOO_SOCKET_IFNAME"] = interface
    return env


def _start_rank_process(config: CrossRankConfig, env: dict[str, str]) -> subprocess.Popen:
    workdir = Path(config.workdir)
    path = workdir / f"local{config.local_rank}.config.json"
    path.write_text(json.dumps(asdict(config)))
    with open(workdir / f"local{config.local_rank}.log", "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "gpuvet.cluster", "--cross-node-rank", str(path)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def _watch_ranks(procs: list[Any], workdir: Path, deadline: float,
                    should_abort: Callable[[], str | None]) -> str | None:
    """Until every child exits, the deadline passes or rank 0 aborts (the reason). A child that
    reported everything and only hangs in teardown is not waited for."""
    finished_at: float | None = None
    next_abort_check = 0.0
    while True:
        codes = [p.poll() for p in procs]
        if all(code is not None for code in codes):
            return None
        if any(code not in (None, 0) for code in codes):
            return None  # one rank failed: the others' collectives fail or time out; stop them now
        now = time.monotonic()
        if now >= deadline:
            return "the cross-node measurements did not finish in time (deadline reached on this node)"
        if all(_read_rank_report(workdir, i).get("finished") for i in range(len(procs))):
            finished_at = finished_at or now
            if now - finished_at > CHILD_GRACE_S:
                return None
        if now >= next_abort_check:  # once a second: at 1,000 nodes every check is a request to rank 0
            next_abort_check = now + ABORT_CHECK_S
            reason = should_abort()
            if reason:
                return reason
        time.sleep(POLL_S / 2)


def _stop_ranks(ranks: list[Any]) -> set[int]:
    """Stop every rank still running; the local ranks stopped."""
    stopped = set()
    for local, rank in enumerate(ranks):
        if rank.poll() is not None:
            continue
        stopped.add(local)
        if isinstance(rank, RankThread):
            rank.stop()
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rank.pid, signal.SIGKILL)  # the rank leads its own group: helpers go too
    for rank in ranks:
        if not isinstance(rank, RankThread):
            with contextlib.suppress(subprocess.TimeoutExpired):
                rank.wait(timeout=10)
    return stopped


def _read_rank_report(workdir: Path, local: int) -> dict[str, Any]:
    try:
        return json.loads((workdir / f"local{local}.json").read_text())
    except (OSError, json.JSONDecodeError):
        log = (workdir / f"local{local}.log")
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
        return {"allreduce": None, "ring": [], "step": "starting Python", "finished": False,
                "error": {"step": "starting Python", "error": tail[0][:300] if tail else "no output"}}


def combine_rank_reports(plan: Plan, member: int, reports: list[dict[str, Any]], aborted: str | None) -> dict[str, Any]:
    """One node's cross-node result from its ranks: the all-reduce rows (the same on every rank:
    each time is the slowest rank's), and per ring round the bytes all local ranks received from
    the previous node together, over the slowest rank's time."""
    errors = []
    for local, report in enumerate(reports):
        if report.get("error"):
            errors.append({"local_rank": local, **report["error"]})
        elif not report.get("finished"):
            errors.append({"local_rank": local, "step": report.get("step"), "error": aborted or "stopped before it finished",
                           "stopped": True})
    ring = []
    for index, order in enumerate(plan.rounds):
        src_member = order[(order.index(member) - 1) % len(order)]
        parts = [next((r for r in report.get("ring") or [] if r["round"] == index), None) for report in reports]
        if all(parts):
            ring.append({"round": index, "src_member": src_member, "bytes": sum(p["bytes"] for p in parts),
                         "seconds": max(p["seconds"] for p in parts), "wrong": sum(p["wrong"] for p in parts)})
        else:  # a transfer that broke counts against its pair; one stopped by an abort or a kill is unknown
            failed = next((e for e in errors if e["step"] == _transfer_step(index) and not e.get("stopped")), None)
            if failed:
                ring.append({"round": index, "src_member": src_member, "error": failed["error"]})
    rows = next((r["allreduce"]["rows"] for r in reports if r.get("allreduce")), None)
    return {"allreduce": rows, "ring": ring, "errors": errors, "aborted": aborted}


# == rank 0: who is where ====================================================================

@dataclass
class NodeState:
    rank: int
    name: str
    state: str = "waiting"  # waiting, joined, ready, done, failed, dead, missing
    host: str | None = None
    joined_at: float | None = None  # rank 0's monotonic clock
    beats: int = -1
    beat_changed_at: float = 0.0
    step: str | None = None
    reason: str | None = None
    has_record: bool = False
    silent: bool = False  # its heartbeat stopped
    ready: dict[str, Any] | None = None
    cross: dict[str, Any] | None = None

    @property
    def alive(self) -> bool:
        return self.state in ("joined", "ready", "done")


class Roster:
    """Rank 0's view of every node, from the store's logs and heartbeats, on rank 0's clock."""

    def __init__(self, rendezvous: Rendezvous, world_size: int, expected: list[str], options: Options, started: float):
        self.rv, self.options = rendezvous, options
        self.join_deadline = started + options.join_timeout
        self.nodes = [NodeState(r, expected[r] if r < len(expected) else f"rank {r}") for r in range(world_size)]

    def poll(self) -> None:
        now = time.monotonic()
        self._read_joined(now)
        self._read_logs()
        self._read_beats(now)
        for node in self.nodes:
            if node.state == "waiting" and now >= self.join_deadline:
                node.state = MISSING
                node.reason = f"it never joined (waited {self.options.join_timeout:.0f} s)"

    def _read_joined(self, now: float) -> None:
        for rank in sorted(self.rv.logged("joined")):
            node = self.nodes[rank]
            if node.joined_at is None:
                info = self.rv.get(f"joined/{rank}") or {}
                node.name, node.host = info.get("name") or node.name, info.get("host")
                node.joined_at = node.beat_changed_at = now
                if node.state in ("waiting", MISSING):
                    node.state, node.reason = "joined", None

    def _read_logs(self) -> None:
        for rank in self.rv.logged("record"):
            self.nodes[rank].has_record = True
        for rank in self.rv.logged("failed") - {n.rank for n in self.nodes if n.state == FAILED}:
            info = self.rv.get(f"failed/{rank}") or {}
            node = self.nodes[rank]
            node.state, node.reason, node.step = FAILED, info.get("reason"), info.get("step")
        for rank in self.rv.logged("ready"):
            node = self.nodes[rank]
            if node.state == "joined":
                node.state, node.ready = "ready", self.rv.get(f"ready/{rank}")
        for rank in self.rv.logged("cross"):
            node = self.nodes[rank]
            if node.cross is None:
                node.cross = self.rv.get(f"cross/{rank}")
                if node.state in ("ready", "joined"):
                    node.state = "done"

    def _read_beats(self, now: float) -> None:
        live = [n for n in self.nodes if n.alive]
        for node, beats in zip(live, self.rv.counters([f"beat/{n.rank}" for n in live])):
            if beats != node.beats:
                node.beats, node.beat_changed_at = beats, now
            elif now - node.beat_changed_at >= self.options.dead_after:
                step = self.rv.store.get(f"step/{node.rank}").decode() if self.rv.store.check([f"step/{node.rank}"]) else None
                node.state, node.step, node.silent = FAILED, step, True
                node.reason = f"it stopped answering (no heartbeat for {now - node.beat_changed_at:.0f} s)"

    def overdue_vets(self, now: float) -> None:
        """Nodes alive but still not ready long after their own vet deadline: call them failed."""
        limit = self.options.vet_deadline_s() + self.options.dead_after
        for node in self.nodes:
            if node.state == "joined" and node.joined_at is not None and now - node.joined_at > limit + 10:
                node.state, node.reason = FAILED, f"not ready {limit + 10:.0f} s after it joined (local vet overdue)"

    def settled_for_plan(self) -> bool:
        return all(n.state in ("ready", FAILED, MISSING, "done") for n in self.nodes)

    def ready_nodes(self) -> dict[int, dict[str, Any]]:
        return {n.rank: {**(n.ready or {}), "name": n.name} for n in self.nodes if n.state == "ready"}


def unique_names(nodes: list[NodeState]) -> None:
    """Two processes with one name (a node started twice, or no --node-name on one host) are told
    apart by their rank."""
    seen: dict[str, int] = {}
    for n in nodes:
        seen[n.name] = seen.get(n.name, 0) + 1
    for n in nodes:
        if seen[n.name] > 1:
            n.name = f"{n.name}#{n.rank}"


# == rank 0: the cluster record ==============================================================

def cross_measurements(plan: Plan | None, nodes: list[NodeState], skipped: str | None = None) -> list[Measurement]:
    """The cross-node results of every member as measurements: the all-reduce sweep (from the
    first member that has it) and one transfer per ring pair; a `bench.cluster` note for what
    could not be measured, naming the nodes that stopped it."""
    if plan is None:
        return [_note("skipped", skipped or "not measured")]
    by_rank = {n.rank: n for n in nodes}
    members = [by_rank[r] for r in plan.members]
    measurements: list[Measurement] = []
    rows = next((m.cross["allreduce"] for m in members if m.cross and m.cross.get("allreduce")), None)
    if rows:
        measurements += _allreduce_measurements(plan, rows)
    for member in members:
        for entry in (member.cross or {}).get("ring") or []:
            measurements.append(_ring_measurement(plan, member.name, entry))
    problem = _cross_problem(plan, members)
    if problem:
        measurements.append(_note(*problem))
    return measurements


def _allreduce_measurements(plan: Plan, rows: list[dict[str, Any]]) -> list[Measurement]:
    largest = rows[-1]
    world_size = len(plan.members) * plan.ranks_per_node
    common = {"members": plan.names, "ranks_per_node": plan.ranks_per_node, "world_size": world_size,
              "backend": plan.backend, "device": plan.device}
    latency_row = next((r for r in rows if r["bytes"] == LATENCY_BYTES), rows[0])
    return [
        Measurement(ALLREDUCE_LATENCY, latency_row["time_us"], "us", "cluster",
                    {"bytes": latency_row["bytes"], "iterations": latency_row["iterations"], **common}),
        Measurement(ALLREDUCE_BUSBW, largest["busbw_gbps"], "GB/s", "cluster",
                    {"largest_bytes": largest["bytes"], "algbw_gbps": largest["algbw_gbps"], "time_us": largest["time_us"],
                     "sizes": rows, "check_ok": all(r["wrong"] == 0 for r in rows), **common,
                     "formula": "algbw = bytes / time / 1e9; busbw = algbw * 2(n-1)/n (nccl-tests)"}),
    ]


def _ring_measurement(plan: Plan, receiver: str, entry: dict[str, Any]) -> Measurement:
    src = plan.names[entry["src_member"]]
    details = {"src": src, "dst": receiver, "round": entry["round"], "backend": plan.backend,
               "ranks_per_node": plan.ranks_per_node}
    if entry.get("error") or not entry.get("seconds"):
        return Measurement(RING, None, "GB/s", f"{src}->{receiver}", {**details, "error": entry.get("error", "no time")})
    gbps = entry["bytes"] / entry["seconds"] / 1e9
    return Measurement(RING, gbps, "GB/s", f"{src}->{receiver}",
                       {**details, "bytes": entry["bytes"], "seconds": entry["seconds"], "wrong": entry["wrong"]})


def _cross_problem(plan: Plan, members: list[NodeState]) -> tuple[str, str, list[str]] | None:
    silent = [m.name for m in members if m.cross is None]
    aborted = next((m.cross["aborted"] for m in members if m.cross and m.cross.get("aborted")), None)
    errors = [(m.name, e) for m in members if m.cross for e in m.cross.get("errors") or []]
    if not (silent or aborted or errors):
        return None
    if aborted:  # rank 0 stopped everyone because these members went silent: that says it all
        return "aborted", f"aborted: {aborted}", silent
    parts = []
    if silent:
        why = "; ".join(f"{m.name}: {m.reason}" for m in members if m.cross is None and m.reason)
        parts.append(f"no result from {', '.join(silent[:8])}" + (f" ({why})" if why else ""))
    if errors:
        name, error = errors[0]
        parts.append(f"on {name} during {error.get('step')}: {error.get('error')}"
                     + (f" (and {len(errors) - 1} more rank errors)" if len(errors) > 1 else ""))
    return "failed", "; ".join(parts), silent


def _note(outcome: str, reason: str, nodes: list[str] | None = None) -> Measurement:
    return Measurement(NOTE, None, "", "cluster", {"outcome": outcome, "reason": reason, "nodes": nodes or []})


def node_entries(nodes: list[NodeState], records: dict[int, dict[str, Any]], saved: dict[int, int | None]) -> list[NodeEntry]:
    entries = []
    for n in nodes:
        status = OK if n.state in ("ready", "done") else MISSING if n.state == MISSING else FAILED
        if n.state == "joined":  # alive but never ready: the plan went on without it
            status, n.reason = FAILED, n.reason or "not ready when the others met"
        entries.append(NodeEntry(n.name, n.rank, status, n.reason, n.step, n.host, records.get(n.rank), saved.get(n.rank)))
    return entries


def cluster_record(launch: Launch, options: Options, started_at: str, duration_s: float, entries: list[NodeEntry],
                   plan: Plan | None, measurements: list[Measurement]) -> dict[str, Any]:
    judgement = judge_cluster(entries, measurements, {"tolerance": options.tolerance})
    return {
        "schema": CLUSTER_SCHEMA,
        "tool": {"name": "gpuvet", "version": __version__},
        "cluster_id": launch.cluster_id,
        "started_at": started_at,
        "duration_s": round(duration_s, 3),
        "launcher": {"kind": launch.kind, "world_size": launch.world_size,
                     "master": f"{launch.master_addr}:{launch.master_port}"},
        "options": _recorded_options(options),
        "nodes": [_entry_dict(e) for e in sorted(entries, key=lambda e: (e.rank is None, e.rank or 0))],
        "cross_node": {"plan": asdict(plan) if plan else None, "measurements": [asdict(m) for m in measurements]},
        "summary": {"rows": [asdict(r) for r in judgement.rows], "baselines": [asdict(b) for b in judgement.baselines],
                    "stragglers": [asdict(s) for s in judgement.stragglers],
                    "uniformity": [asdict(u) for u in judgement.uniformity]},
        "findings": [asdict(f) for f in judgement.findings],
        "verdict": verdict_of(judgement.findings),
    }


def _entry_dict(entry: NodeEntry) -> dict[str, Any]:
    """asdict() without its deep copy of the node's record (seconds at 1,000 nodes)."""
    return {f: getattr(entry, f) for f in NodeEntry.__dataclass_fields__}


def _recorded_options(options: Options) -> dict[str, Any]:
    keep = ("quick", "device", "benchmarks", "soak_minutes", "preemptible", "expect", "tolerance", "join_timeout", "vet_timeout",
            "cross_timeout", "dead_after", "allreduce_max_mib", "ring_mib", "ring_rounds", "cross", "full_records")
    return {k: getattr(options, k) for k in keep if getattr(options, k) not in (None, [], False)}


def rejudge_cluster(record: dict[str, Any], tolerance: float | None = None) -> dict[str, Any]:
    """A saved cluster record judged again by this version's rules."""
    entries = [from_dict(NodeEntry, n) for n in record.get("nodes") or []]
    cross = record.get("cross_node") or {}
    measurements = [from_dict(Measurement, m) for m in cross.get("measurements") or []]
    judgement = judge_cluster(entries, measurements, {"tolerance": tolerance})
    again = dict(record)
    again["summary"] = {"rows": [asdict(r) for r in judgement.rows], "baselines": [asdict(b) for b in judgement.baselines],
                        "stragglers": [asdict(s) for s in judgement.stragglers],
                        "uniformity": [asdict(u) for u in judgement.uniformity]}
    again["findings"] = [asdict(f) for f in judgement.findings]
    again["verdict"] = verdict_of(judgement.findings)
    return again


# == one node, start to end ==================================================================

class Node:
    """The flow on one node; rank 0 also runs the meeting and writes the report."""

    def __init__(self, launch: Launch, options: Options, say: Callable[[str], None]):
        self.launch, self.options, self.say = launch, options, say
        self.name = options.node_name or socket.gethostname()
        self.started, self.started_at = time.monotonic(), _now()
        self.rv: Rendezvous | None = None
        self.heartbeat: Heartbeat | None = None
        self.record: RunRecord | None = None
        self.saved_run: int | None = None

    # -- joining ---------------------------------------------------------------------------

    def join(self) -> None:
        o = self.options
        self.say(f"joining {self.launch.master_addr}:{self.launch.master_port} as rank {self.launch.rank} of "
                 f"{self.launch.world_size} ({self.launch.kind})")
        self.rv = Rendezvous(self.launch, o.join_timeout, op_timeout_s=max(60.0, o.dead_after))
        self.heartbeat = Heartbeat(self.rv, self.launch.rank, max(0.2, min(5.0, o.dead_after / 5))).start()
        self.rv.put(f"joined/{self.launch.rank}", {"name": self.name, "host": socket.gethostname(), "pid": os.getpid()})
        self.rv.log("joined", self.launch.rank)

    def step(self, name: str) -> None:
        """What the node is doing, as rank 0 will name it if the node goes silent (posted with
        the next heartbeat)."""
        if self.heartbeat:
            self.heartbeat.step = name

    def phase(self, name: str) -> None:
        """A new phase, posted at once: a node killed right after must not be named by the last one."""
        self.step(name)
        self.rv.store.set(f"step/{self.launch.rank}", name)

    # -- the local vet ---------------------------------------------------------------------

    def vet(self) -> VetOutcome:
        if self.rv:
            self.phase("local vet")
        facts_only = self.options.quick and not self.options.benchmarks
        self.say("local vet: " + ("facts only (--quick)" if facts_only else "facts and benchmarks"))
        outcome = vet_with_deadline(self.options, self.options.vet_deadline_s(), self.step)
        if outcome.record is not None:
            self.record = self._mark(outcome.record)
            self.saved_run = self._save(self.record)
        return outcome

    def _mark(self, record: RunRecord) -> RunRecord:
        """The node's place in the cluster, and multi-node judging of its network facts."""
        record.options["cluster"] = {"id": self.launch.cluster_id, "node": self.name, "rank": self.launch.rank,
                                     "world_size": self.launch.world_size, "launcher": self.launch.kind}
        record.options["multi_node"] = True
        return runner.rejudge(record)

    def _save(self, record: RunRecord) -> int | None:
        o = self.options
        if o.label:
            record.options["label"] = o.label
        if o.price is not None:
            record.options["price"] = o.price
        if o.no_save:
            return None
        from .store import Store, StoreError

        label = o.label or f"cluster {self.launch.cluster_id}: {self.name}"
        try:
            with Store(o.db) as store:
                return store.save(record, label=label, price_per_hour=o.price)
        except StoreError as err:
            print(f"gpuvet cluster: {self.name}: warning: run not saved: {err}", file=sys.stderr)
            return None

    def post_vet(self, outcome: VetOutcome) -> None:
        rank = self.launch.rank
        if self.record is not None:
            self.rv.put_packed(f"record/{rank}", {"record": summarise_record(self.record.to_dict(), self.options.full_records),
                                                  "saved_run": self.saved_run})
            self.rv.log("record", rank)
        if outcome.error:
            self.rv.put(f"failed/{rank}", {"reason": outcome.error, "step": self.heartbeat.step if self.heartbeat else None})
            self.rv.log("failed", rank)

    def post_ready(self) -> None:
        torch = self.record.machine.stack.torch if self.record and self.record.machine.stack else None
        gpus = (torch.device_count or 0) if torch and torch.cuda_available else 0
        self.rv.put(f"ready/{self.launch.rank}", {"name": self.name, "gpus": gpus})
        self.rv.log("ready", self.launch.rank)
        self.phase("waiting for the others to finish their local vet")

    # -- the meeting -------------------------------------------------------------------------

    def meet(self, plan: Plan, should_abort: Callable[[], str | None]) -> None:
        member = plan.members.index(self.launch.rank)
        self.phase("cross-node measurements")
        self.say(f"cross-node: {len(plan.members)} nodes x {plan.ranks_per_node} ranks ({plan.backend})")
        result = run_cross_node(plan, member, self.rv, self.options, should_abort)
        self.rv.put(f"cross/{self.launch.rank}", result)
        self.rv.log("cross", self.launch.rank)
        self.phase("waiting for the cluster verdict")

    def local_exit_code(self) -> int:
        return EXIT_FAIL if self.record is None or self.record.verdict == FAIL else EXIT_OK


def run_node(launch: Launch, options: Options, say: Callable[[str], None]) -> int:
    node = Node(launch, options, say)
    try:
        node.join()
    except Exception as err:  # the master is unreachable: vet and keep the record here anyway
        print(f"gpuvet cluster: {node.name}: could not join {launch.master_addr}:{launch.master_port}: {_one_line(str(err))}",
              file=sys.stderr)
        node.vet()
        print(f"gpuvet cluster: {node.name}: local vet {_verdict_words(node)}; no cluster report", file=sys.stderr)
        return EXIT_LOST
    try:
        if launch.rank == 0:
            return Coordinator(node).run()
        try:
            return _run_member(node)
        except (RuntimeError, OSError) as err:  # the store (rank 0) went away: torch's DistError is a RuntimeError
            return _lost(node, f"lost contact with rank 0 ({type(err).__name__}: {_one_line(str(err))})")
    finally:
        if node.heartbeat:
            node.heartbeat.stop()


def _verdict_words(node: Node) -> str:
    if node.record is None:
        return "gave no record"
    saved = f", saved as run {node.saved_run} (gpuvet show {node.saved_run})" if node.saved_run else ""
    return f"verdict {node.record.verdict.upper()}{saved}"


def _run_member(node: Node) -> int:
    """Every rank but 0: vet, post, meet when planned, wait for the verdict."""
    o = node.options
    outcome = node.vet()
    node.post_vet(outcome)
    if outcome.hung:  # the vet thread cannot be stopped: report and leave
        print(f"gpuvet cluster: {node.name}: {outcome.error}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            node.rv.log("bye", node.launch.rank)  # rank 0 need not wait for this node's goodbye
        os._exit(EXIT_FAIL)
    if outcome.error is None:
        node.post_ready()
        if o.test_pause_at == "meet":
            _pause("meet")
        plan_wait = o.join_timeout + o.vet_deadline_s() + o.dead_after + 30
        posted = node.rv.wait_for("plan", plan_wait - (time.monotonic() - node.started))
        if posted is None:
            return _lost(node, "no plan from rank 0")
        plan = Plan(**posted["plan"]) if posted.get("plan") else None
        if plan and node.launch.rank in plan.members:
            node.meet(plan, lambda: (node.rv.get("abort") or {}).get("reason"))
    final = node.rv.wait_for("final", o.cross_timeout + o.dead_after + GATHER_GRACE_S + 60)
    if final is None:
        return _lost(node, "no cluster verdict from rank 0")
    with contextlib.suppress(Exception):
        node.rv.log("bye", node.launch.rank)
    if not o.quiet:
        print(f"gpuvet cluster: {node.name} (rank {node.launch.rank}): local {_verdict_words(node)}; "
              f"cluster verdict {final['verdict'].upper()} (report on rank 0)")
    return node.local_exit_code()


def _lost(node: Node, why: str) -> int:
    print(f"gpuvet cluster: {node.name} (rank {node.launch.rank}): {why}; local {_verdict_words(node)}", file=sys.stderr)
    return EXIT_LOST


class Coordinator:
    """Rank 0: a node like the others that also decides the plan, gathers and reports."""

    def __init__(self, node: Node):
        self.node, self.options, self.rv = node, node.options, node.rv
        expected = node.options.nodes or node.launch.expected_nodes
        # The join timeout runs from when the store is up: rank 0's own start-up is not the others' time.
        self.roster = Roster(self.rv, node.launch.world_size, expected, node.options, time.monotonic())
        self.plan: Plan | None = None
        self.skipped: str | None = None

    def run(self) -> int:
        node = self.node
        outcome = node.vet()
        node.post_vet(outcome)
        if outcome.error is None:
            node.post_ready()
        else:
            node.say(outcome.error)
        self._wait_for_ready()
        self._decide_plan()
        if self.plan and node.launch.rank in self.plan.members:
            node.meet(self.plan, self._abort_if_a_member_died)
        self._gather()
        return self._report()

    def _wait_for_ready(self) -> None:
        self.node.say("waiting for every node to finish its local vet")
        while True:
            self.roster.poll()
            self.roster.overdue_vets(time.monotonic())
            if self.roster.settled_for_plan():
                return
            time.sleep(POLL_S)

    def _decide_plan(self) -> None:
        ready = self.roster.ready_nodes()
        if not self.options.cross:
            self.skipped = "not asked (--no-cross)"
        elif len(ready) < 2:
            self.skipped = f"needs at least 2 nodes ready; {len(ready)} {'was' if len(ready) == 1 else 'were'}"
        else:
            self.plan = make_plan(ready, self.options, random.Random())
        # Posted even without a plan: the others wait for this key before they go on.
        self.rv.put("plan", {"plan": asdict(self.plan) if self.plan else None, "skipped": self.skipped})

    def _abort_if_a_member_died(self) -> str | None:
        """Polled while this node's ranks run: a member gone silent will never answer the
        collectives, so every node is told to stop rather than wait for its deadline."""
        self.roster.poll()
        dead = [self.roster.nodes[r] for r in self.plan.members if self.roster.nodes[r].silent]
        if not dead:
            return None
        reason = "; ".join(f"{n.name}: {n.reason}" + (f" during {n.step}" if n.step else "") for n in dead)
        self.rv.put("abort", {"reason": reason})
        return reason

    def _gather(self) -> None:
        if self.plan is None:
            return
        self.node.say("gathering the cross-node results")
        deadline = time.monotonic() + self.plan.timeout_s + GATHER_GRACE_S
        while time.monotonic() < deadline:
            self.roster.poll()
            members = [self.roster.nodes[r] for r in self.plan.members]
            if all(m.cross is not None or m.state in (FAILED, MISSING) for m in members):
                return
            time.sleep(POLL_S)

    def _report(self) -> int:
        from rich.console import Console

        from .report import cluster_view

        o, nodes = self.options, self.roster.nodes
        self.roster.poll()
        unique_names(nodes)
        if self.plan:
            self.plan.names = [self.roster.nodes[r].name for r in self.plan.members]
        with_records = [n.rank for n in nodes if n.has_record]
        shipped = dict(zip(with_records, self.rv.get_packed_many([f"record/{r}" for r in with_records])))
        records = {r: s["record"] for r, s in shipped.items()}
        saved = {r: s.get("saved_run") for r, s in shipped.items()}
        entries = node_entries(nodes, records, saved)
        measurements = cross_measurements(self.plan, nodes, self.skipped)
        record = cluster_record(self.node.launch, o, self.node.started_at, time.monotonic() - self.node.started,
                                entries, self.plan, measurements)
        if o.out:
            _write_atomically(o.out, cluster_view.to_json(record) + "\n")
            record["out"] = o.out
        else:
            self.node.say("the cluster record was not kept: give --out FILE (to every node: torchrun picks rank 0)")
        if o.as_json:
            click.echo(cluster_view.to_json(record))
        else:
            cluster_view.render(record, Console(highlight=False, soft_wrap=True), verbose=o.verbose)
        self._say_goodbye(record)
        return EXIT_FAIL if record["verdict"] == FAIL else EXIT_OK

    def _say_goodbye(self, record: dict[str, Any]) -> None:
        """Post the verdict, then keep the store up until the others have read it."""
        self.rv.put("final", {"verdict": record["verdict"]})
        waiting = {n.rank for n in self.roster.nodes if n.joined_at is not None and not n.silent and n.rank != 0}
        deadline = time.monotonic() + BYE_WAIT_S
        while waiting - self.rv.logged("bye") and time.monotonic() < deadline:
            time.sleep(POLL_S / 2)


def _write_atomically(path: str, text: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".gpuvet-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def check_out_path(out: str | None) -> str | None:
    """Why --out cannot be written (None: it can): a missing folder, or a file that is not a
    gpuvet cluster record (a typo must not eat the user's files)."""
    if not out:
        return None
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        return f"--out {out}: the folder {folder} does not exist"
    if os.path.isdir(out):
        return f"--out {out}: is a folder; give a file name"
    if os.path.exists(out):
        with open(out, "rb") as f:
            head = f.read(512)
        if head.strip() and CLUSTER_SCHEMA.encode() not in head:
            return f"--out {out}: the file exists and is not a gpuvet cluster record; choose another name"
    return None


# == command line ============================================================================

def _benchmark_names() -> tuple[str, ...]:
    from .runner import ALL_BENCHMARKS

    return ALL_BENCHMARKS


@click.command(name="cluster", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--print-launch", "show_launch", is_flag=True, help="Print the command that starts gpuvet on every node, and exit.")
@click.option("--quick", is_flag=True, help="Facts only on each node, no local benchmarks (the cross-node tests still run).")
@click.option("--bench", "benchmarks", multiple=True, type=click.Choice(_benchmark_names()), metavar="NAME",
              help="Run only these local benchmarks (repeatable).")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="cpu: benchmark the CPUs and meet over gloo (tests, machines without GPU).")
@click.option("--soak", "soak_minutes", type=click.FloatRange(min=0.1), metavar="MINUTES",
              help="Hold the sustained load this long.")
@click.option("--force", is_flag=True, help="Benchmark GPUs even when other processes use them.")
@click.option("--preemptible/--on-demand", default=None, help="Say whether the nodes can be reclaimed (spot/preemptible).")
@click.option("--expect", metavar="MODEL", help='The GPU model you paid for, e.g. "H100 80GB".')
@click.option("--workdir", metavar="PATH", help="Where the work lives on each node (storage facts).")
@click.option("--node-name", metavar="NAME", help="This node's name in the report (default: its hostname).")
@click.option("--nodes", "nodes", metavar="HOSTLIST", help='The nodes expected, in rank order ("node[01-04]"); '
              "names the ones that never join (Slurm: from SLURM_JOB_NODELIST).")
@click.option("--out", metavar="FILE", help="Rank 0 writes the cluster record (JSON) to FILE.")
@click.option("--json", "as_json", is_flag=True, help="Rank 0 prints the cluster record as JSON instead of the report.")
@click.option("-v", "--verbose", is_flag=True, help="List every node and straggler.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
@click.option("--db", metavar="PATH", help="Each node's history database (default: $GPUVET_DB or ~/.local/share/gpuvet).")
@click.option("--no-save", is_flag=True, help="Do not keep the node records in the local history.")
@click.option("--label", metavar="TEXT", help="Label of every node's stored run.")
@click.option("--price", type=click.FloatRange(min=0), metavar="USD_PER_HOUR", help="What one node costs per hour.")
@click.option("--full-records", is_flag=True, help="Ship every node's time series whole to rank 0 (default: summarised).")
@click.option("--no-cross", is_flag=True, help="Skip the cross-node all-reduce and ring.")
@click.option("--allreduce-max-mib", type=click.FloatRange(min=0.004), metavar="MIB",
              help=f"Largest cross-node all-reduce (default {GPU_ALLREDUCE_MAX_MIB:g} on GPUs, "
                   f"{CPU_ALLREDUCE_MAX_MIB:g} on CPUs).")
@click.option("--ring-mib", type=click.FloatRange(min=0.004), metavar="MIB",
              help=f"Bytes per node-to-node transfer (default {GPU_RING_MIB:g} on GPUs, {CPU_RING_MIB:g} on CPUs).")
@click.option("--ring-rounds", type=click.IntRange(min=1), default=RING_ROUNDS, show_default=True, help="Shuffled ring rounds.")
@click.option("--tolerance", type=click.FloatRange(min=0.01, max=0.9), metavar="FRACTION",
              help="Straggler tolerance for every figure (default: per figure, 10% for GEMM).")
@click.option("--join-timeout", type=click.FloatRange(min=1), default=300.0, show_default=True, metavar="S",
              help="How long nodes may take to join.")
@click.option("--vet-timeout", type=click.FloatRange(min=1), metavar="S",
              help="Longest local vet (default 120 s with --quick, else 1200 s + soak).")
@click.option("--cross-timeout", type=click.FloatRange(min=1), default=300.0, show_default=True, metavar="S",
              help="Longest cross-node phase.")
@click.option("--dead-after", type=click.FloatRange(min=0.5), default=60.0, show_default=True, metavar="S",
              help="A node silent this long (no heartbeat) has failed.")
@click.option("--port", type=click.IntRange(1, 65535),
              help="The rendezvous port (default: MASTER_PORT, or one from the Slurm job id).")
@click.option("--test-pause-at", type=click.Choice(["vet", "meet", "cross"]), hidden=True)
@click.option("--rank-processes", is_flag=True, hidden=True)
def command(show_launch: bool, nodes: str | None, benchmarks: tuple[str, ...], no_cross: bool, **values: Any) -> None:
    """Vet every node of a multi-node job at once (one process per node, from torchrun or srun),
    measure the network between the nodes, and name the stragglers."""
    if show_launch:
        click.echo(print_launch())
        return
    options = Options(benchmarks=list(benchmarks) or None, cross=not no_cross,
                      nodes=expand_hostlist(nodes) if nodes else [], **values)
    finish(main(options))


def finish(code: int) -> None:
    """Exit; without waiting for a rank thread stuck in gloo until its timeout, nor for process
    group destructors at interpreter exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    if any(t.is_alive() for t in RankThread.abandoned):
        os._exit(code)
    sys.exit(code)


def main(options: Options, env: dict[str, str] | os._Environ = os.environ) -> int:
    try:
        launch = launch_from_env(env, options.port)
    except LaunchError as err:
        click.echo(f"gpuvet cluster: {err}", err=True)
        return EXIT_USAGE
    problem = check_out_path(options.out) if launch.rank == 0 else None
    if problem:
        click.echo(f"gpuvet cluster: {problem}", err=True)
        return EXIT_USAGE
    name = options.node_name or socket.gethostname()
    talk = launch.rank == 0 and not options.quiet

    def say(message: str) -> None:
        if talk:
            click.echo(f"gpuvet cluster [{name}]: {message}", err=True)

    return run_node(launch, options, say)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--cross-node-rank":
        child_main(sys.argv[2])
    else:
        command()
