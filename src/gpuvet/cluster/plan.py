"""The meeting: what rank 0 decides (the members, NCCL or gloo, the transfer sizes and the
shuffled ring rounds)."""

from __future__ import annotations

import random
from typing import Any

from ..bench.allreduce import MiB
from ..record.cluster import ClusterPlan
from .options import CPU_ALLREDUCE_MAX_MIB, CPU_RING_MIB, GPU_ALLREDUCE_MAX_MIB, GPU_RING_MIB, Options

RING_REPEATS = 5


Plan = ClusterPlan  # the record's type: what is decided is what is recorded


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
    notes: list[str] = []
    if options.device == "cuda" and not without_gpu:
        backend, device, ranks_per_node = "nccl", "cuda", min(int(ready[r]["gpus"]) for r in members)
        max_mib, ring_mib = options.allreduce_max_mib or GPU_ALLREDUCE_MAX_MIB, options.ring_mib or GPU_RING_MIB
    else:
        backend, device, ranks_per_node = "gloo", "cpu", 1
        max_mib, ring_mib = options.allreduce_max_mib or CPU_ALLREDUCE_MAX_MIB, options.ring_mib or CPU_RING_MIB
        if options.device == "cuda":
            notes.append(f"gloo on the CPUs: no usable GPU on {', '.join(without_gpu[:8])}")
    return Plan(members, names, ranks_per_node, backend, device, _whole_floats(max_mib), _whole_floats(ring_mib),
                RING_REPEATS, shuffled_rings(len(members), options.ring_rounds, rng), options.cross_timeout, notes,
                without_gpu if options.device == "cuda" and backend == "gloo" else [], options.start_timeout)


def _whole_floats(mib: float) -> int:
    nbytes = int(mib * MiB)
    return max(4096, nbytes - nbytes % 4)
