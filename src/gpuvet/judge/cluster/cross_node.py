"""The cross-node measurements: all-reduce bus bandwidth against the slowest node's network, the
shuffled ring of node-to-node transfers and whom its slow pairs point at, the gloo fallback."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ...catalog import checked
from ...record import FAIL, PASS, SKIP, WARN, Finding, Measurement, Valued, has_value
from ..common import finding
from .nodes import ALLREDUCE_BUSBW, ALLREDUCE_LATENCY, ALLREDUCE_PASS_SHARE, ALLREDUCE_WARN_SHARE, GLOO_WARN_SHARE, NAMES_SHOWN, NOTE, RING, RING_TOLERANCE, SEED_SOURCE, name_list, Network, NodeView
from .per_node import beyond, robust_baseline

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
CLUSTER_ALLREDUCE = checked("cluster.allreduce")
CLUSTER_FALLBACK = checked("cluster.fallback")
CLUSTER_RING = checked("cluster.ring")


# -- cross-node ------------------------------------------------------------------------------

@dataclass
class RingPair:
    src: str
    dst: str
    gbps: float | None  # GB/s, median of the pair's transfers; None: every transfer failed
    error: str | None = None
    transfers: int = 1


def cross_measurements(measurements: list[Measurement]) -> tuple[Valued | None, Valued | None,
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


def allreduce_finding(views: list[NodeView], busbw: Valued | None, latency: Valued | None,
                       notes: list[Measurement]) -> Finding:
    if busbw is None:
        return _not_measured(CLUSTER_ALLREDUCE, notes, "the cross-node all-reduce")
    d = busbw.details
    members = list(d.get("members") or [])
    backend = d.get("backend", "?")
    measured = (f"busbw {busbw.value:.3g} GB/s at {d.get('largest_bytes')} bytes over {len(members) or '?'} nodes x "
                f"{d.get('ranks_per_node', '?')} ranks ({backend})" + (f"; 1 MiB: {latency.value:.0f} us" if latency else ""))
    if d.get("check_ok") is False:
        return finding(CLUSTER_ALLREDUCE, "cluster", FAIL,
                        "cross-node all-reduce returned wrong sums: data corrupted between nodes",
                        measured=measured, expected="every rank holds n(n+1)/2",
                        remedy="rerun; then test node pairs (cluster.ring) to find the bad link or NIC")
    floor, words, no_rdma, unknown = _network_floor(views, members, backend)
    if backend == "nccl" and no_rdma:
        return finding(CLUSTER_ALLREDUCE, "cluster", WARN,
                        f"cross-node all-reduce {busbw.value:.3g} GB/s over TCP sockets: no active RDMA on {name_list(no_rdma)}",
                        measured=measured, expected="InfiniBand or RoCE ports ACTIVE on every node", source=SEED_SOURCE,
                        remedy="`ibstat`; `NCCL_DEBUG=INFO` prints NET/IB when NCCL uses RDMA, NET/Socket when it does not")
    if floor is None:
        why = f"no NIC link rate known on {name_list(unknown)}" if unknown else "no NIC link rate known"
        # Nothing to compare with is not a pass: the figure is kept, the verdict left open.
        return finding(CLUSTER_ALLREDUCE, "cluster", SKIP,
                        f"cross-node all-reduce {busbw.value:.3g} GB/s measured, not judged: {why} to compare with",
                        measured=measured, expected="a known link rate on every node (NIC speed or RDMA port rate)",
                        source=SEED_SOURCE,
                        remedy="`ethtool IFACE` (Speed) and `ibstat` (Rate) on the nodes; cloud VMs often report no speed: "
                               "compare with the instance type's documented network bandwidth, or `gpuvet net` between two nodes")
    share = busbw.value / floor
    if backend == "gloo":
        return _gloo_allreduce(busbw, measured, share, floor, words)
    status = PASS if share >= ALLREDUCE_PASS_SHARE else WARN if share >= ALLREDUCE_WARN_SHARE else FAIL
    return finding(CLUSTER_ALLREDUCE, "cluster", status,
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
        return finding(CLUSTER_ALLREDUCE, "cluster", PASS, summary, measured=measured,
                        expected=f">= {100 * GLOO_WARN_SHARE:.0f}% of the slowest NIC over gloo (one TCP stream rarely "
                                 "fills a fast NIC; cluster.ring compares the nodes with each other)",
                        source=SEED_SOURCE)
    return finding(CLUSTER_ALLREDUCE, "cluster", WARN, summary + " (far below the NIC even for gloo)",
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


def fallback_findings(fallback: Measurement | None) -> list[Finding]:
    """GPUs were asked for but the nodes met over gloo on their CPUs: the cross-node figures then
    say nothing about NCCL or RDMA, and some nodes have no usable GPU."""
    if fallback is None:
        return []
    without = list(fallback.details.get("without_gpu") or [])
    where = name_list(without) if without else "some nodes"
    return [finding(CLUSTER_FALLBACK, "cluster", WARN,
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
    slow = [p for p in pairs if p.gbps is None or (base is not None and beyond(p.gbps, base, threshold, True))]
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


def ring_findings(views: list[NodeView], ring: list[Measurement], notes: list[Measurement]) -> list[Finding]:
    if not ring:
        return [_not_measured(CLUSTER_RING, notes, "the node-to-node ring")]
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
            findings.append(finding(CLUSTER_RING, "cluster", WARN, f"every node pair is slow: {summary}", measured=summary,
                                     expected=f">= {100 * ALLREDUCE_WARN_SHARE:.0f}% of the slowest node's network", source=source,
                                     remedy="`NCCL_DEBUG=INFO` (NET/IB or NET/Socket?); `ibstat`; GPUDirect RDMA "
                                            "(`lsmod | grep peermem`); NCCL_IB_HCA"))
    if not verdict.slow:
        return findings or [finding(CLUSTER_RING, "cluster", PASS, summary, measured=summary, source=source)]
    for node, its in sorted(verdict.suspect_nodes.items()):
        failed = any(p.gbps is None for p in its)
        findings.append(finding(
            CLUSTER_RING, f"node:{node}", FAIL if failed or _much_slower(its, verdict) else WARN,
            f"{node} is slow with every partner: {len(its)} of its transfers slow or failed "
            f"({'; '.join(_pair_words(p) for p in its[:4])})",
            measured="; ".join(_pair_words(p) for p in its), expected=f"{expected} ({base_words})", source=source,
            remedy=f"on {node}: `ip -s link` (errors, drops), `ethtool <nic>` (speed), `ibstat`; compare MTU with the others"))
    for p in verdict.suspect_links:
        findings.append(finding(
            CLUSTER_RING, f"link:{p.src}->{p.dst}", FAIL if p.gbps is None or _much_slower([p], verdict) else WARN,
            f"slow link {_pair_words(p)} while both nodes are fine with other partners" if (p.src not in verdict.suspect_nodes)
            else f"slow link {_pair_words(p)}",
            measured=_pair_words(p), expected=f"{expected} ({base_words})", source=source,
            remedy=f"between {p.src} and {p.dst}: `iperf3 -c` both ways; a switch port, cable or route between them"))
    return findings


def _much_slower(pairs: list[RingPair], verdict: RingVerdict) -> bool:
    base = verdict.baseline
    return base is not None and any(p.gbps is not None and p.gbps < base * (1 - 2 * verdict.threshold) for p in pairs)
