"""A cluster's nodes as the judgement reads them: the entries each node sent, the few fields of
their run records the rules need (GPUs, PCIe link, uniformity facts, network), and the names and
steps the cluster code shares."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from ...catalog import checked
from ...facts import Gpu, PcieLink, from_dict
from ...record import FAIL, WARN
from ...specs.cluster_metrics import METRICS, Metric  # noqa: F401 (the cluster's figures: specs, so the report reads them too)
from ..gpu_links import link_state

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
CLUSTER_FALLBACK = checked("cluster.fallback")
CLUSTER_RING = checked("cluster.ring")


# Node states. STOPPED: joined, then the run was stopped (Ctrl-C, --timeout, a signal) before it was
# ready: not vetted to its end, and not its fault.
OK, FAILED, MISSING, STOPPED = "ok", "failed", "missing", "stopped"
UNNAMED_PREFIX = "(unnamed) #"  # a node expected (by count) that never joined, and no list names it


# Measurement names of the cross-node phase.
ALLREDUCE_BUSBW = "cluster.allreduce.busbw"
ALLREDUCE_LATENCY = "cluster.allreduce.latency_1mb"
RING = CLUSTER_RING
NOTE = "bench.cluster"
FALLBACK = CLUSTER_FALLBACK  # the meeting ran over gloo on the CPUs although GPUs were asked for


MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution x this = its standard deviation
NOISE_SIGMAS = 3.0
MIN_FOR_SPREAD = 5  # values needed before their spread may widen the threshold
RING_TOLERANCE = 0.25  # node-to-node TCP/RDMA transfers vary more than GPU kernels
ALLREDUCE_PASS_SHARE, ALLREDUCE_WARN_SHARE = 0.6, 0.35  # as gpu.allreduce inside one machine
# gloo moves data over one TCP stream per pair, which rarely fills a fast NIC: below this share of
# the slowest node's NIC it is worth a look, above it nothing can be concluded from the NIC.
GLOO_WARN_SHARE = 0.05
NAMES_SHOWN = 8
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


def show_command(entry: NodeEntry) -> str:
    """The command that prints a node's own stored run, on that node (each node keeps its own store)."""
    if entry.saved_run is None:
        return f"`gpuvet run` on {entry.name} (its run was not saved)"
    return f"`gpuvet show {entry.saved_run}` on {entry.name}"


# -- nodes that failed or never came ---------------------------------------------------------

def name_list(names: list[str], limit: int = NAMES_SHOWN) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


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


def natural_key(name: str) -> tuple:
    """node2 before node10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))
