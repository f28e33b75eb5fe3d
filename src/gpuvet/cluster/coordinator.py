"""Rank 0: waits until every node is ready, failed, silent or missing, posts the plan, aborts the
meeting when a member dies, gathers the cross-node results by a deadline, writes the cluster
record and prints the report."""

from __future__ import annotations

import random
import time
from dataclasses import asdict
from typing import Any

from ..judge.cluster import FAILED, MISSING
from ..record import FAIL
from .node import EXIT_FAIL, EXIT_OK, Node, verdict_words
from .plan import Plan, make_plan
from .record import cluster_record, cross_measurements, node_entries
from .rendezvous import POLL_S
from .roster import Roster, Settled, unique_names
from .torchrun import Agent, close_rendezvous, this_agent

BYE_WAIT_S = 10.0  # rank 0 keeps the store up this long for the others to read the verdict
GATHER_GRACE_S = 20.0  # after the cross-node deadline, for the nodes to post what they measured


class Coordinator:
    """Rank 0: a node like the others that also decides the plan, gathers and reports."""

    def __init__(self, node: Node, agent: Agent | None = None):
        self.node, self.options, self.rv = node, node.options, node.joined
        launch = node.launch
        expected = node.options.nodes or launch.expected_nodes
        self.list_source = "--nodes" if node.options.nodes else "the Slurm node list"
        # The join timeout runs from when the store is up: rank 0's own start-up is not the others' time.
        self.roster = Roster(self.rv, launch.world_size, expected, node.options, time.monotonic(),
                             by_rank=not node.options.nodes and bool(launch.expected_nodes))
        self.agent = agent if agent is not None or launch.kind != "torchrun" else this_agent()
        self.plan: Plan | None = None
        self.skipped: str | None = None
        self.stopped: str | None = None  # why the run was stopped before its end (a signal)
        self.phase = "starting"

    @property
    def expected_count(self) -> int:
        """How many nodes the user expects: --expect-nodes, else torchrun's --nnodes maximum."""
        return self.options.expect_nodes or (self.agent.max_nodes if self.agent else 0)

    def run(self) -> int:
        """The whole of rank 0's part; stopped by a signal (torchrun restarting its workers, scancel),
        it still writes the record and the report of what it has."""
        from .flow import Stopped

        try:
            return self._run()
        except Stopped as stop:
            self.stopped = f"{stop} during {self.phase}"
            self.node.say(f"stopped ({self.stopped}): writing what was gathered")
            return self._report(final=False)

    def _run(self) -> int:
        node = self.node
        self._close_the_rendezvous()
        self.phase = "the local vets"
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
            self.phase = "the cross-node measurements"
            node.meet(self.plan, self._abort_if_a_member_died)
        self.phase = "gathering the cross-node results"
        self._gather()
        self.phase = "writing the report"
        return self._report()

    def _close_the_rendezvous(self) -> None:
        """An elastic torchrun restarts every worker when a node joins late: close its rendezvous,
        so that a late node is refused and this run goes on (torchrun.py)."""
        agent, launch = self.agent, self.node.launch
        if agent is None or not agent.elastic:
            return
        problem = close_rendezvous(agent)
        count = f"{launch.world_size} of {agent.max_nodes} nodes"
        if problem:
            self.node.say(f"started with {count}; could not close torchrun's rendezvous ({problem}): a node that "
                          "joins now makes torchrun restart every node's gpuvet")
        else:
            self.node.say(f"started with {count}; torchrun's rendezvous is closed: a node started now is refused")

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
        if self.plan is None:  # polled only during the cross-node measurements, which have a plan
            return None
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
        deadline = time.monotonic() + self.plan.start_timeout_s + self.plan.timeout_s + GATHER_GRACE_S
        while time.monotonic() < deadline:
            self.roster.poll()
            members = [self.roster.nodes[r] for r in self.plan.members]
            if all(m.cross is not None or m.state in (FAILED, MISSING) for m in members):
                return
            time.sleep(POLL_S)

    def _report(self, final: bool = True) -> int:
        """Write the cluster record and print the report. Not `final`: the run was stopped, and
        the store may be gone; what cannot be read from it is left out, not waited for."""
        o, nodes = self.options, self.roster.nodes
        records: dict[int, Any] = {}
        saved: dict[int, Any] = {}
        try:
            self.roster.poll()
            with_records = [n.rank for n in nodes if n.has_record]
            shipped = dict(zip(with_records, self.rv.get_packed_many([f"record/{r}" for r in with_records])))
            records = {r: s["record"] for r, s in shipped.items()}
            saved = {r: s.get("saved_run") for r, s in shipped.items()}
            if not final:  # where the nodes still at work were when the run was stopped
                busy = [n for n in nodes if n.state == "joined"]
                for n, step in zip(busy, self.rv.store.multi_get([f"step/{n.rank}" for n in busy]) if busy else []):
                    n.step = step.decode()
        except Exception as err:  # the store went with the signal: report what rank 0 holds
            if final or self.stopped is None:  # not final: stopped, and why is said
                raise
            self.stopped += f"; the store could not be read ({type(err).__name__})"
        settled = self.roster.settle_names()
        unique_names(nodes)
        if self.plan:
            self.plan.names = [self.roster.nodes[r].name for r in self.plan.members]
        unnamed = max(settled.unnamed, self.expected_count - len(nodes) - len(settled.absent))
        entries = node_entries(nodes, records, saved, Settled(settled.absent, unnamed, settled.unmatched),
                               self.list_source, self.stopped, time.monotonic() - self.node.started)
        measurements = cross_measurements(self.plan, nodes, self.skipped if final else f"stopped: {self.stopped}")
        record = cluster_record(self.node.launch, o, self.node.started_at, time.monotonic() - self.node.started,
                                entries, self.plan, measurements, stopped=self.stopped)
        self.node.outputs.show(record)
        if final:
            self._say_goodbye(record)
        return EXIT_FAIL if record["verdict"] == FAIL else EXIT_OK

    def _say_goodbye(self, record: dict[str, Any]) -> None:
        """Post the verdict, then keep the store up until the others have read it."""
        self.rv.put("final", {"verdict": record["verdict"]})
        waiting = {n.rank for n in self.roster.nodes if n.joined_at is not None and not n.silent and n.rank != 0}
        deadline = time.monotonic() + BYE_WAIT_S
        while waiting - self.rv.logged("bye") and time.monotonic() < deadline:
            time.sleep(POLL_S / 2)
