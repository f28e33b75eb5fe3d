"""One node's steps: join the store and beat, run the local vet and save its record, post the
record, say it is ready, and run the cross-node measurements when planned. flow.py strings them
together; rank 0 runs them too (coordinator.py)."""

from __future__ import annotations

import os
import socket
import time
from typing import Callable

from .. import runner
from ..record import FAIL, RunRecord, timestamp
from .cross import run_cross_node
from .launch import Launch
from .options import Options, Outputs, hold_until
from .plan import Plan
from .record import summarise_record
from .rendezvous import Heartbeat, Rendezvous
from .vet import VetOutcome, vet_with_deadline

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_LOST = 0, 1, 2, 3


class Node:
    """The flow on one node; rank 0 also runs the meeting and writes the report."""

    def __init__(self, launch: Launch, options: Options, say: Callable[[str], None], outputs: Outputs):
        self.launch, self.options, self.say, self.outputs = launch, options, say, outputs
        # Under Slurm, Slurm's name for the node: the node list names it so, whatever its hostname.
        self.name = options.node_name or launch.node_name or socket.gethostname()
        self.started, self.started_at = time.monotonic(), timestamp()
        self.rv: Rendezvous | None = None
        self.heartbeat: Heartbeat | None = None
        self.record: RunRecord | None = None
        self.saved_run: int | None = None

    @property
    def joined(self) -> Rendezvous:
        """The cluster's rendezvous: every step after join() talks through it."""
        if self.rv is None:
            raise RuntimeError(f"{self.name} has not joined the cluster")
        return self.rv

    # -- joining ---------------------------------------------------------------------------

    def join(self) -> None:
        o = self.options
        self.say(f"joining {self.launch.master_addr}:{self.launch.master_port} as rank {self.launch.rank} of "
                 f"{self.launch.world_size} ({self.launch.kind})")
        self.rv = Rendezvous(self.launch, o.join_timeout, op_timeout_s=max(60.0, o.dead_after))
        self.heartbeat = Heartbeat(self.rv, self.launch.rank, max(0.2, min(5.0, o.dead_after / 5))).start()
        self.rv.put(f"joined/{self.launch.rank}", {"name": self.name, "host": socket.gethostname(), "pid": os.getpid(),
                                                   "index": self.launch.node_index, "addresses": own_addresses()})
        self.rv.log("joined", self.launch.rank)

    def step(self, name: str) -> None:
        """What the node is doing, as rank 0 will name it if the node goes silent (posted with
        the next heartbeat)."""
        if self.heartbeat:
            self.heartbeat.step = name

    def phase(self, name: str) -> None:
        """A new phase, posted at once: a node killed right after must not be named by the last one."""
        self.step(name)
        self.joined.store.set(f"step/{self.launch.rank}", name)

    # -- the local vet ---------------------------------------------------------------------

    def vet(self) -> VetOutcome:
        if self.options.test_hold_until:
            hold_until(self.options.test_hold_until)
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
        return self.outputs.save_run(record, o.label or f"cluster {self.launch.cluster_id}: {self.name}")

    def post_vet(self, outcome: VetOutcome) -> None:
        rank = self.launch.rank
        if self.record is not None:
            self.joined.put_packed(f"record/{rank}", {"record": summarise_record(self.record.to_dict(), self.options.full_records),
                                                  "saved_run": self.saved_run})
            self.joined.log("record", rank)
        if outcome.error:
            self.joined.put(f"failed/{rank}", {"reason": outcome.error, "step": self.heartbeat.step if self.heartbeat else None})
            self.joined.log("failed", rank)

    def post_ready(self) -> None:
        torch = self.record.machine.stack.torch if self.record and self.record.machine.stack else None
        gpus = (torch.device_count or 0) if torch and torch.cuda_available else 0
        self.joined.put(f"ready/{self.launch.rank}", {"name": self.name, "gpus": gpus})
        self.joined.log("ready", self.launch.rank)
        self.phase("waiting for the others to finish their local vet")

    # -- the meeting -------------------------------------------------------------------------

    def meet(self, plan: Plan, should_abort: Callable[[], str | None]) -> None:
        member = plan.members.index(self.launch.rank)
        self.phase("cross-node measurements")
        self.say(f"cross-node: {len(plan.members)} nodes x {plan.ranks_per_node} ranks ({plan.backend})")
        result = run_cross_node(plan, member, self.joined, self.options, should_abort)
        self.joined.put(f"cross/{self.launch.rank}", result)
        self.joined.log("cross", self.launch.rank)
        self.phase("waiting for the cluster verdict")

    def local_exit_code(self) -> int:
        return EXIT_FAIL if self.record is None or self.record.verdict == FAIL else EXIT_OK


def own_addresses() -> list[str]:
    """This node's IP addresses (loopback aside): rank 0 matches them with --nodes given as IPs."""
    import psutil

    try:
        found = {a.address.split("%")[0] for addresses in psutil.net_if_addrs().values() for a in addresses
                 if a.family in (socket.AF_INET, socket.AF_INET6)}
    except OSError:
        return []
    return sorted(a for a in found if not a.startswith("127.") and a != "::1")[:16]


def verdict_words(node: Node) -> str:
    if node.record is None:
        return "gave no record"
    saved = f", saved as run {node.saved_run} (gpuvet show {node.saved_run})" if node.saved_run else ""
    return f"verdict {node.record.verdict.upper()}{saved}"
