"""The cluster report's node rows: one line per node, worst first, with what the cluster (not the
node's own record) says about it."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ...record import FAIL, PASS, WARN
from .nodes import FAILED, METRICS, MISSING, STOPPED, natural_key, NodeView, starting_up
from .per_node import UNIFORM_FAIL, fmt, last_step_words, others_words, Straggler, subject_scope, UniformityRow
from .cross_node import RingPair, RingVerdict


HEADLINE_CHARS = 60  # a node's own worst finding, in its one line of the report


# -- the node rows ------------------------------------------------------------------------------

@dataclass
class NodeRow:
    """One line of the cluster report."""

    name: str
    rank: int | None
    status: str  # ok / failed / missing / stopped
    verdict: str | None  # the node's own verdict
    badge: str  # MISSING / FAILED / FAIL / STOPPED / WARN / PASS
    gpus: str
    pace: float | None  # the node's worst share of a cluster baseline (1.0: on the baseline)
    headline: str
    saved_run: int | None = None


_BADGE_ORDER = {"MISSING": 0, "FAILED": 1, "FAIL": 2, "STOPPED": 3, "WARN": 3, "PASS": 4}


# Within a badge: nodes the cluster itself singles out first (their worst share of a cluster
# baseline, then odd ones out), then the rest.
ODD_ONE_PACE = 1.5
NOTHING_PACE = 2.0


@dataclass
class ClusterEvidence:
    """What the cluster, not the node's own record, says about one node."""

    straggler: Straggler | None = None
    ring_slow: list[RingPair] | None = None
    ring_share: float | None = None  # its slow transfers' median / the ring's baseline
    odd: list[tuple[str, str, str]] = field(default_factory=list)  # (field, its value, the majority value)
    behind: str | None = None  # the step it stopped the cross-node phase at


def node_rows(views: list[NodeView], stragglers: list[Straggler], ring: RingVerdict | None,
              uniformity: list[UniformityRow] | None = None, behind: dict[str, str] | None = None,
              others_reached: str | None = None) -> list[NodeRow]:
    """One row per node, worst first: missing, failed, failing, warning, passing; within each, the
    nodes the cluster's own evidence singles out (straggler, slow ring partner, odd one out,
    held up the meeting) before the others, slower first."""
    evidence: dict[str, ClusterEvidence] = defaultdict(ClusterEvidence)
    for s in stragglers:  # sorted by share: the first per node is its worst
        if evidence[s.node].straggler is None:
            evidence[s.node].straggler = s
    baseline = ring.baseline if ring else None
    for name, slow in (ring.suspect_nodes if ring else {}).items():
        values = [p.gbps for p in slow if p.gbps is not None]
        evidence[name].ring_slow = slow
        evidence[name].ring_share = (statistics.median(values) / baseline if values and baseline else 0.0)
    for row in uniformity or ():
        for value, names in row.odd.items():
            if len(names) < row.count:  # an even split has no odd one out
                for name in names:
                    evidence[name].odd.append((row.field, value, row.value or "?"))
    for name, step in (behind or {}).items():
        evidence[name].behind = step
    rows = [_row(view, evidence.get(view.name) or ClusterEvidence(), others_reached) for view in views]
    order = {v.name: v.order for v in views}
    rows.sort(key=lambda r: (_BADGE_ORDER[r.badge], r.pace if r.pace is not None else _sort_pace(evidence.get(r.name)),
                             natural_key(r.name), order[r.name]))
    return rows


def _sort_pace(evidence: ClusterEvidence | None) -> float:
    if evidence and (evidence.behind or evidence.odd):
        return 0.0 if evidence.behind else ODD_ONE_PACE
    return NOTHING_PACE


def _row(view: NodeView, evidence: ClusterEvidence, others_reached: str | None = None) -> NodeRow:
    entry = view.entry
    if entry.status == MISSING:
        return NodeRow(entry.name, entry.rank, entry.status, None, "MISSING", "—", None, entry.reason or "never joined")
    if entry.status == STOPPED:
        return NodeRow(entry.name, entry.rank, entry.status, None, "STOPPED", "—", None, entry.reason or "stopped")
    statuses = [view.verdict or PASS]
    headlines = []
    paces = []
    if entry.status == FAILED:
        during = f" (during {entry.step})" if last_step_words(entry) else ""
        headlines.append(f"failed: {entry.reason or 'no reason given'}{during}")
    if evidence.behind and starting_up(evidence.behind):  # a loaded node: slow to start, not broken
        statuses.append(WARN)
        headlines.append(f"its cross-node ranks did not start in time (still at {evidence.behind}; a loaded machine?)")
    elif evidence.behind:
        statuses.append(FAIL)
        headlines.append(f"held up the cross-node phase: stuck at {evidence.behind} {others_words(others_reached)}")
    straggler = evidence.straggler
    if straggler:
        statuses.append(straggler.status)
        paces.append(straggler.share)
        where = f"{straggler.subject} " if straggler.subject and subject_scope(straggler.subject) == "gpu" else ""
        headlines.append(f"straggler: {where}{METRICS[straggler.metric].label} {fmt(straggler.value)} {straggler.unit} "
                         f"= {100 * straggler.share:.0f}% of {fmt(straggler.baseline)}")
    if evidence.ring_slow:
        statuses.append(WARN)
        paces.append(evidence.ring_share or 0.0)
        headlines.append(f"slow with every ring partner ({len(evidence.ring_slow)} transfers, "
                         f"{100 * (evidence.ring_share or 0.0):.0f}% of the typical pair)")
    for name, value, majority in evidence.odd:
        statuses.append(FAIL if name in UNIFORM_FAIL else WARN)
        headlines.append(f"odd one out: {name} {_clip(value, 40)} (most nodes: {_clip(majority, 40)})")
    worst_problem = _worst_problem(view.problems)
    if worst_problem:  # its own report has the evidence; one line per node here
        more = len({f["check"] for f in view.problems}) - 1
        headlines.append(f"{worst_problem['check']}: {_clip(worst_problem.get('summary', ''))}"
                         + (f" (+{more} more)" if more > 0 else ""))
    badge = "FAILED" if entry.status == FAILED else _badge_status(statuses).upper()
    return NodeRow(entry.name, entry.rank, entry.status, view.verdict, badge, view.gpus_text,
                   min(paces) if paces else None, "; ".join(headlines) or "nothing to report", entry.saved_run)


def _clip(text: str, limit: int = HEADLINE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def _worst_problem(problems: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((f for f in problems if f.get("status") == FAIL), problems[0] if problems else None)


def _badge_status(statuses: list[str]) -> str:
    """A node row's badge: the first of its worst statuses, FAIL over WARN over the rest. Unlike
    record.verdict_of, a skip or measured verdict that leads the list (the node's own, when its
    run judged nothing) stays the badge where nothing worse is found: the row says SKIP, not PASS."""
    rank = {FAIL: 2, WARN: 1}
    return max(statuses, key=lambda s: rank.get(s, 0))
