"""Cluster judgement (D4): every node's run record and the cross-node measurements in, findings out.

Pure: no I/O, no torch; a cluster record can be judged again anywhere. Node records arrive as the
plain dicts of their JSON (gpuvet.run/1), because turning 1,000 of them back into dataclasses
costs seconds and the rules here read a handful of fields from each.

* Stragglers: the slowest GPU sets the pace of a data-parallel job, so each GPU (and each node's
  host figures) is compared with a cluster baseline. The baseline is robust, so that bad nodes do
  not drag it down: SuperBench's iterative `fix_threshold`, with a median instead of a mean (start
  at the median of all values, drop the values more than the threshold below it, take the median
  of the rest, repeat until nothing more is dropped). The threshold is the metric's tolerance, or
  three robust standard deviations (1.4826 x MAD) of the kept values when those are noisier, so
  ordinary noise is never called a straggler.
* Uniformity: model, count, driver, VBIOS, power limit, PCIe link, memory, PyTorch and network
  compared across nodes; the majority value and the odd nodes by name.
* Cross-node: all-reduce bus bandwidth (nccl-tests definition) against the slowest node's network
  (NCCL: its active RDMA ports together, else its fastest NIC; gloo: the NIC), and a shuffled ring
  of node-to-node transfers whose slow pairs are attributed to a node (slow with every partner
  while those partners are fine with others) or to one link; each directed pair is judged on the
  median of its transfers.
* Nodes that never joined, or failed, are named with the reason and the step they were in.

The package: nodes.py (the nodes and the fields of their records the rules read), per_node.py
(stragglers, uniformity, node states), cross_node.py (all-reduce, ring, fallback), view.py (the
report's node rows); judge_cluster here puts them together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...catalog import checked
from ...record import FAIL, Finding, Measurement
from ..common import finding
from .nodes import (ALLREDUCE_BUSBW, ALLREDUCE_LATENCY, ALLREDUCE_PASS_SHARE, ALLREDUCE_WARN_SHARE, FAILED, FALLBACK,
    GLOO_WARN_SHARE, IMPORTING_TORCH, MAD_TO_SIGMA, METRICS, MIN_FOR_SPREAD, MISSING, NAMES_SHOWN, NOISE_SIGMAS,
    NOTE, OK, RING, RING_TOLERANCE, SEED_SOURCE, START_UP_STEPS, STOPPED, UNNAMED_PREFIX, WAITING_FOR_RANKS, Metric,
    name_list, natural_key, Network, network_of, node_view, NodeEntry, NodeView, show_command, starting_up)
from .per_node import (UNIFORM_FIELDS, Baseline, check_uniformity, find_stragglers, robust_baseline, Straggler,
    UniformityRow, node_check_findings, node_state_findings, straggler_findings, uniformity_findings)
from .cross_node import (attribute_ring, ring_pairs, RingPair, RingVerdict, allreduce_finding, cross_measurements,
    fallback_findings, ring_findings)
from .view import (HEADLINE_CHARS, NOTHING_PACE, ODD_ONE_PACE, ClusterEvidence, node_rows, NodeRow)

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
CLUSTER_RUN = checked("cluster.run")

__all__ = ["ALLREDUCE_BUSBW", "ALLREDUCE_LATENCY", "ALLREDUCE_PASS_SHARE", "ALLREDUCE_WARN_SHARE", "FAILED",
           "FALLBACK", "GLOO_WARN_SHARE", "IMPORTING_TORCH", "MAD_TO_SIGMA", "METRICS", "MIN_FOR_SPREAD", "MISSING",
           "NAMES_SHOWN", "NOISE_SIGMAS", "NOTE", "OK", "RING", "RING_TOLERANCE", "SEED_SOURCE", "START_UP_STEPS",
           "STOPPED", "UNNAMED_PREFIX", "WAITING_FOR_RANKS", "Metric", "name_list", "natural_key", "Network",
           "network_of", "node_view", "NodeEntry", "NodeView", "show_command", "starting_up", "UNIFORM_FIELDS",
           "Baseline", "check_uniformity", "find_stragglers", "robust_baseline", "Straggler", "UniformityRow",
           "attribute_ring", "ring_pairs", "RingPair", "RingVerdict", "HEADLINE_CHARS", "NOTHING_PACE",
           "ODD_ONE_PACE", "ClusterEvidence", "node_rows", "NodeRow", "ClusterJudgement", "judge_cluster"]


@dataclass
class ClusterJudgement:
    findings: list[Finding]
    rows: list[NodeRow]  # worst first
    baselines: list[Baseline]
    stragglers: list[Straggler]
    uniformity: list[UniformityRow]
    ring: RingVerdict | None


def judge_cluster(entries: list[NodeEntry], measurements: list[Measurement] | None = None,
                  options: dict[str, Any] | None = None) -> ClusterJudgement:
    options = options or {}
    measurements = list(measurements or [])
    views = [node_view(e, i) for i, e in enumerate(entries)]
    baselines, stragglers = find_stragglers(views, options.get("tolerance"))
    uniformity = check_uniformity(views)
    busbw, latency, ring, notes = cross_measurements(measurements)
    fallback = next((m for m in measurements if m.name == FALLBACK), None)
    ring_verdict = attribute_ring(ring_pairs(ring)) if ring else None
    behind, others_reached = _behind(notes)
    start_timeout_s = next((n.details["start_timeout_s"] for n in notes if n.details.get("start_timeout_s")), None)
    findings = (_stopped_findings(options.get("stopped"))
                + node_state_findings(entries, behind, others_reached, start_timeout_s)
                + straggler_findings(views, baselines, stragglers)
                + uniformity_findings(uniformity) + node_check_findings(views) + fallback_findings(fallback)
                + [allreduce_finding(views, busbw, latency, notes)] + ring_findings(views, ring, notes))
    rows = node_rows(views, stragglers, ring_verdict, uniformity, behind, others_reached)
    return ClusterJudgement(findings, rows, baselines, stragglers, uniformity, ring_verdict)


def _stopped_findings(stopped: str | None) -> list[Finding]:
    if not stopped:
        return []
    return [finding(CLUSTER_RUN, "cluster", FAIL, f"the run was stopped before its end ({stopped}): this report holds "
                     "what was gathered by then", measured=stopped, expected="the run ends by itself",
                     remedy="if torchrun's log says 'Detected N new nodes ... will restart worker group', a node joined "
                            "late: start every node at once with the line from `gpuvet cluster --print-launch`, and rerun")]


def _behind(notes: list[Measurement]) -> tuple[dict[str, str], str | None]:
    """The nodes that held up the cross-node phase (name -> the step they stopped at), from the note."""
    for note in notes:
        if note.details.get("behind"):
            return dict(note.details["behind"]), note.details.get("others_reached")
    return {}, None
