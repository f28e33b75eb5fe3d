"""Rank 0: waits until every node is ready, failed, silent or missing, posts the plan, aborts the
meeting when a member dies, gathers the cross-node results by a deadline, writes the cluster
record and prints the report."""

from __future__ import annotations

import random
import time
from dataclasses import asdict
from typing import Any

import click

from ..judge.cluster import FAILED, MISSING
from ..record import FAIL
from .node import EXIT_FAIL, EXIT_OK, Node, verdict_words
from .plan import Plan, make_plan
from .record import cluster_record, cross_measurements, node_entries, write_atomically
from .rendezvous import POLL_S
from .roster import Roster, unique_names

BYE_WAIT_S = 10.0  # rank 0 keeps the store up this long for the others to read the verdict
GATHER_GRACE_S = 20.0  # after the cross-node deadline, for the nodes to post what they measured


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
            node.say(f"local {verdict_words(node)}")
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

        from ..report import cluster_view

        o, nodes = self.options, self.roster.nodes
        self.roster.poll()
        absent = self.roster.settle_names()
        unique_names(nodes)
        if self.plan:
            self.plan.names = [self.roster.nodes[r].name for r in self.plan.members]
        with_records = [n.rank for n in nodes if n.has_record]
        shipped = dict(zip(with_records, self.rv.get_packed_many([f"record/{r}" for r in with_records])))
        records = {r: s["record"] for r, s in shipped.items()}
        saved = {r: s.get("saved_run") for r, s in shipped.items()}
        entries = node_entries(nodes, records, saved, absent)
        measurements = cross_measurements(self.plan, nodes, self.skipped)
        record = cluster_record(self.node.launch, o, self.node.started_at, time.monotonic() - self.node.started,
                                entries, self.plan, measurements)
        if o.out:
            write_atomically(o.out, cluster_view.to_json(record) + "\n")
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
