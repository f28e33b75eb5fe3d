"""Rank 0: who is where. Every node's state, read from the store's logs and heartbeats on rank 0's
own clock."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..judge.cluster import FAILED, MISSING
from .options import Options
from .rendezvous import Rendezvous


@dataclass
class NodeState:
    rank: int
    name: str
    state: str = "waiting"  # waiting, joined, ready, done, failed, dead, missing
    host: str | None = None
    index: int | None = None  # its place in the launcher's node list (Slurm: SLURM_NODEID)
    addresses: list[str] = field(default_factory=list)  # its IP addresses, as it posted them
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


@dataclass
class Settled:
    """The expected nodes against the ranks, once the joined have said who they are."""

    absent: list[str] = field(default_factory=list)  # expected names no rank answered for
    unnamed: int = 0  # nodes expected but absent that cannot be named (some names matched no node)
    unmatched: list[str] = field(default_factory=list)  # expected names that matched no joined node


class Roster:
    """Rank 0's view of every node, from the store's logs and heartbeats, on rank 0's clock."""

    def __init__(self, rendezvous: Rendezvous, world_size: int, expected: list[str], options: Options, started: float,
                 by_rank: bool = False):
        self.rv, self.options = rendezvous, options
        self.join_deadline = started + options.join_timeout
        self.expected = list(expected)
        self.by_rank = by_rank  # expected[i] is the node of rank i (Slurm's node list), not only a name list
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
                node.index, node.addresses = info.get("index"), info.get("addresses") or []
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

    def settle_names(self, resolve: Callable[[str], set[str]] | None = None) -> Settled:
        """Match the expected names (--nodes, or the Slurm node list) with the ranks, and give the
        ranks that never joined the names nobody took.

        A joined node claims its expected name by its place in Slurm's list (SLURM_NODEID), by
        name or short hostname, by one of its IP addresses, or by an address the name resolves to.
        Names left over are nodes the launcher started the job without (an elastic torchrun goes
        on with the nodes that came) -- unless some joined node matched no name: then which names
        are absent is unknown, and only their count is reported, not invented names."""
        joined = [n for n in self.nodes if n.joined_at is not None]
        claimed: dict[int, NodeState] = {}
        by_name = _name_index(self.expected)
        for node in joined:
            index = self._place(node, claimed, by_name)
            if index is not None:
                claimed[index] = node
        taken = {n.rank for n in claimed.values()}
        strangers = [n for n in joined if n.rank not in taken]
        if strangers:
            self._claim_by_address(strangers, claimed, resolve or resolve_addresses)
        unclaimed = [i for i in range(len(self.expected)) if i not in claimed]
        waiting = [n for n in self.nodes if n.joined_at is None]
        if strangers:  # some joined node has a name not in the list: do not guess who is who
            for node in waiting:
                node.name = f"rank {node.rank}"
            return Settled([], max(0, len(self.expected) - len(self.nodes)), [self.expected[i] for i in unclaimed])
        for node in waiting:
            if self.by_rank and node.rank in unclaimed:
                index = node.rank
            elif not self.by_rank and unclaimed:
                index = unclaimed[0]
            else:
                node.name = f"rank {node.rank}"
                continue
            unclaimed.remove(index)
            node.name = self.expected[index]
        return Settled([self.expected[i] for i in unclaimed])

    def _place(self, node: NodeState, claimed: dict[int, NodeState], by_name: dict[str, list[int]]) -> int | None:
        """The index of the expected name this joined node is, by place or by name."""
        if self.by_rank:
            index = node.index if node.index is not None else node.rank
            if 0 <= index < len(self.expected) and index not in claimed:
                return index
        for key in (node.name, node.host, *node.addresses, _short(node.name), _short(node.host)):
            for i in by_name.get(key or "", ()):
                if i not in claimed:
                    return i
        return None

    def _claim_by_address(self, strangers: list[NodeState], claimed: dict[int, NodeState],
                          resolve: Callable[[str], set[str]]) -> None:
        """Expected names given as hostnames the joined nodes do not use: what they resolve to."""
        for i, name in enumerate(self.expected):
            if i in claimed or not strangers:
                continue
            addresses = resolve(name)
            match = next((n for n in strangers if addresses & set(n.addresses)), None) if addresses else None
            if match is not None:
                claimed[i] = match
                strangers.remove(match)

    def settled_for_plan(self) -> bool:
        return all(n.state in ("ready", FAILED, MISSING, "done") for n in self.nodes)

    def ready_nodes(self) -> dict[int, dict[str, Any]]:
        return {n.rank: {**(n.ready or {}), "name": n.name} for n in self.nodes if n.state == "ready"}


def resolve_addresses(name: str) -> set[str]:
    """The addresses a node name resolves to (empty when it does not)."""
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(name, None)}
    except (OSError, UnicodeError):
        return set()


def _short(name: str | None) -> str | None:
    """node01 is node01.cluster.local: Slurm lists short names, a hostname may be the full one (an
    IP address stays whole)."""
    if not name or name.replace(".", "").isdigit() or ":" in name:
        return name
    return name.split(".")[0]


def _name_index(expected: list[str]) -> dict[str, list[int]]:
    """Each expected name, and its short form, to its places in the list."""
    index: dict[str, list[int]] = {}
    for i, name in enumerate(expected):
        for key in dict.fromkeys((name, _short(name) or name)):
            index.setdefault(key, []).append(i)
    return index


def unique_names(nodes: list[NodeState]) -> None:
    """Two processes with one name (a node started twice, or no --node-name on one host) are told
    apart by their rank."""
    seen: dict[str, int] = {}
    for n in nodes:
        seen[n.name] = seen.get(n.name, 0) + 1
    for n in nodes:
        if seen[n.name] > 1:
            n.name = f"{n.name}#{n.rank}"
