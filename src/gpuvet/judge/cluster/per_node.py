"""Judging the nodes against each other: stragglers against a robust cluster baseline, uniformity
(the odd ones out), every node's state (joined, failed, missing, stopped) and its own findings."""

from __future__ import annotations

import functools
import re
import statistics
from collections import defaultdict
import dataclasses
from dataclasses import dataclass

from ...catalog import checked
from ...record import FAIL, PASS, SKIP, WARN, Finding
from ..common import finding
from .nodes import FAILED, MAD_TO_SIGMA, METRICS, MIN_FOR_SPREAD, MISSING, NAMES_SHOWN, NOISE_SIGMAS, OK, STOPPED, name_list, NodeEntry, NodeView, show_command, starting_up

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
CLUSTER_NODES = checked("cluster.nodes")
CLUSTER_NODE_CHECKS = checked("cluster.node_checks")
CLUSTER_STRAGGLERS = checked("cluster.stragglers")
CLUSTER_UNIFORM = checked("cluster.uniform")


# -- robust baseline -------------------------------------------------------------------------

@dataclass
class Baseline:
    metric: str
    scope: str  # "gpu" (every GPU of every node) or the host subject ("cpu", "machine", ...)
    unit: str
    value: float
    threshold: float  # relative distance from the baseline beyond which a value is a straggler
    kept: int  # values the baseline was finally computed from
    total: int
    spread: float  # robust relative standard deviation of the kept values


def beyond(value: float, base: float, threshold: float, higher_is_better: bool) -> bool:
    return value < base * (1 - threshold) if higher_is_better else value > base * (1 + threshold)


def robust_baseline(values: list[float], tolerance: float, higher_is_better: bool = True,
                    rounds: int = 20) -> tuple[float, float, int, float] | None:
    """(baseline, threshold, kept), or None with nothing to compare. fix_threshold with a
    median: drop the values on the bad side of the threshold, recompute from the rest, until
    stable. Only the bad side is dropped: a fast GPU does not make the others slow."""
    ordered = sorted(values)
    if len(ordered) < 2 or ordered[len(ordered) // 2] <= 0:
        return None
    kept = ordered
    for _ in range(rounds):
        base = statistics.median(kept)
        # A spread from fewer values says nothing: then the tolerance alone decides.
        spread = MAD_TO_SIGMA * statistics.median(abs(v - base) for v in kept) / base if len(kept) >= MIN_FOR_SPREAD else 0.0
        threshold = max(tolerance, NOISE_SIGMAS * spread)
        again = [v for v in ordered if not beyond(v, base, threshold, higher_is_better)]
        if len(again) == len(kept):
            break
        kept = again
    return base, threshold, len(kept), spread


# -- stragglers ------------------------------------------------------------------------------

@dataclass
class Straggler:
    node: str
    subject: str  # "gpu3", "cpu", "machine"
    metric: str
    value: float
    unit: str
    baseline: float
    share: float  # value / baseline (baseline / value for lower-is-better): < 1 is worse
    status: str  # warn / fail

    def words(self) -> str:
        metric = METRICS[self.metric]
        where = f"{self.node} {self.subject}" if self.subject else self.node
        return (f"{where} {metric.label} {fmt(self.value)} {self.unit} = {100 * self.share:.0f}% of the cluster baseline "
                f"{fmt(self.baseline)} {self.unit}" + ("" if metric.higher_is_better else " (lower is better)"))


def fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


@functools.lru_cache(maxsize=4096)  # a handful of subjects (gpu0..gpu7, host), asked for every figure
def subject_scope(subject: str) -> str:
    return "gpu" if re.fullmatch(r"gpu\d+", subject) else subject


def find_stragglers(views: list[NodeView], tolerance: float | None = None) -> tuple[list[Baseline], list[Straggler]]:
    """Per metric and scope: a robust baseline over all nodes, and every value beyond it."""
    groups: dict[tuple[str, str], list[tuple[NodeView, str, float]]] = defaultdict(list)
    units: dict[tuple[str, str], str] = {}
    for view in views:
        for name, subject, value, unit in view.figures:
            key = (name, subject_scope(subject))
            groups[key].append((view, subject, value))
            units[key] = unit
    baselines, stragglers = [], []
    for (metric_name, scope), items in groups.items():
        metric = METRICS[metric_name]
        found = robust_baseline([v for _, _, v in items], tolerance or metric.tolerance, metric.higher_is_better)
        if found is None:
            continue
        base, threshold, kept, spread = found
        baselines.append(Baseline(metric_name, scope, units[(metric_name, scope)], base, threshold, kept, len(items), spread))
        for view, subject, value in items:
            if not beyond(value, base, threshold, metric.higher_is_better):
                continue
            share = value / base if metric.higher_is_better else (base / value if value > 0 else 0.0)
            status = FAIL if beyond(value, base, 2 * threshold, metric.higher_is_better) else WARN
            stragglers.append(Straggler(view.name, subject, metric_name, value, units[(metric_name, scope)], base, share, status))
    stragglers.sort(key=lambda s: (s.share, s.node, s.subject))
    return baselines, stragglers


def straggler_findings(views: list[NodeView], baselines: list[Baseline], stragglers: list[Straggler]) -> list[Finding]:
    if not baselines:
        return [finding(CLUSTER_STRAGGLERS, "cluster", SKIP,
                         "no benchmark figure measured on two or more nodes to compare (run without --quick to benchmark)")]
    basis = "; ".join(f"{METRICS[b.metric].label}{'' if b.scope == 'gpu' else ' (' + b.scope + ')'} {fmt(b.value)} {b.unit} "
                      f"(from {b.kept} of {b.total}, threshold {100 * b.threshold:.0f}%)" for b in baselines)
    source = ("robust cluster baseline: iterative fix_threshold (SuperBench) on the median; threshold = the metric's "
              "tolerance or 3 robust standard deviations; the slowest GPU sets the pace of a data-parallel job")
    if not stragglers:
        gpus = sum(v.gpu_count for v in views)
        return [finding(CLUSTER_STRAGGLERS, "cluster", PASS,
                         f"no straggler among {len(views)} nodes ({gpus} GPUs) on {len(baselines)} figures",
                         measured=basis, source=source)]
    by_node: dict[str, list[Straggler]] = defaultdict(list)
    for s in stragglers:
        by_node[s.node].append(s)
    entries = {v.name: v.entry for v in views}
    findings = []
    for node, found in by_node.items():  # worst node first: stragglers are sorted by share
        status = FAIL if any(s.status == FAIL for s in found) else WARN
        worst = found[0]
        others = f" (and {len(found) - 1} more figure{'s' if len(found) > 2 else ''} below)" if len(found) > 1 else ""
        findings.append(finding(
            CLUSTER_STRAGGLERS, f"node:{node}", status, f"straggler: {worst.words()}{others}",
            measured="; ".join(s.words() for s in found[:NAMES_SHOWN])
                     + (f"; ... {len(found) - NAMES_SHOWN} more" if len(found) > NAMES_SHOWN else ""),
            expected=basis, source=source,
            remedy=f"{show_command(entries[node])} (gpu.throttle, gpu.power_limit, gpu.pcie_link explain most); "
                   "`nvidia-smi -q -d PERFORMANCE,POWER,CLOCK`; drain it or ask the provider for another node"))
    return findings


# -- uniformity ------------------------------------------------------------------------------

# Fields whose difference breaks a job outright, and those that only make nodes unequal.
# Different NCCLs on the nodes of one job: "NCCL version mismatch", or a hang in ncclCommInitRank.
UNIFORM_FAIL = {"GPU model", "GPU count", "NCCL"}
UNIFORM_FIELDS = ("GPU model", "GPU count", "GPU memory", "driver", "CUDA (driver)", "VBIOS", "power limit", "PCIe link",
                  "PyTorch", "NCCL", "network")


@dataclass
class UniformityRow:
    field: str
    value: str | None  # the majority value (None: unknown everywhere)
    count: int  # nodes with the majority value
    # dataclasses.field by its full name: the `field` attribute above hides the bare name here
    odd: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # other value -> nodes
    unknown: int = 0  # nodes that did not report the field

    @property
    def uniform(self) -> bool:
        return not self.odd


def check_uniformity(views: list[NodeView]) -> list[UniformityRow]:
    reported = [v for v in views if v.entry.record is not None]
    rows = []
    for name in UNIFORM_FIELDS:
        values: dict[str, list[str]] = defaultdict(list)
        unknown = 0
        for view in reported:
            value = view.facts.get(name)
            if value is None:
                unknown += 1
            else:
                values[value].append(view.name)
        if not values:
            rows.append(UniformityRow(name, None, 0, unknown=unknown))
            continue
        majority = max(values, key=lambda v: (len(values[v]), v))
        odd = {v: nodes for v, nodes in sorted(values.items(), key=lambda kv: len(kv[1])) if v != majority}
        rows.append(UniformityRow(name, majority, len(values[majority]), odd, unknown))
    return rows


def uniformity_findings(rows: list[UniformityRow]) -> list[Finding]:
    findings = []
    for row in rows:
        if row.value is None:
            continue
        if row.uniform:
            everywhere = f"on all {row.count} nodes" if row.count > 1 else "on the one node that reported"
            findings.append(finding(CLUSTER_UNIFORM, row.field, PASS, f"{row.field}: {row.value} {everywhere}"
                                     + (f" ({row.unknown} did not report it)" if row.unknown else ""), measured=row.value))
            continue
        odd_words = "; ".join(f"{value} on {name_list(nodes)}" for value, nodes in row.odd.items())
        status = FAIL if row.field in UNIFORM_FAIL else WARN
        findings.append(finding(
            CLUSTER_UNIFORM, row.field, status, f"{row.field} differs: {row.value} on {row.count} nodes; {odd_words}",
            measured=f"{row.value} on {row.count} nodes; {odd_words}", expected="the same on every node",
            source="a job runs at the pace of its slowest node; mixed drivers, firmware or power limits give unequal nodes "
                   "(imbue and AzureHPC health checks require identical versions across the fleet)",
            remedy="`nvidia-smi -q | grep -i -e version -e 'power limit'` on the odd nodes; drain them or ask the provider to "
                   "align them"))
    return findings


def last_step_words(entry: NodeEntry) -> str:
    """" (last step: X)", unless the reason already says where the node was."""
    if not entry.step or "last step" in (entry.reason or "") or entry.step in (entry.reason or ""):
        return ""
    return f" (last step: {entry.step})"


def node_state_findings(entries: list[NodeEntry], behind: dict[str, str], others_reached: str | None,
                         start_timeout_s: float | None = None) -> list[Finding]:
    missing = [e for e in entries if e.status == MISSING and not e.unnamed]
    unnamed = [e for e in entries if e.status == MISSING and e.unnamed]
    failed = [e for e in entries if e.status == FAILED]
    findings = [finding(CLUSTER_NODES, f"node:{e.name}", SKIP, f"{e.name} was not vetted to its end: {e.reason}",
                         measured=e.reason, expected="every node finishes its vet and the cross-node tests",
                         remedy="rerun the cluster vet to its end (the stop was not this node's fault)")
                for e in entries if e.status == STOPPED]
    if unnamed:
        came = sum(e.rank is not None for e in entries)
        count = f"{len(unnamed)} node{'' if len(unnamed) == 1 else 's'}"
        findings.append(finding(
            CLUSTER_NODES, "cluster", FAIL,
            f"{count} never joined (expected {len(entries)}, {came} joined)", measured=unnamed[0].reason,
            expected=f"{len(entries)} nodes (--expect-nodes, --nodes or torchrun's --nnodes)",
            remedy="start gpuvet on every node with the same line (`gpuvet cluster --print-launch`), each within the join "
                   "timeout; give --nodes HOSTLIST to have the missing ones named"))
    for e in missing:
        findings.append(finding(CLUSTER_NODES, f"node:{e.name}", FAIL, f"{e.name} is missing: {e.reason or 'it never joined'}",
                                 measured=e.reason, expected="every node of the job joins",
                                 remedy=f"on {e.name}: is it up, can it reach the master address and port (firewall), did "
                                        "its launcher start? The other nodes' results are complete without it"))
    for e in failed:
        step = last_step_words(e)
        findings.append(finding(CLUSTER_NODES, f"node:{e.name}", FAIL,
                                 f"{e.name} failed: {e.reason or 'no reason given'}{step}", measured=(e.reason or "") + step,
                                 expected="every node finishes its vet and the cross-node tests",
                                 remedy=f"on {e.name}: `dmesg | tail`, `nvidia-smi`; rerun `gpuvet run` there alone"))
    by_name = {e.name: e for e in entries}
    for name, step in behind.items():
        if name not in by_name or by_name[name].status != OK:
            continue  # already named above
        others = others_words(others_reached)
        if starting_up(step):  # a busy node starts processes slowly: said, never failed for it
            within = f"within {start_timeout_s:.0f} s" if start_timeout_s else "in time"
            while_others = f" {others}" if others_reached else ""
            findings.append(finding(
                CLUSTER_NODES, f"node:{name}", WARN, f"{name}: its cross-node ranks did not start {within} (still at "
                f"'{step}'{while_others}): a loaded machine? see `uptime` there; slow, not a fault of its hardware",
                measured=f"last step of its slowest rank: {step}; the other nodes: {others_reached or '?'}",
                expected="every node's ranks start (Python, PyTorch) within the start-up limit (--start-timeout)",
                remedy=f"`uptime` and `top` on {name} (what holds its CPUs); rerun on idle nodes or with a longer "
                       f"--start-timeout; {show_command(by_name[name])}"))
            continue
        findings.append(finding(
            CLUSTER_NODES, f"node:{name}", FAIL, f"{name} held up the cross-node phase: stuck at {step} {others}",
            measured=f"last step of its slowest rank: {step}; the other nodes: {others_reached or '?'}",
            expected="every node's ranks reach each collective together",
            remedy=f"{show_command(by_name[name])}; there: `dmesg | tail`, `nvidia-smi`; NCCL_DEBUG=INFO shows where a "
                   "collective hangs; rerun without it to vet the others"))
    if not findings:
        findings.append(finding(CLUSTER_NODES, "cluster", PASS, f"all {len(entries)} nodes joined and reported"))
    return findings


def others_words(reached: str | None) -> str:
    if reached == "finished":
        return "while the others finished"
    return f"while the others reached {reached}" if reached else "while the others went on"


def node_check_findings(views: list[NodeView]) -> list[Finding]:
    """The nodes' own findings, grouped by check: one line per problem, whatever the cluster size."""
    groups: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for view in views:
        seen = set()
        for f in view.problems:
            key = (f["check"], f["status"])
            if key not in seen:  # one line per node and check
                seen.add(key)
                groups[key].append((view.name, f.get("summary") or ""))
    reported = sum(1 for v in views if v.entry.record is not None)
    entries = {v.name: v.entry for v in views}
    findings = []
    for (check, status), items in sorted(groups.items(), key=lambda kv: (kv[0][1] != FAIL, -len(kv[1]), kv[0][0])):
        nodes = [n for n, _ in items]
        example = f"{items[0][0]}: {items[0][1]}"
        first = entries[items[0][0]]
        findings.append(finding(CLUSTER_NODE_CHECKS, check, status,
                                 f"{check} {status.upper()} on {len(nodes)} of {reported} nodes ({name_list(nodes)})",
                                 measured=f"e.g. {example}",
                                 remedy=f"each node's stored run shows the evidence and the fix: `gpuvet show RUN` on that node "
                                        f"(RUN: its saved run in the node list), e.g. {show_command(first)}"))
    return findings
