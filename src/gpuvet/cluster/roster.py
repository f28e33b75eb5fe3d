"""Rank 0: who is where. Every node's state, read from the store's logs and heartbeats on rank 0's
own clock."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..judge.cluster import FAILED, MISSING
from .options import Options
from .rendezvous import Rendezvous


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
        self.expected = list(expected)
        # A name per rank until the node says its own: --nodes in rank order is a guess (torchrun
        # hands out ranks in its own order), settled by settle_names() once the joined have spoken.
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

    def settle_names(self) -> list[str]:
        """Give the ranks that never joined the expected names no joined node took, in order, and
        return the expected names left over: nodes named in --nodes (or the Slurm node list) that
        the launcher started the job without (an elastic torchrun goes on with the nodes that came)."""
        joined = [n for n in self.nodes if n.joined_at is not None]
        unclaimed = [name for name in self.expected if not any(_same_host(name, n.name) or _same_host(name, n.host)
                                                               for n in joined)]
        for node in self.nodes:
            if node.joined_at is None and unclaimed:
                node.name = unclaimed.pop(0)
        return unclaimed

    def settled_for_plan(self) -> bool:
        return all(n.state in ("ready", FAILED, MISSING, "done") for n in self.nodes)

    def ready_nodes(self) -> dict[int, dict[str, Any]]:
        return {n.rank: {**(n.ready or {}), "name": n.name} for n in self.nodes if n.state == "ready"}


def _same_host(expected: str, actual: str | None) -> bool:
    """node01 is node01.cluster.local: Slurm lists short names, a hostname may be the full one."""
    if not actual:
        return False
    return expected == actual or expected.split(".")[0] == actual.split(".")[0]


def unique_names(nodes: list[NodeState]) -> None:
    """Two processes with one name (a node started twice, or no --node-name on one host) are told
    apart by their rank."""
    seen: dict[str, int] = {}
    for n in nodes:
        seen[n.name] = seen.get(n.name, 0) + 1
    for n in nodes:
        if seen[n.name] > 1:
            n.name = f"{n.name}#{n.rank}"
