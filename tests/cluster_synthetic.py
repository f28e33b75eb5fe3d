"""SYNTHETIC clusters for the cluster judgement's tests and benchmarks/cluster_scale.py (which runs
without pytest): every node is the real record `gpuvet inspect` makes of the 8x H100 capture
(tests/fixtures/smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt), with invented benchmark
figures, network facts and faults added: no machine here has eight GPUs, let alone 1,000 nodes."""

from __future__ import annotations

import random
from pathlib import Path

from gpuvet import runner
from gpuvet.judge.cluster import ALLREDUCE_BUSBW, ALLREDUCE_LATENCY, RING, NodeEntry
from gpuvet.record import Measurement

CAPTURE = Path(__file__).parent / "fixtures" / "smi_text" / "q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"

# Typical figures of a healthy H100 SXM node (invented around published ones) and their noise.
HEALTHY = {"gemm.bf16": (760.0, "TFLOPS", 0.015), "membw.copy": (2900.0, "GB/s", 0.01),
           "pcie.h2d_pinned": (52.0, "GB/s", 0.02), "latency.kernel_launch": (4.5, "us", 0.05)}
RING_GBS = 360.0  # per node pair, rail to rail over 8 x 400 Gb/s (400 GB/s) at 90%; invented


def template_record() -> dict:
    """The record `gpuvet inspect CAPTURE --out FILE` writes."""
    return runner.inspect([str(CAPTURE)]).to_dict()


def _host(rdma_state: str = "ACTIVE") -> dict:
    return {"hostname": None, "nics": [{"name": "eth0", "speed_mbps": 100000, "operstate": "up", "virtual": False}],
            "rdma": [{"device": f"mlx5_{i}", "port": 1, "state": rdma_state, "rate_gbps": 400.0, "link_layer": "InfiniBand"}
                     for i in range(8)]}


def synthetic_cluster(nodes: int, seed: int = 7, template: dict | None = None) -> tuple[list[NodeEntry], list[Measurement], dict]:
    """`nodes` SYNTHETIC 8-GPU nodes named node-0000... with these faults (when the cluster is big
    enough to hold them): node-0017 gpu3 at 62% bf16 GEMM; node-0333 gpu5 at 70% memory copy;
    node-0500 power-capped to 500 W (every GPU at 86% GEMM); node-0900 on another driver;
    node-0777 without active RDMA; node-0042 with a slow NIC (every ring transfer at 1/8);
    the link node-0100 -> node-0101 slow. Returns the nodes, the cross-node measurements and the
    faults actually planted."""
    rng = random.Random(seed)
    template = template or template_record()
    names = [f"node-{i:04d}" for i in range(nodes)]
    faults = {name: fault for name, fault in (("node-0017", "gpu3 gemm"), ("node-0333", "gpu5 membw"), ("node-0500", "power cap"),
                                              ("node-0900", "driver"), ("node-0777", "no rdma"), ("node-0042", "slow nic"))
              if name in set(names)}
    entries = [NodeEntry(name, rank, record=_node_record(template, name, faults.get(name), rng))
               for rank, name in enumerate(names)]
    return entries, _cross(names, faults, rng), faults


def _node_record(template: dict, name: str, fault: str | None, rng: random.Random) -> dict:
    # Shallow copies: nodes share the template's unchanged parts (the judge never mutates them),
    # so 5,000 nodes build in a second.
    record = dict(template)
    machine = dict(template["machine"])
    machine["host"] = _host("DOWN" if fault == "no rdma" else "ACTIVE")
    if fault == "driver":
        machine["driver"] = {**machine["driver"], "version": "550.54.15"}
    if fault == "power cap":
        machine["gpus"] = [{**g, "power": {**g["power"], "enforced_limit_w": 500.0, "limit_w": 500.0}} for g in machine["gpus"]]
    record["machine"] = machine
    record["options"] = {"benchmarks": ["gemm", "membw", "pcie", "latency"], "synthetic": "invented figures"}
    measurements = []
    for gpu in range(8):
        for metric, (typical, unit, noise) in HEALTHY.items():
            value = typical * (1 + rng.gauss(0, noise))
            if fault == "gpu3 gemm" and gpu == 3 and metric == "gemm.bf16":
                value = typical * 0.62
            if fault == "gpu5 membw" and gpu == 5 and metric == "membw.copy":
                value = typical * 0.70
            if fault == "power cap" and metric == "gemm.bf16":
                value = typical * 0.86
            measurements.append({"name": metric, "value": value, "unit": unit, "subject": f"gpu{gpu}", "details": {}})
    record["measurements"] = measurements
    return record


def _cross(names: list[str], faults: dict[str, str], rng: random.Random) -> list[Measurement]:
    index = {n: i for i, n in enumerate(names)}
    rounds = []
    for _ in range(3):
        order = list(range(len(names)))
        rng.shuffle(order)
        rounds.append(order)
    if "node-0101" in index:  # round 0 holds the bad link: node-0100 sends to node-0101
        order = [i for i in rounds[0] if i not in (index["node-0100"], index["node-0101"])]
        rounds[0] = [index["node-0100"], index["node-0101"], *order]
    measurements = []
    for number, order in enumerate(rounds):
        for position, src in enumerate(order):
            dst = order[(position + 1) % len(order)]
            gbps = RING_GBS * (1 + rng.gauss(0, 0.03))
            if "slow nic" in (faults.get(names[src]), faults.get(names[dst])):
                gbps = RING_GBS / 8
            if (names[src], names[dst]) == ("node-0100", "node-0101"):
                gbps = RING_GBS / 4
            measurements.append(Measurement(RING, gbps, "GB/s", f"{names[src]}->{names[dst]}",
                                            {"src": names[src], "dst": names[dst], "round": number, "backend": "nccl"}))
    common = {"members": names, "ranks_per_node": 8, "world_size": 8 * len(names), "backend": "nccl"}
    sizes = [{"bytes": 1 << 20, "time_us": 80.0, "algbw_gbps": 13.1, "busbw_gbps": 26.2, "iterations": 50, "wrong": 0},
             {"bytes": 1 << 30, "time_us": 3.0e3, "algbw_gbps": 179.0, "busbw_gbps": 330.0, "iterations": 20, "wrong": 0}]
    measurements.append(Measurement(ALLREDUCE_LATENCY, 80.0, "us", "cluster", {"bytes": 1 << 20, **common}))
    measurements.append(Measurement(ALLREDUCE_BUSBW, 330.0, "GB/s", "cluster",
                                    {"largest_bytes": 1 << 30, "sizes": sizes, "check_ok": True, **common}))
    return measurements


