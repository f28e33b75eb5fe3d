"""The meeting on one node: start this node's cross-node ranks, watch them until they finish, the
deadline passes or rank 0 aborts, stop them, and combine what they measured into the node's result.

Why the cross-node ranks are child processes: a hung NCCL call cannot be interrupted from Python,
and the NCCL watchdog aborts the process it runs in; in a child, the node kills it at its deadline
and still reports what was measured."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from ..bench.leftovers import scratch_dir, signals_deferred
from .cross_rank import CHILD_GRACE_S, FINISHED, CrossRankConfig, run_rank, transfer_step
from .launch import Launch, interface_towards
from .options import Options
from .plan import Plan
from .rendezvous import POLL_S, Rendezvous

ABORT_CHECK_S = 1.0
TEST_PAUSES = {"cross": "device", "cross-start": "start-up"}  # --test-pause-at: where a rank stands still


def _package_root() -> str:
    """The folder gpuvet is imported from (src/, above gpuvet/cluster/)."""
    return str(Path(__file__).resolve().parents[2])


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
    """Start this node's ranks, wait for them (or the start-up limit, the deadline, an abort),
    and combine what they measured into this node's cross-node result."""
    start_by = time.monotonic() + plan.start_timeout_s
    env = _rank_env(rendezvous.launch, plan)
    in_processes = plan.backend == "nccl" or options.rank_processes
    with scratch_dir("gpuvet-cluster-") as workdir:
        configs = [CrossRankConfig(asdict(plan), member, local, rendezvous.launch.master_addr, rendezvous.launch.master_port,
                               rendezvous.prefix, workdir, os.getpid(), start_by, plan.timeout_s,
                               pause_at=TEST_PAUSES.get(options.test_pause_at or ""),
                               backend_env={} if in_processes else _gloo_env(env))
                   for local in range(plan.ranks_per_node)]
        ranks: list[Any] = []
        stopped: set[int] = set()
        try:
            with signals_deferred():  # a Ctrl-C inside a fork would leave a rank not in `ranks`
                ranks.extend(_start_rank_process(c, env) if in_processes else RankThread(c) for c in configs)
            aborted = _watch_ranks(ranks, Path(workdir), plan, start_by, should_abort)
        finally:  # also on Ctrl-C: no rank may outlive the node
            stopped = _stop_ranks(ranks)
        reports = [_with_exit(_read_rank_report(Path(workdir), local), rank.poll(), local in stopped)
                   for local, rank in enumerate(ranks)]
    return combine_rank_reports(plan, member, reports, aborted)


def _with_exit(report: dict[str, Any], code: int | None, stopped: bool) -> dict[str, Any]:
    """A rank that died by itself (the NCCL watchdog aborts the process, a driver fault kills it)
    failed at the step it was in; one this node stopped did not."""
    if stopped and report.get("no_report"):
        # Stopped at the deadline before it wrote a line: still starting Python or torch on a
        # busy machine. Slow, not broken: no error of its own (the node is never failed for it).
        return {key: value for key, value in report.items() if key != "error"}
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


def _watch_ranks(procs: list[Any], workdir: Path, plan: Plan, start_by: float,
                 should_abort: Callable[[], str | None]) -> str | None:
    """Until every child exits, the start-up limit or the deadline passes or rank 0 aborts (the
    reason). The deadline runs from when the ranks have all started (each rank says when). A
    child that reported everything and only hangs in teardown is not waited for."""
    finished_at: float | None = None
    next_abort_check = 0.0
    deadline: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if all(code is not None for code in codes):
            return None
        if any(code not in (None, 0) for code in codes):
            return None  # one rank failed: the others' collectives fail or time out; stop them now
        now = time.monotonic()
        reports = [_read_rank_report(workdir, i) for i in range(len(procs))]
        if deadline is None:
            started = [r["deadline"] for r in reports if r.get("deadline")]
            deadline = max(started) if started else None  # one has seen all start: the others have too
        if deadline is None and now >= start_by:
            return did_not_start(plan.start_timeout_s)
        if deadline is not None and now >= deadline:
            return "the cross-node measurements did not finish in time (deadline reached on this node)"
        if all(r.get("finished") for r in reports):
            finished_at = finished_at or now
            if now - finished_at > CHILD_GRACE_S:
                return None
        if now >= next_abort_check:  # once a second: at 1,000 nodes every check is a request to rank 0
            next_abort_check = now + ABORT_CHECK_S
            reason = should_abort()
            if reason:
                return reason
        time.sleep(POLL_S / 2)


def did_not_start(seconds: float) -> str:
    """Why this node stopped its ranks when some rank (here or on another node) had not started."""
    return f"the cross-node ranks did not all start within {seconds:.0f} s (start-up limit reached on this node)"


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
        return {"allreduce": None, "ring": [], "step": "starting Python", "finished": False, "no_report": True,
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
        found = [next((r for r in report.get("ring") or [] if r["round"] == index), None) for report in reports]
        parts = [p for p in found if p]
        if len(parts) == len(found):
            ring.append({"round": index, "src_member": src_member, "bytes": sum(p["bytes"] for p in parts),
                         "seconds": max(p["seconds"] for p in parts), "wrong": sum(p["wrong"] for p in parts)})
        else:  # a transfer that broke counts against its pair; one stopped by an abort or a kill is unknown
            failed = next((e for e in errors if e["step"] == transfer_step(index) and not e.get("stopped")), None)
            if failed:
                ring.append({"round": index, "src_member": src_member, "error": failed["error"]})
    rows = next((r["allreduce"]["rows"] for r in reports if r.get("allreduce")), None)
    # Every rank's last step: when the phase stops, rank 0 compares them to name the node behind.
    steps = [FINISHED if r.get("finished") else r.get("step") for r in reports]
    return {"allreduce": rows, "ring": ring, "errors": errors, "aborted": aborted, "steps": steps}
