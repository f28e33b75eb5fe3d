"""The figures a multi-node run compares across its nodes, with their labels and the straggler
tolerance of each: reference data the cluster's judge applies and its report plots by."""

from __future__ import annotations

from dataclasses import dataclass


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
