"""Judge: pure functions from facts + measurements + reference figures to findings.

Nothing here touches the machine, so a record captured anywhere can be judged (again) anywhere.
"""

from __future__ import annotations

from typing import Any, Callable

from ..facts import Machine
from ..record import SKIP, Finding, Measurement
from . import gpu_health, gpu_identity, gpu_links, gpu_power, host, reference, stack
from .common import Context, finding

Rule = Callable[[Context], list[Finding]]

# Check id -> rule, in the order a report lists them. Ids are stable: scripts depend on them.
RULES: dict[str, Rule] = {
    "gpu.model": gpu_identity.check_model,
    "gpu.uniform": gpu_identity.check_uniform,
    "gpu.isolation": gpu_health.check_isolation,
    "gpu.power_limit": gpu_power.check_power_limit,
    "gpu.pcie_link": gpu_links.check_pcie_link,
    "gpu.nvlink": gpu_links.check_nvlink,
    "gpu.throttle": gpu_power.check_throttle,
    "gpu.temperature": gpu_power.check_temperature,
    "gpu.ecc": gpu_health.check_ecc,
    "stack.driver_cuda": stack.check_driver_cuda,
    "stack.arch_support": stack.check_arch_support,
    "host.cpu": host.check_cpu,
    "host.shm": host.check_shm,
    "host.steal": host.check_steal,
    "host.somaxconn": host.check_somaxconn,
    "storage.workdir": host.check_workdir,
}

_PER_GPU = {check for check in RULES if check.startswith("gpu.") and check != "gpu.uniform"}


def judge(machine: Machine, measurements: list[Measurement] | None = None, options: dict[str, Any] | None = None) -> list[Finding]:
    ctx = Context(machine, list(measurements or []), dict(options or {}))
    findings: list[Finding] = []
    for check, rule in RULES.items():
        findings += _run(check, rule, ctx)
    return findings


def _run(check: str, rule: Rule, ctx: Context) -> list[Finding]:
    if check in _PER_GPU and not ctx.machine.gpus:
        return [finding(check, "gpu", SKIP, f"no GPU facts: {ctx.machine.gpu_error or 'no NVIDIA GPU found'}")]
    try:
        return rule(ctx)
    except Exception as err:  # one broken rule must not stop the others
        return [finding(check, "machine", SKIP, f"this check crashed ({type(err).__name__}: {err}); please report it")]


def annotate_references(machine: Machine) -> None:
    """Record which reference row each GPU matched (`machine.gpus[i].reference`)."""
    for gpu in machine.gpus:
        ref = reference.match(gpu.name)
        gpu.reference = ref.id if ref else None
