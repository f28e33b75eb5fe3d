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
"""

from __future__ import annotations

import functools
import re
import statistics
from collections import Counter, defaultdict
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..facts import Gpu, PcieLink, from_dict
from ..record import FAIL, PASS, SKIP, WARN, Finding, Measurement, Valued, has_value
from .common import finding
from .gpu_links import link_state

# Node states. STOPPED: joined, then the run was stopped (Ctrl-C, --timeout, a signal) before it was
# ready: not vetted to its end, and not its fault.
OK, FAILED, MISSING, STOPPED = "ok", "failed", "missing", "stopped"
UNNAMED_PREFIX = "(unnamed) #"  # a node expected (by count) that never joined, and no list names it

# Measurement names of the cross-node phase.
ALLREDUCE_BUSBW = "cluster.allreduce.busbw"
ALLREDUCE_LATENCY = "cluster.allreduce.latency_1mb"
RING = "cluster.ring"
NOTE = "bench.cluster"
FALLBACK = "cluster.fallback"  # the meeting ran over gloo on the CPUs although GPUs were asked for

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution x this = its standard deviation
NOISE_SIGMAS = 3.0
MIN_FOR_SPREAD = 5  # values needed before their spread may widen the threshold
RING_TOLERANCE = 0.25  # node-to-node TCP/RDMA transfers vary more than GPU kernels
ALLREDUCE_PASS_SHARE, ALLREDUCE_WARN_SHARE = 0.6, 0.35  # as gpu.allreduce inside one machine
# gloo moves data over one TCP stream per pair, which rarely fills a fast NIC: below this share of
# the slowest node's NIC it is worth a look, above it nothing can be concluded from the NIC.
GLOO_WARN_SHARE = 0.05
NAMES_SHOWN = 8
HEADLINE_CHARS = 60  # a node's own worst finding, in its one line of the report
SEED_SOURCE = ("seed: multi-node training speed-up fell from 8x to under 5x when the interconnect was slow or lacked "
               "RDMA; nccl-tests busbw = algbw x 2(n-1)/n")


@dataclass
class NodeEntry:
    """One node as the cluster saw it."""

    name: str
    rank: int | None = None
    status: str = OK  # ok / failed / missing / stopped
    reason: str | None = None  # why failed, missing or stopped
    step: str | None = None  # the last step the node reported
    host: str | None = None
    record: dict[str, Any] | None = None  # its run record (gpuvet.run/1 as a dict), time series summarised
    saved_run: int | None = None  # the run id in the node's own store
    unnamed: bool = False  # expected by count only (--expect-nodes, torchrun's --nnodes): no name to give it


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    higher_is_better: bool
    tolerance: float  # relative shortfall from the baseline that makes a straggler


# The figures compared across the cluster. An explicit list: a metric that is noisy by nature
# (pageable copies, decay percentages) would name innocent nodes.
METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("gemm.bf16", "bf16 GEMM", True, 0.10),
    Metric("gemm.fp16", "fp16 GEMM", True, 0.10),
    Metric("gemm.fp8", "fp8 GEMM", True, 0.10),
    Metric("gemm.tf32", "tf32 GEMM", True, 0.10),
    Metric("gemm.fp32", "fp32 GEMM", True, 0.10),
    Metric("sustained.tflops", "sustained load", True, 0.10),
    Metric("membw.copy", "memory copy", True, 0.10),
    Metric("pcie.h2d_pinned", "host to GPU", True, 0.15),
    Metric("pcie.d2h_pinned", "GPU to host", True, 0.15),
    Metric("latency.kernel_launch", "kernel launch", False, 0.30),
    Metric("latency.context_init", "CUDA context start", False, 0.50),
    Metric("workload.tokens_per_s", "training workload", True, 0.10),
    Metric("allreduce.busbw", "all-reduce in the node", True, 0.15),
    Metric("disk.seq_write", "disk write", True, 0.25),
    Metric("disk.seq_read", "disk read", True, 0.25),
)}


# -- what the judge reads from a node record -------------------------------------------------

@dataclass
class NodeView:
    """The few facts and figures of one node the cluster rules use (read once, from the dict)."""

    entry: NodeEntry
    order: int  # position in the input: stable tie-breaker
    verdict: str | None  # the node's own verdict; None without a record
    gpu_count: int = 0
    gpus_text: str = "no record"
    facts: dict[str, str | None] = field(default_factory=dict)  # uniformity field -> value
    figures: list[tuple[str, str, float, str]] = field(default_factory=list)  # (metric, subject, value, unit)
    problems: list[dict[str, Any]] = field(default_factory=list)  # the node's own FAIL/WARN findings
    network: Network | None = None

    @property
    def name(self) -> str:
        return self.entry.name


def node_view(entry: NodeEntry, order: int) -> NodeView:
    record = entry.record
    if record is None:
        return NodeView(entry, order, None)
    machine = record.get("machine") or {}
    gpus = machine.get("gpus") or []
    view = NodeView(entry, order, record.get("verdict"), gpu_count=len(gpus), gpus_text=_gpus_text(gpus, machine))
    view.facts = _uniformity_facts(machine, gpus)
    view.figures = [(m["name"], m.get("subject") or "", float(m["value"]), m.get("unit") or "")
                    for m in record.get("measurements") or ()
                    if m.get("name") in METRICS and isinstance(m.get("value"), (int, float))]
    view.problems = [f for f in record.get("findings") or () if f.get("status") in (FAIL, WARN)]
    view.network = network_of(machine.get("host"))
    return view


def _gpus_text(gpus: list[dict[str, Any]], machine: dict[str, Any]) -> str:
    if not gpus:
        return "no GPU"
    names = Counter(g.get("name") or "unknown GPU" for g in gpus)
    return ", ".join(f"{count} x {name}" for name, count in names.most_common())


def _joined(values: Iterable[Any]) -> str | None:
    """The distinct known values of a node's GPUs, as one string (None: none known)."""
    distinct = sorted({str(v) for v in values if v is not None})
    return ", ".join(distinct) if distinct else None


def _watts(value: Any) -> str | None:
    return None if value is None else f"{float(value):.0f} W"


def _pcie_link(gpu: dict[str, Any]) -> str | None:
    """The link's maximum (LnkCap), plus what it runs at when that is less: a GPU trained at x8
    in an x16 slot must not look like its neighbours. Read as gpu.pcie_link reads it (one rule):
    the generation counts only under load (an idle link drops its speed to save power); the width
    counts always."""
    readings = (gpu.get("pcie") or {}).get("readings") or ()
    cap = next(((r["max_gen"], r["max_width"]) for r in readings if r.get("max_gen") and r.get("max_width")), None)
    if cap is None:
        return None
    text = f"Gen{cap[0]} x{cap[1]}"
    state = link_state(_link_facts(gpu, readings))
    if state is None:
        return text
    r = state.reading
    if state.under_load and ((r.current_gen or cap[0]) < cap[0] or (r.current_width or cap[1]) < cap[1]):
        return f"{text} (runs Gen{r.current_gen or '?'} x{r.current_width or '?'} under load)"
    if r.current_width and r.current_width < cap[1]:
        return f"{text} (runs x{r.current_width})"
    return text


def _link_facts(gpu: dict[str, Any], readings: Iterable[dict[str, Any]]) -> Gpu:
    """What the PCIe rule reads of a node's GPU: its readings, and whether it was busy with a
    context. Built from those fields alone: a whole GPU rebuilt per node is too slow on 1,000 nodes."""
    facts = Gpu(index=gpu.get("index") or 0, memory_used_mib=gpu.get("memory_used_mib"),
                memory_reserved_mib=gpu.get("memory_reserved_mib"), pstate=gpu.get("pstate"),
                utilization_pct=gpu.get("utilization_pct"), processes=gpu.get("processes"))
    facts.pcie.readings = [from_dict(PcieLink, r) for r in readings]
    facts.clocks.event_reasons = (gpu.get("clocks") or {}).get("event_reasons")
    return facts


def _uniformity_facts(machine: dict[str, Any], gpus: list[dict[str, Any]]) -> dict[str, str | None]:
    driver = machine.get("driver") or {}
    torch = (machine.get("stack") or {}).get("torch") or {}
    torch_text = None
    if torch.get("installed") and torch.get("version"):
        torch_text = f"{torch['version']}" + (f" (CUDA {torch['cuda']})" if torch.get("cuda") else "")
    facts: dict[str, str | None] = {
        "GPU model": _joined(g.get("name") for g in gpus) if gpus else "no GPU",
        "GPU count": str(len(gpus)),
        "driver": driver.get("version"),
        "CUDA (driver)": driver.get("cuda_version"),
        "VBIOS": _joined(g.get("vbios") for g in gpus),
        "power limit": _joined(_watts((g.get("power") or {}).get("enforced_limit_w") or (g.get("power") or {}).get("limit_w"))
                               for g in gpus),
        "PCIe link": _joined(_pcie_link(g) for g in gpus),
        "GPU memory": _joined(f"{g['memory_total_mib']} MiB" if g.get("memory_total_mib") else None for g in gpus),
        "PyTorch": torch_text,
        "NCCL": torch.get("nccl") if torch.get("installed") else None,  # stack.nccl: what PyTorch carries
    }
    facts["network"] = network_of(machine.get("host")).words() if machine.get("host") else None
    return facts


@dataclass
class Network:
    """What a node's network carries, from its facts."""

    rdma_gbs: float | None = None  # all ACTIVE RDMA ports together, GB/s
    rdma_words: str = ""
    nic_gbs: float | None = None  # the fastest physical NIC that is up, GB/s
    nic_words: str = ""
    rdma_read: bool = False  # False: RDMA devices were not looked for
    nics_read: bool = False

    def carries(self, backend: str) -> tuple[float | None, str]:
        """GB/s a backend can use: NCCL takes the RDMA ports when there are any; gloo (and NCCL
        without RDMA) go through TCP over one NIC."""
        if backend == "nccl" and self.rdma_gbs:
            return self.rdma_gbs, self.rdma_words
        return self.nic_gbs, self.nic_words

    @property
    def no_rdma(self) -> bool:
        return self.rdma_read and not self.rdma_gbs

    def words(self) -> str | None:
        parts = [w for w in (self.rdma_words, self.nic_words) if w]
        if self.nics_read and not self.nic_words:
            parts.append("NIC speed not reported")
        if self.no_rdma:
            parts.append("no RDMA")
        return ", ".join(parts) or None


def network_of(host: dict[str, Any] | None) -> Network:
    net = Network()
    if not host:
        return net
    net.rdma_read = host.get("rdma") is not None
    net.nics_read = host.get("nics") is not None
    active = [p for p in host.get("rdma") or () if (p.get("state") or "").upper() == "ACTIVE" and p.get("rate_gbps")]
    if active:
        rates = Counter(float(p["rate_gbps"]) for p in active)
        layer = active[0].get("link_layer") or "RDMA"
        net.rdma_gbs = sum(float(p["rate_gbps"]) for p in active) / 8
        net.rdma_words = " + ".join(f"{n} x {rate:g} Gb/s" for rate, n in sorted(rates.items(), reverse=True)) + f" {layer}"
    speeds = [n["speed_mbps"] for n in host.get("nics") or () if not n.get("virtual") and n.get("speed_mbps")
              and n.get("operstate") == "up"]
    if speeds:
        net.nic_gbs = max(speeds) / 8000
        net.nic_words = f"{max(speeds) / 1000:g} Gbit/s Ethernet"
    return net


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


def _beyond(value: float, base: float, threshold: float, higher_is_better: bool) -> bool:
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
        again = [v for v in ordered if not _beyond(v, base, threshold, higher_is_better)]
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
        return (f"{where} {metric.label} {_fmt(self.value)} {self.unit} = {100 * self.share:.0f}% of the cluster baseline "
                f"{_fmt(self.baseline)} {self.unit}" + ("" if metric.higher_is_better else " (lower is better)"))


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


@functools.lru_cache(maxsize=4096)  # a handful of subjects (gpu0..gpu7, host), asked for every figure
def _scope(subject: str) -> str:
    return "gpu" if re.fullmatch(r"gpu\d+", subject) else subject


def find_stragglers(views: list[NodeView], tolerance: float | None = None) -> tuple[list[Baseline], list[Straggler]]:
    """Per metric and scope: a robust baseline over all nodes, and every value beyond it."""
    groups: dict[tuple[str, str], list[tuple[NodeView, str, float]]] = defaultdict(list)
    units: dict[tuple[str, str], str] = {}
    for view in views:
        for name, subject, value, unit in view.figures:
            key = (name, _scope(subject))
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
            if not _beyond(value, base, threshold, metric.higher_is_better):
                continue
            share = value / base if metric.higher_is_better else (base / value if value > 0 else 0.0)
            status = FAIL if _beyond(value, base, 2 * threshold, metric.higher_is_better) else WARN
            stragglers.append(Straggler(view.name, subject, metric_name, value, units[(metric_name, scope)], base, share, status))
    stragglers.sort(key=lambda s: (s.share, s.node, s.subject))
    return baselines, stragglers


def show_command(entry: NodeEntry) -> str:
    """The command that prints a node's own stored run, on that node (each node keeps its own store)."""
    if entry.saved_run is None:
        return f"`gpuvet run` on {entry.name} (its run was not saved)"
    return f"`gpuvet show {entry.saved_run}` on {entry.name}"


def _straggler_findings(views: list[NodeView], baselines: list[Baseline], stragglers: list[Straggler]) -> list[Finding]:
    if not baselines:
        return [finding("cluster.stragglers", "cluster", SKIP,
                         "no benchmark figure measured on two or more nodes to compare (run without --quick to benchmark)")]
    basis = "; ".join(f"{METRICS[b.metric].label}{'' if b.scope == 'gpu' else ' (' + b.scope + ')'} {_fmt(b.value)} {b.unit} "
                      f"(from {b.kept} of {b.total}, threshold {100 * b.threshold:.0f}%)" for b in baselines)
    source = ("robust cluster baseline: iterative fix_threshold (SuperBench) on the median; threshold = the metric's "
              "tolerance or 3 robust standard deviations; the slowest GPU sets the pace of a data-parallel job")
    if not stragglers:
        gpus = sum(v.gpu_count for v in views)
        return [finding("cluster.stragglers", "cluster", PASS,
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
            "cluster.stragglers", f"node:{node}", status, f"straggler: {worst.words()}{others}",
            measured="; ".join(s.words() for s in found[:NAMES_SHOWN])
                     + (f"; ... {len(found) - NAMES_SHOWN} more" if len(found) > NAMES_SHOWN else ""),
            expected=basis, source=source,
            remedy=f"{show_command(entries[node])} (gpu.throttle, gpu.power_limit, gpu.pcie_link explain most); "
                   "`nvidia-smi -q -d PERFORMANCE,POWER,CLOCK`; drain it or ask the provider for another node"))
    return findings


# -- uniformity ------------------------------------------------------------------------------

# Fields whose difference breaks a job outright, and those that only make nodes unequal.
# Different NCCLs on the nodes of one job: "NCCL version mismatch", or a hang in ncclCommInitRank.
_UNIFORM_FAIL = {"GPU model", "GPU count", "NCCL"}
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


def _uniformity_findings(rows: list[UniformityRow]) -> list[Finding]:
    findings = []
    for row in rows:
        if row.value is None:
            continue
        if row.uniform:
            everywhere = f"on all {row.count} nodes" if row.count > 1 else "on the one node that reported"
            findings.append(finding("cluster.uniform", row.field, PASS, f"{row.field}: {row.value} {everywhere}"
                                     + (f" ({row.unknown} did not report it)" if row.unknown else ""), measured=row.value))
            continue
        odd_words = "; ".join(f"{value} on {name_list(nodes)}" for value, nodes in row.odd.items())
        status = FAIL if row.field in _UNIFORM_FAIL else WARN
        findings.append(finding(
            "cluster.uniform", row.field, status, f"{row.field} differs: {row.value} on {row.count} nodes; {odd_words}",
            measured=f"{row.value} on {row.count} nodes; {odd_words}", expected="the same on every node",
            source="a job runs at the pace of its slowest node; mixed drivers, firmware or power limits give unequal nodes "
                   "(imbue and AzureHPC health checks require identical versions across the fleet)",
            remedy="`nvidia-smi -q | grep -i -e version -e 'power limit'` on the odd nodes; drain them or ask the provider to "
                   "align them"))
    return findings


# -- nodes that failed or never came ---------------------------------------------------------

def name_list(names: list[str], limit: int = NAMES_SHOWN) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _last_step_words(entry: NodeEntry) -> str:
    """" (last step: X)", unless the reason already says where the node was."""
    if not entry.step or "last step" in (entry.reason or "") or entry.step in (entry.reason or ""):
        return ""
    return f" (last step: {entry.step})"


def _node_state_findings(entries: list[NodeEntry], behind: dict[str, str], others_reached: str | None,
                         start_timeout_s: float | None = None) -> list[Finding]:
    missing = [e for e in entries if e.status == MISSING and not e.unnamed]
    unnamed = [e for e in entries if e.status == MISSING and e.unnamed]
    failed = [e for e in entries if e.status == FAILED]
    findings = [finding("cluster.nodes", f"node:{e.name}", SKIP, f"{e.name} was not vetted to its end: {e.reason}",
                         measured=e.reason, expected="every node finishes its vet and the cross-node tests",
                         remedy="rerun the cluster vet to its end (the stop was not this node's fault)")
                for e in entries if e.status == STOPPED]
    if unnamed:
        came = sum(e.rank is not None for e in entries)
        count = f"{len(unnamed)} node{'' if len(unnamed) == 1 else 's'}"
        findings.append(finding(
            "cluster.nodes", "cluster", FAIL,
            f"{count} never joined (expected {len(entries)}, {came} joined)", measured=unnamed[0].reason,
            expected=f"{len(entries)} nodes (--expect-nodes, --nodes or torchrun's --nnodes)",
            remedy="start gpuvet on every node with the same line (`gpuvet cluster --print-launch`), each within the join "
                   "timeout; give --nodes HOSTLIST to have the missing ones named"))
    for e in missing:
        findings.append(finding("cluster.nodes", f"node:{e.name}", FAIL, f"{e.name} is missing: {e.reason or 'it never joined'}",
                                 measured=e.reason, expected="every node of the job joins",
                                 remedy=f"on {e.name}: is it up, can it reach the master address and port (firewall), did "
                                        "its launcher start? The other nodes' results are complete without it"))
    for e in failed:
        step = _last_step_words(e)
        findings.append(finding("cluster.nodes", f"node:{e.name}", FAIL,
                                 f"{e.name} failed: {e.reason or 'no reason given'}{step}", measured=(e.reason or "") + step,
                                 expected="every node finishes its vet and the cross-node tests",
                                 remedy=f"on {e.name}: `dmesg | tail`, `nvidia-smi`; rerun `gpuvet run` there alone"))
    by_name = {e.name: e for e in entries}
    for name, step in behind.items():
        if name not in by_name or by_name[name].status != OK:
            continue  # already named above
        others = _others_words(others_reached)
        if starting_up(step):  # a busy node starts processes slowly: said, never failed for it
            within = f"within {start_timeout_s:.0f} s" if start_timeout_s else "in time"
            while_others = f" {others}" if others_reached else ""
            findings.append(finding(
                "cluster.nodes", f"node:{name}", WARN, f"{name}: its cross-node ranks did not start {within} (still at "
                f"'{step}'{while_others}): a loaded machine? see `uptime` there; slow, not a fault of its hardware",
                measured=f"last step of its slowest rank: {step}; the other nodes: {others_reached or '?'}",
                expected="every node's ranks start (Python, PyTorch) within the start-up limit (--start-timeout)",
                remedy=f"`uptime` and `top` on {name} (what holds its CPUs); rerun on idle nodes or with a longer "
                       f"--start-timeout; {show_command(by_name[name])}"))
            continue
        findings.append(finding(
            "cluster.nodes", f"node:{name}", FAIL, f"{name} held up the cross-node phase: stuck at {step} {others}",
            measured=f"last step of its slowest rank: {step}; the other nodes: {others_reached or '?'}",
            expected="every node's ranks reach each collective together",
            remedy=f"{show_command(by_name[name])}; there: `dmesg | tail`, `nvidia-smi`; NCCL_DEBUG=INFO shows where a "
                   "collective hangs; rerun without it to vet the others"))
    if not findings:
        findings.append(finding("cluster.nodes", "cluster", PASS, f"all {len(entries)} nodes joined and reported"))
    return findings


def _others_words(reached: str | None) -> str:
    if reached == "finished":
        return "while the others finished"
    return f"while the others reached {reached}" if reached else "while the others went on"


def _node_check_findings(views: list[NodeView]) -> list[Finding]:
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
        findings.append(finding("cluster.node_checks", check, status,
                                 f"{check} {status.upper()} on {len(nodes)} of {reported} nodes ({name_list(nodes)})",
                                 measured=f"e.g. {example}",
                                 remedy=f"each node's stored run shows the evidence and the fix: `gpuvet show RUN` on that node "
                                        f"(RUN: its saved run in the node list), e.g. {show_command(first)}"))
    return findings


# -- cross-node ------------------------------------------------------------------------------

@dataclass
class RingPair:
    src: str
    dst: str
    gbps: float | None  # GB/s, median of the pair's transfers; None: every transfer failed
    error: str | None = None
    transfers: int = 1


def _cross_measurements(measurements: list[Measurement]) -> tuple[Valued | None, Valued | None,
                                                                  list[Measurement], list[Measurement]]:
    busbw = next((m for m in measurements if m.name == ALLREDUCE_BUSBW and has_value(m)), None)
    latency = next((m for m in measurements if m.name == ALLREDUCE_LATENCY and has_value(m)), None)
    ring = [m for m in measurements if m.name == RING]
    notes = [m for m in measurements if m.name == NOTE]
    return busbw, latency, ring, notes


def _network_floor(views: list[NodeView], members: list[str], backend: str) -> tuple[float | None, str, list[str], list[str]]:
    """The slowest member's network for this backend (GB/s, words), the members without RDMA,
    and those with no known link rate."""
    wanted = set(members)
    chosen = [v for v in views if v.name in wanted] or views
    carried = [(v, *(v.network or Network()).carries(backend)) for v in chosen]
    known = [(v, gbs, words) for v, gbs, words in carried if gbs]
    no_rdma = [v.name for v in chosen if v.network and v.network.no_rdma]
    unknown = [v.name for v, gbs, _ in carried if not gbs]
    if not known:
        return None, "", no_rdma, unknown
    slowest, gbs, words = min(known, key=lambda item: item[1])
    return gbs, f"{words} on {slowest.name}", no_rdma, unknown


def _allreduce_finding(views: list[NodeView], busbw: Valued | None, latency: Valued | None,
                       notes: list[Measurement]) -> Finding:
    if busbw is None:
        return _not_measured("cluster.allreduce", notes, "the cross-node all-reduce")
    d = busbw.details
    members = list(d.get("members") or [])
    backend = d.get("backend", "?")
    measured = (f"busbw {busbw.value:.3g} GB/s at {d.get('largest_bytes')} bytes over {len(members) or '?'} nodes x "
                f"{d.get('ranks_per_node', '?')} ranks ({backend})" + (f"; 1 MiB: {latency.value:.0f} us" if latency else ""))
    if d.get("check_ok") is False:
        return finding("cluster.allreduce", "cluster", FAIL,
                        "cross-node all-reduce returned wrong sums: data corrupted between nodes",
                        measured=measured, expected="every rank holds n(n+1)/2",
                        remedy="rerun; then test node pairs (cluster.ring) to find the bad link or NIC")
    floor, words, no_rdma, unknown = _network_floor(views, members, backend)
    if backend == "nccl" and no_rdma:
        return finding("cluster.allreduce", "cluster", WARN,
                        f"cross-node all-reduce {busbw.value:.3g} GB/s over TCP sockets: no active RDMA on {name_list(no_rdma)}",
                        measured=measured, expected="InfiniBand or RoCE ports ACTIVE on every node", source=SEED_SOURCE,
                        remedy="`ibstat`; `NCCL_DEBUG=INFO` prints NET/IB when NCCL uses RDMA, NET/Socket when it does not")
    if floor is None:
        why = f"no NIC link rate known on {name_list(unknown)}" if unknown else "no NIC link rate known"
        # Nothing to compare with is not a pass: the figure is kept, the verdict left open.
        return finding("cluster.allreduce", "cluster", SKIP,
                        f"cross-node all-reduce {busbw.value:.3g} GB/s measured, not judged: {why} to compare with",
                        measured=measured, expected="a known link rate on every node (NIC speed or RDMA port rate)",
                        source=SEED_SOURCE,
                        remedy="`ethtool IFACE` (Speed) and `ibstat` (Rate) on the nodes; cloud VMs often report no speed: "
                               "compare with the instance type's documented network bandwidth, or `gpuvet net` between two nodes")
    share = busbw.value / floor
    if backend == "gloo":
        return _gloo_allreduce(busbw, measured, share, floor, words)
    status = PASS if share >= ALLREDUCE_PASS_SHARE else WARN if share >= ALLREDUCE_WARN_SHARE else FAIL
    return finding("cluster.allreduce", "cluster", status,
                    f"cross-node all-reduce {busbw.value:.3g} GB/s = {100 * share:.0f}% of ~{floor:.3g} GB/s ({words})",
                    measured=measured, expected=f">= {100 * ALLREDUCE_PASS_SHARE:.0f}% of the slowest node's network",
                    source=SEED_SOURCE,
                    remedy=None if status == PASS else "cluster.ring names the slow node or link; `NCCL_DEBUG=INFO` shows "
                                                       "the transport; check MTU and that all nodes sit in one placement group")


def _gloo_allreduce(busbw: Valued, measured: str, share: float, floor: float, words: str) -> Finding:
    """gloo (TCP, one stream per pair, CPU copies) is judged like the ring: nodes against each
    other (cluster.ring), and against the NIC only when far below it."""
    summary = f"cross-node all-reduce {busbw.value:.3g} GB/s over gloo = {100 * share:.0f}% of ~{floor:.3g} GB/s ({words})"
    if share >= GLOO_WARN_SHARE:
        return finding("cluster.allreduce", "cluster", PASS, summary, measured=measured,
                        expected=f">= {100 * GLOO_WARN_SHARE:.0f}% of the slowest NIC over gloo (one TCP stream rarely "
                                 "fills a fast NIC; cluster.ring compares the nodes with each other)",
                        source=SEED_SOURCE)
    return finding("cluster.allreduce", "cluster", WARN, summary + " (far below the NIC even for gloo)",
                    measured=measured, expected=f">= {100 * GLOO_WARN_SHARE:.0f}% of the slowest NIC over gloo",
                    source=SEED_SOURCE,
                    remedy="`iperf3 -c` between two nodes (or `gpuvet net`): near the NIC rate means gloo is the limit, "
                           "far below it means the network; check MTU and `ip -s link` for drops")


def _not_measured(check: str, notes: list[Measurement], what: str) -> Finding:
    note = next((n for n in notes if n.details.get("outcome") in ("failed", "aborted")), notes[0] if notes else None)
    if note is None:
        return finding(check, "cluster", SKIP, f"{what} was not measured")
    reason = note.details.get("reason", "no reason given")
    if note.details.get("outcome") in ("failed", "aborted"):
        return finding(check, "cluster", FAIL, f"{what} failed: {reason}", measured=reason,
                        remedy=_stopped_remedy(note.details))
    return finding(check, "cluster", SKIP, f"{what}: {reason}")


def _stopped_remedy(details: dict[str, Any]) -> str:
    """Who stopped the cross-node phase, by name, and what to do about it."""
    named = list(details.get("nodes") or [])
    behind = details.get("behind") or {}
    if not named:
        return ("no node was behind the others: rerun with NCCL_DEBUG=INFO (where does it hang?) and check the network "
                "between the nodes (`gpuvet net`, `iperf3`); a longer --cross-timeout if the network is just slow")
    where = "; ".join(f"{name} (stuck at {behind[name]})" if name in behind else name for name in named[:NAMES_SHOWN])
    one = len(named) == 1
    return (f"held up by {where}: {'its' if one else 'their'} line in the node list says more; check "
            f"{'it' if one else 'them'} (`dmesg | tail`, `nvidia-smi`, NCCL_DEBUG=INFO), "
            f"or rerun without {'it' if one else 'them'} to measure the others")


def _fallback_findings(fallback: Measurement | None) -> list[Finding]:
    """GPUs were asked for but the nodes met over gloo on their CPUs: the cross-node figures then
    say nothing about NCCL or RDMA, and some nodes have no usable GPU."""
    if fallback is None:
        return []
    without = list(fallback.details.get("without_gpu") or [])
    where = name_list(without) if without else "some nodes"
    return [finding("cluster.fallback", "cluster", WARN,
                     f"cross-node tests ran over gloo on the CPUs, not NCCL on the GPUs: no usable GPU on {where}",
                     measured=f"no usable GPU (torch.cuda) on {where}", expected="every node has a GPU PyTorch can use",
                     source="NCCL needs a GPU on every rank; without one gpuvet measures the network over gloo instead",
                     remedy=f"on {where}: `nvidia-smi`; `python -c 'import torch; print(torch.cuda.is_available())'`; "
                            "or --device cpu to measure over gloo on purpose")]


def ring_pairs(ring: list[Measurement]) -> list[RingPair]:
    """One entry per directed pair: the median of its transfers (a pair drawn in several rounds is
    judged on all of them, so one stall is not a bad link); failed only when every transfer failed."""
    grouped: dict[tuple[str, str], list[Measurement]] = defaultdict(list)
    for m in ring:
        grouped[(str(m.details.get("src")), str(m.details.get("dst")))].append(m)
    pairs = []
    for (src, dst), items in grouped.items():
        values = [m.value for m in items if m.value is not None]
        error = next((m.details.get("error") for m in items if m.value is None), None)
        pairs.append(RingPair(src, dst, statistics.median(values) if values else None, None if values else error, len(items)))
    return pairs


@dataclass
class RingVerdict:
    baseline: float | None
    threshold: float
    slow: list[RingPair]
    suspect_nodes: dict[str, list[RingPair]]  # node -> its slow pairs
    suspect_links: list[RingPair]


def attribute_ring(pairs: list[RingPair]) -> RingVerdict:
    """Slow or failed transfers, blamed on a node when it is slow with every partner while those
    partners are fine with others; otherwise on the one link."""
    values = [p.gbps for p in pairs if p.gbps is not None]
    found = robust_baseline(values, RING_TOLERANCE)
    base, threshold = (found[0], found[1]) if found else (None, RING_TOLERANCE)
    slow = [p for p in pairs if p.gbps is None or (base is not None and _beyond(p.gbps, base, threshold, True))]
    slow_ids = {id(p) for p in slow}
    involved: dict[str, list[RingPair]] = defaultdict(list)
    for p in pairs:
        involved[p.src].append(p)
        involved[p.dst].append(p)

    def has_good_pair(node: str) -> bool:
        return any(id(p) not in slow_ids for p in involved[node])

    suspects: dict[str, list[RingPair]] = {}
    for node, its in involved.items():
        its_slow = [p for p in its if id(p) in slow_ids]
        if len(its) >= 2 and len(its_slow) >= 0.75 * len(its):
            partners = {p.dst if p.src == node else p.src for p in its_slow}
            if any(has_good_pair(partner) for partner in partners):
                suspects[node] = its_slow
    explained = {id(p) for its in suspects.values() for p in its}
    links = [p for p in slow if id(p) not in explained]
    return RingVerdict(base, threshold, slow, suspects, links)


def _pair_words(p: RingPair) -> str:
    return f"{p.src}->{p.dst} " + (f"{p.gbps:.3g} GB/s" if p.gbps is not None else f"failed ({p.error or 'no answer'})")


def _ring_findings(views: list[NodeView], ring: list[Measurement], notes: list[Measurement]) -> list[Finding]:
    if not ring:
        return [_not_measured("cluster.ring", notes, "the node-to-node ring")]
    pairs = ring_pairs(ring)
    verdict = attribute_ring(pairs)
    rounds = len({m.details.get("round") for m in ring})
    base_words = f"median {verdict.baseline:.3g} GB/s per pair" if verdict.baseline else "no transfer completed"
    summary = (f"{len(ring)} node-to-node transfers ({len(pairs)} directed pairs) in {rounds} shuffled "
               f"round{'s' if rounds != 1 else ''}, {base_words}")
    source = ("every node sends to a shuffled partner at once, each round a new ring: a bad node is slow with every "
              "partner, a bad link with one")
    backend = str(ring[0].details.get("backend", "gloo"))
    floor, words, _, _ = _network_floor(views, [p.src for p in pairs], backend)
    expected = f">= {100 * (1 - verdict.threshold):.0f}% of the cluster's typical transfer"
    findings = []
    if floor and verdict.baseline:
        share = verdict.baseline / floor
        summary += f" ({100 * share:.0f}% of ~{floor:.3g} GB/s, {words})"
        # NCCL ranks send rail to rail, every NIC at once: a pair should come near the node's
        # network. gloo's one TCP stream rarely fills a fast NIC, so it is not held to that.
        if backend == "nccl" and share < ALLREDUCE_WARN_SHARE:
            findings.append(finding("cluster.ring", "cluster", WARN, f"every node pair is slow: {summary}", measured=summary,
                                     expected=f">= {100 * ALLREDUCE_WARN_SHARE:.0f}% of the slowest node's network", source=source,
                                     remedy="`NCCL_DEBUG=INFO` (NET/IB or NET/Socket?); `ibstat`; GPUDirect RDMA "
                                            "(`lsmod | grep peermem`); NCCL_IB_HCA"))
    if not verdict.slow:
        return findings or [finding("cluster.ring", "cluster", PASS, summary, measured=summary, source=source)]
    for node, its in sorted(verdict.suspect_nodes.items()):
        failed = any(p.gbps is None for p in its)
        findings.append(finding(
            "cluster.ring", f"node:{node}", FAIL if failed or _much_slower(its, verdict) else WARN,
            f"{node} is slow with every partner: {len(its)} of its transfers slow or failed "
            f"({'; '.join(_pair_words(p) for p in its[:4])})",
            measured="; ".join(_pair_words(p) for p in its), expected=f"{expected} ({base_words})", source=source,
            remedy=f"on {node}: `ip -s link` (errors, drops), `ethtool <nic>` (speed), `ibstat`; compare MTU with the others"))
    for p in verdict.suspect_links:
        findings.append(finding(
            "cluster.ring", f"link:{p.src}->{p.dst}", FAIL if p.gbps is None or _much_slower([p], verdict) else WARN,
            f"slow link {_pair_words(p)} while both nodes are fine with other partners" if (p.src not in verdict.suspect_nodes)
            else f"slow link {_pair_words(p)}",
            measured=_pair_words(p), expected=f"{expected} ({base_words})", source=source,
            remedy=f"between {p.src} and {p.dst}: `iperf3 -c` both ways; a switch port, cable or route between them"))
    return findings


def _much_slower(pairs: list[RingPair], verdict: RingVerdict) -> bool:
    base = verdict.baseline
    return base is not None and any(p.gbps is not None and p.gbps < base * (1 - 2 * verdict.threshold) for p in pairs)


# -- the whole judgement ---------------------------------------------------------------------

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


@dataclass
class ClusterJudgement:
    findings: list[Finding]
    rows: list[NodeRow]  # worst first
    baselines: list[Baseline]
    stragglers: list[Straggler]
    uniformity: list[UniformityRow]
    ring: RingVerdict | None


_BADGE_ORDER = {"MISSING": 0, "FAILED": 1, "FAIL": 2, "STOPPED": 3, "WARN": 3, "PASS": 4}


def judge_cluster(entries: list[NodeEntry], measurements: list[Measurement] | None = None,
                  options: dict[str, Any] | None = None) -> ClusterJudgement:
    options = options or {}
    measurements = list(measurements or [])
    views = [node_view(e, i) for i, e in enumerate(entries)]
    baselines, stragglers = find_stragglers(views, options.get("tolerance"))
    uniformity = check_uniformity(views)
    busbw, latency, ring, notes = _cross_measurements(measurements)
    fallback = next((m for m in measurements if m.name == FALLBACK), None)
    ring_verdict = attribute_ring(ring_pairs(ring)) if ring else None
    behind, others_reached = _behind(notes)
    start_timeout_s = next((n.details["start_timeout_s"] for n in notes if n.details.get("start_timeout_s")), None)
    findings = (_stopped_findings(options.get("stopped"))
                + _node_state_findings(entries, behind, others_reached, start_timeout_s)
                + _straggler_findings(views, baselines, stragglers)
                + _uniformity_findings(uniformity) + _node_check_findings(views) + _fallback_findings(fallback)
                + [_allreduce_finding(views, busbw, latency, notes)] + _ring_findings(views, ring, notes))
    rows = node_rows(views, stragglers, ring_verdict, uniformity, behind, others_reached)
    return ClusterJudgement(findings, rows, baselines, stragglers, uniformity, ring_verdict)


def _stopped_findings(stopped: str | None) -> list[Finding]:
    if not stopped:
        return []
    return [finding("cluster.run", "cluster", FAIL, f"the run was stopped before its end ({stopped}): this report holds "
                     "what was gathered by then", measured=stopped, expected="the run ends by itself",
                     remedy="if torchrun's log says 'Detected N new nodes ... will restart worker group', a node joined "
                            "late: start every node at once with the line from `gpuvet cluster --print-launch`, and rerun")]


# A cross-node rank's steps before its measurements (cluster/cross_rank.py takes them): starting
# its Python, importing torch, waiting in the store for the other ranks to do the same. They have
# their own limit (--start-timeout); the measurements' deadline runs from the end of them, so a
# rank stuck later (a collective) is held up, not slow.
IMPORTING_TORCH = "importing torch"
WAITING_FOR_RANKS = "waiting for every rank to start"
START_UP_STEPS = ("starting Python", "starting", IMPORTING_TORCH, WAITING_FOR_RANKS)


def starting_up(step: str | None) -> bool:
    """Still starting its process: slow there is a loaded machine, not a broken one."""
    return (step or "starting") in START_UP_STEPS


def _behind(notes: list[Measurement]) -> tuple[dict[str, str], str | None]:
    """The nodes that held up the cross-node phase (name -> the step they stopped at), from the note."""
    for note in notes:
        if note.details.get("behind"):
            return dict(note.details["behind"]), note.details.get("others_reached")
    return {}, None


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
        during = f" (during {entry.step})" if _last_step_words(entry) else ""
        headlines.append(f"failed: {entry.reason or 'no reason given'}{during}")
    if evidence.behind and starting_up(evidence.behind):  # a loaded node: slow to start, not broken
        statuses.append(WARN)
        headlines.append(f"its cross-node ranks did not start in time (still at {evidence.behind}; a loaded machine?)")
    elif evidence.behind:
        statuses.append(FAIL)
        headlines.append(f"held up the cross-node phase: stuck at {evidence.behind} {_others_words(others_reached)}")
    straggler = evidence.straggler
    if straggler:
        statuses.append(straggler.status)
        paces.append(straggler.share)
        where = f"{straggler.subject} " if straggler.subject and _scope(straggler.subject) == "gpu" else ""
        headlines.append(f"straggler: {where}{METRICS[straggler.metric].label} {_fmt(straggler.value)} {straggler.unit} "
                         f"= {100 * straggler.share:.0f}% of {_fmt(straggler.baseline)}")
    if evidence.ring_slow:
        statuses.append(WARN)
        paces.append(evidence.ring_share or 0.0)
        headlines.append(f"slow with every ring partner ({len(evidence.ring_slow)} transfers, "
                         f"{100 * (evidence.ring_share or 0.0):.0f}% of the typical pair)")
    for name, value, majority in evidence.odd:
        statuses.append(FAIL if name in _UNIFORM_FAIL else WARN)
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


def natural_key(name: str) -> tuple:
    """node2 before node10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


