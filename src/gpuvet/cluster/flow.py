"""One node, start to end: join (or, with rank 0 out of reach, vet alone), then rank 0 coordinates
and every other rank vets, meets when planned and waits for the cluster verdict."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import Any, Callable

from .coordinator import GATHER_GRACE_S, Coordinator
from .cross_rank import one_line
from .launch import Launch
from .node import EXIT_FAIL, EXIT_LOST, Node, verdict_words
from .options import Options, Outputs, pause
from .plan import Plan


class Stopped(Exception):
    """A signal asked this process to end (torchrun restarting its workers, scancel, kill)."""


def _stop_on_signal(number: int, frame: Any) -> None:
    signal.signal(number, signal.SIG_IGN)  # once is enough: the report is being written
    raise Stopped(f"{signal.Signals(number).name} received")


def run_node(launch: Launch, options: Options, say: Callable[[str], None], outputs: Outputs) -> int:
    node = Node(launch, options, say, outputs)
    try:
        node.join()
    except Exception as err:  # the master is unreachable: vet and keep the record here anyway
        print(f"gpuvet cluster: {node.name}: could not join {launch.master_addr}:{launch.master_port}: {one_line(str(err))}",
              file=sys.stderr)
        node.vet()
        print(f"gpuvet cluster: {node.name}: local vet {verdict_words(node)}; no cluster report", file=sys.stderr)
        return EXIT_LOST
    try:
        if launch.rank == 0:
            # torchrun sends SIGTERM, then SIGKILL 30 s later: rank 0 uses them to write what it has.
            previous = signal.signal(signal.SIGTERM, _stop_on_signal)
            try:
                return Coordinator(node).run()
            finally:
                signal.signal(signal.SIGTERM, previous)
        try:
            return _run_member(node)
        except (RuntimeError, OSError) as err:  # the store (rank 0) went away: torch's DistError is a RuntimeError
            return _lost(node, f"lost contact with rank 0 ({type(err).__name__}: {one_line(str(err))})")
    finally:
        if node.heartbeat:
            node.heartbeat.stop()


def _run_member(node: Node) -> int:
    """Every rank but 0: vet, post, meet when planned, wait for the verdict."""
    o = node.options
    outcome = node.vet()
    node.post_vet(outcome)
    if outcome.hung:  # the vet thread cannot be stopped: report and leave
        print(f"gpuvet cluster: {node.name}: {outcome.error}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            node.joined.log("bye", node.launch.rank)  # rank 0 need not wait for this node's goodbye
        os._exit(EXIT_FAIL)
    if outcome.error is None:
        node.post_ready()
        if o.test_pause_at == "meet":
            pause("meet")
        plan_wait = o.join_timeout + o.vet_deadline_s() + o.dead_after + 30
        posted = node.joined.wait_for("plan", plan_wait - (time.monotonic() - node.started))
        if posted is None:
            return _lost(node, "no plan from rank 0")
        plan = Plan(**posted["plan"]) if posted.get("plan") else None
        if plan and node.launch.rank in plan.members:
            node.meet(plan, lambda: (node.joined.get("abort") or {}).get("reason"))
    final = node.joined.wait_for("final", o.start_timeout + o.cross_timeout + o.dead_after + GATHER_GRACE_S + 60)
    if final is None:
        return _lost(node, "no cluster verdict from rank 0")
    with contextlib.suppress(Exception):
        node.joined.log("bye", node.launch.rank)
    if not o.quiet:
        print(f"gpuvet cluster: {node.name} (rank {node.launch.rank}): local {verdict_words(node)}; "
              f"cluster verdict {final['verdict'].upper()} (report on rank 0)")
    return node.local_exit_code()


def _lost(node: Node, why: str) -> int:
    print(f"gpuvet cluster: {node.name} (rank {node.launch.rank}): {why}; local {verdict_words(node)}", file=sys.stderr)
    return EXIT_LOST
