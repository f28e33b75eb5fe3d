"""The run options every node gets, the default transfer sizes, and the pause (tests only) that
`Options.test_pause_at` asks for."""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

GPU_ALLREDUCE_MAX_MIB = 1024.0
CPU_ALLREDUCE_MAX_MIB = 64.0
GPU_RING_MIB = 256.0
CPU_RING_MIB = 16.0
RING_ROUNDS = 3


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
    expect_nodes: int | None = None  # how many nodes are expected (--expect-nodes; torchrun: its --nnodes max)
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
    cross_timeout: float = 300.0  # the cross-node measurements, from when every rank has started
    start_timeout: float = 180.0  # the cross-node ranks' start-up (Python, import torch): a loaded machine is slow there
    dead_after: float = 60.0
    port: int | None = None
    rank_processes: bool = False  # gloo ranks in processes of their own, as NCCL's (tests of that path)
    test_pause_at: str | None = None  # tests only: "vet", "meet", "cross" or "cross-start": this node stops there
    test_hold_until: str | None = None  # tests only: the node waits for this file before its local vet

    def vet_deadline_s(self) -> float:
        if self.vet_timeout:
            return self.vet_timeout
        if self.quick and not self.benchmarks:
            return 120.0
        return 1200.0 + 60.0 * (self.soak_minutes or 0.0)


def hold_until(path: str) -> None:
    """Tests only: wait for `path` to exist (a step the test must take while this node runs)."""
    while not os.path.exists(path):
        time.sleep(0.1)


def pause(where: str) -> None:
    """Tests only: stand still here, as a hung node would, until killed."""
    print(f"gpuvet cluster: paused at {where} (test)", file=sys.stderr, flush=True)
    threading.Event().wait()


@dataclass(frozen=True)
class Outputs:
    """What a node hands to the command that started it (cli/cluster.py): keeping its own run in the
    local history, and, on rank 0, keeping and printing the cluster record. The cluster package
    neither opens the store nor renders a report itself."""

    save_run: Callable[[Any, str], int | None]  # (run record, label) -> its id in the history, None if not kept
    show: Callable[[dict[str, Any]], None]  # the cluster record: written to --out, printed
