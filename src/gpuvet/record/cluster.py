"""The cluster record (gpuvet.cluster/1) as types: what `gpuvet cluster --out` writes and what
`gpuvet report` judges again. cluster/record.py builds it; judge/cluster/ judges its nodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

from .errors import RecordError
from .run import STATUSES, Finding, Measurement, check_run
from .validate import OneOf, check

CLUSTER_SCHEMA = "gpuvet.cluster/1"


class ClusterNode(TypedDict, total=False):
    """One node as the cluster saw it (judge.cluster.NodeEntry as JSON)."""

    name: str
    rank: int | None
    status: str  # ok / failed / missing / stopped
    reason: str | None
    step: str | None
    host: str | None
    record: dict[str, Any] | None  # its run record, time series summarised (checked as a run record)
    saved_run: int | None
    unnamed: bool


@dataclass
class ClusterPlan:
    """What rank 0 decided for the meeting (the cluster's cross-node step): cluster/plan.py makes it."""

    members: list[int]  # ranks taking part, in member order
    names: list[str]  # their node names
    ranks_per_node: int
    backend: str  # nccl / gloo
    device: str  # cuda / cpu
    allreduce_max_bytes: int
    ring_bytes: int
    ring_repeats: int
    rounds: list[list[int]]  # per round: member indices in ring order (each sends to the next)
    timeout_s: float  # the measurements, from when every rank has started
    notes: list[str] = field(default_factory=list)
    without_gpu: list[str] = field(default_factory=list)  # GPUs were asked for; these nodes had none usable
    start_timeout_s: float = 180.0  # every rank's start-up (Python, import torch), before timeout_s runs


class CrossNode(TypedDict, total=False):
    plan: ClusterPlan | None
    measurements: list[Measurement]


class Launcher(TypedDict, total=False):
    kind: str
    world_size: int
    master: str


class _ClusterBase(TypedDict):
    schema: str
    nodes: list[ClusterNode]


class ClusterRecord(_ClusterBase, total=False):
    tool: dict[str, str]
    cluster_id: str
    started_at: str
    duration_s: float
    launcher: Launcher
    options: dict[str, Any]
    cross_node: CrossNode
    summary: dict[str, Any]  # made again from nodes and cross_node when the record is judged again
    findings: list[Finding]
    verdict: Annotated[str, OneOf(STATUSES)]
    stopped: str | None


def check_cluster(data: Any, path: str = "") -> dict[str, Any]:
    """`data` checked to be a cluster record, each node's run record as a run record."""
    if not isinstance(data, dict) or data.get("schema") != CLUSTER_SCHEMA:
        raise RecordError(f"{path or 'the record'}: not a gpuvet cluster record")
    # Each node's run record is checked once, as a run record: not first as free content too (a
    # second walk over every value, a quarter of `gpuvet report`'s time at 1,000 nodes).
    nodes = data.get("nodes")
    records = [n.pop("record", None) if isinstance(n, dict) else None for n in nodes] if isinstance(nodes, list) else []
    try:
        checked: dict[str, Any] = check(data, ClusterRecord, path)
    finally:
        for node, record in zip(nodes or (), records):
            if isinstance(node, dict) and record is not None:
                node["record"] = record
    for i, (node, record) in enumerate(zip(checked["nodes"], records)):
        if record is not None:
            node["record"] = check_run(record, f"nodes[{i}].record")
    return checked
