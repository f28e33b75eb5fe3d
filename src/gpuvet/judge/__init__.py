"""Judge: pure functions from facts + measurements + reference figures to findings.

Nothing here touches the machine, so a record captured anywhere can be judged (again) anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

from .. import catalog
from ..specs import reference
from ..facts import Machine
from ..record import MEASURED, PASS, SKIP, Finding, Measurement
from . import (
    bench_common,
    cpu_bench,
    env,
    feed,
    gpu_bench,
    gpu_health,
    gpu_identity,
    gpu_links,
    gpu_multi,
    gpu_pcie,
    gpu_power,
    gpu_signals,
    gpu_sustained,
    gpu_xid,
    gpu_trend,
    health,
    host,
    host_io,
    stack,
    stack_runtime,
    workload,
)
from .common import Context, finding

Rule = Callable[[Context], list[Finding]]

# Check id -> rule, in the order a report lists them. Ids are stable: scripts depend on them.
RULES: dict[str, Rule] = {
    "gpu.model": gpu_identity.check_model,
    "gpu.uniform": gpu_identity.check_uniform,
    "gpu.isolation": gpu_health.check_isolation,
    "gpu.power_limit": gpu_power.check_power_limit,
    "gpu.pcie_link": gpu_links.check_pcie_link,
    "gpu.pcie_under_load": gpu_pcie.check_pcie_under_load,
    "gpu.pcie_driver_view": gpu_pcie.check_pcie_driver_view,
    "gpu.nvlink": gpu_links.check_nvlink,
    "gpu.throttle": gpu_power.check_throttle,
    "gpu.temperature": gpu_power.check_temperature,
    "gpu.ecc": gpu_health.check_ecc,
    "gpu.xid": gpu_xid.check_xid,  # the kernel log since boot (live, or a dmesg/journalctl capture)
    "gpu.link_errors": gpu_signals.check_link_errors,
    "gpu.fabric": gpu_signals.check_fabric,
    "gpu.recovery": gpu_signals.check_recovery,
    "gpu.throttle_history": gpu_signals.check_throttle_history,
    "gpu.persistence": gpu_signals.check_persistence,
    "gpu.trend": gpu_trend.check_trend,  # monitoring loops given to `inspect` (dmon, --query-gpu -l)
    # Benchmarks: only when the run planned them (record.options["benchmarks"]).
    "gpu.gemm": gpu_bench.check_gemm,
    "gpu.correctness": gpu_bench.check_correctness,
    "gpu.memory_bandwidth": gpu_bench.check_memory_bandwidth,
    "gpu.pcie_bandwidth": gpu_bench.check_pcie_bandwidth,
    "gpu.context_init": gpu_bench.check_context_init,
    "gpu.kernel_launch": gpu_bench.check_kernel_launch,
    "gpu.sustained": gpu_sustained.check_sustained,
    "gpu.p2p": gpu_multi.check_p2p,
    "gpu.allreduce": gpu_multi.check_allreduce,
    "cpu.benchmarks": cpu_bench.check_cpu_benchmarks,
    "workload.throughput": workload.check_throughput,
    "workload.checkpoint": workload.check_checkpoint,
    "workload.resume": workload.check_resume,
    "stack.driver_cuda": stack.check_driver_cuda,
    "stack.arch_support": stack.check_arch_support,
    "stack.peermem": stack_runtime.check_peermem,
    "stack.nccl": stack_runtime.check_nccl,
    "stack.container_runtime": stack_runtime.check_container_runtime,
    "stack.toolkit": stack.check_toolkit,
    "host.cpu": host.check_cpu,
    "host.shm": host.check_shm,
    "host.steal": host.check_steal,
    "host.somaxconn": host.check_somaxconn,
    "host.preemptible": host.check_preemptible,
    "storage.workdir": host.check_workdir,
    "storage.persistence": host.check_persistence,
    "storage.io": host_io.check_storage,  # storage.write / read / random_read / small_files per path
    "storage.shared": host_io.check_shared_storage,
    "net": host_io.check_network,  # net.loopback, net.nics, net.rdma, net.node_to_node
    "host.cpu_feed": feed.check_cpu_feed,
    "env.audit": env.check_environment,  # env.exposed_servers, env.ssh_login, ... (gpuvet run only)
}

# Checks that need GPU facts; without any GPU they skip once, saying why. The benchmark checks
# explain their own absence (bench.<name> notes), so they are not in this set.
_PER_GPU = catalog.PER_GPU_CHECKS


def judge(machine: Machine, measurements: list[Measurement] | None = None,
          options: Mapping[str, Any] | None = None) -> list[Finding]:
    ctx = Context(machine, list(measurements or []), dict(options or {}))
    findings: list[Finding] = []
    for check, rule in RULES.items():
        findings += _run(check, rule, ctx)
    return findings


# `gpuvet health`: the passive checks that hold on a busy node, then its own two.
HEALTH_RULES: dict[str, Rule] = {**{check: RULES[check] for check in health.HEALTH_CHECKS},
                                 "gpu.reachable": health.check_reachable, "health.probe": health.check_probes}


def judge_health(machine: Machine, options: Mapping[str, Any] | None = None) -> list[Finding]:
    """The findings of `gpuvet health` (no measurements: it never loads the GPUs)."""
    ctx = Context(machine, [], dict(options or {}))
    left_out = set(ctx.options.get("skip") or ())  # `gpuvet health --skip CHECK`: an admin's choice, said once
    findings: list[Finding] = []
    for check, rule in HEALTH_RULES.items():
        if check in left_out:
            findings.append(finding(check, "machine", SKIP, "left out of this health check (--skip)"))
        else:
            findings += _run(check, rule, ctx)
    return findings


# GPU benchmark checks -> the benchmark that feeds them.
_BENCH_OF = {c.id: c.benchmark for c in catalog.CHECKS if c.area == "gpu" and c.benchmark}


# `gpuvet bench NAME`: the checks each benchmark decides; the facts, host and security audit are
# `gpuvet run`'s.
BENCH_CHECKS: dict[str, tuple[str, ...]] = {name: catalog.fed_by(name) for name in catalog.ALL_BENCHMARKS}


def of_benchmarks(findings: list[Finding], names: list[str], expect: bool = False) -> list[Finding]:
    """The findings the benchmarks `names` decide (and gpu.model when the user named the model
    they paid for), in report order."""
    wanted = [c for name in names for c in BENCH_CHECKS.get(name, ())] + (["gpu.model"] if expect else [])
    return [f for f in findings if f.check in wanted]


def _run(check: str, rule: Rule, ctx: Context) -> list[Finding]:
    if check in _PER_GPU and not ctx.machine.gpus:
        return [finding(check, "gpu", SKIP, f"no GPU facts: {ctx.machine.gpu_error or 'no NVIDIA GPU found'}")]
    bench = _BENCH_OF.get(check)
    if bench and ctx.options.get("device") == "cpu":
        return []  # CPU runs are reported by cpu.<benchmark>
    if bench and not ctx.machine.gpus and bench_common.planned(ctx, bench):
        return [bench_common.not_measured(ctx, bench, check, "gpu")]
    try:
        return [_judged_or_measured(f) for f in rule(ctx)]
    except Exception as err:  # one broken rule must not stop the others
        return [finding(check, "machine", SKIP, f"this check crashed ({type(err).__name__}: {err}); please report it")]


def _judged_or_measured(f: Finding) -> Finding:
    """A PASS claims a measured value against an expectation with its source; a rule's PASS
    without them judged nothing, and says so ("measured, not judged") instead of passing."""
    e = f.evidence
    if f.status == PASS and not (e.measured and e.expected and e.source):
        f.status = MEASURED
        f.summary += " (no expectation to judge it against: measured, not judged)"
    return f


def annotate_references(machine: Machine) -> None:
    """Record which reference row each GPU matched (`machine.gpus[i].reference`)."""
    for gpu in machine.gpus:
        ref = reference.match(gpu.name, gpu.memory_total_mib)
        gpu.reference = ref.id if ref else None
