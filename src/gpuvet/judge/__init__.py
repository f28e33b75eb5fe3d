"""Judge: pure functions from facts + measurements + reference figures to findings.

Nothing here touches the machine, so a record captured anywhere can be judged (again) anywhere.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Callable

from ..catalog import checked
from .. import catalog
from ..specs import reference
from ..facts import Machine
from ..record import MEASURED, PASS, SKIP, Finding, Measurement
from . import bench_common
from .common import Context, finding, settled_action

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
GPU_MODEL = checked("gpu.model")

Rule = Callable[[Context], list[Finding]]

def rule_of(check: catalog.Check) -> Rule:
    """The function the catalogue names as the check's rule."""
    module, _, name = check.rule.partition(".")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def _rules(checks: list[catalog.Check]) -> dict[str, Rule]:
    rules: dict[str, Rule] = {}
    for check in checks:
        if check.rule not in (catalog.BY_ID[key].rule for key in rules):
            rules[check.id] = rule_of(check)
    return rules


# Check id -> rule, in the catalogue's order (the order a report lists them), one entry per rule:
# a rule that makes several ids (net.*, env.*, storage.*) is keyed by the first of them. Made from
# the catalogue, where each check names its rule as "module.function" of this package.
RULES: dict[str, Rule] = _rules([c for c in catalog.CHECKS if catalog.RUN in c.levels])

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


# `gpuvet health`: the passive checks that hold on a busy node (the catalogue marks them), then its own.
HEALTH_RULES: dict[str, Rule] = {c.id: rule_of(c) for c in catalog.CHECKS if catalog.HEALTH in c.levels}


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
    wanted = [c for name in names for c in BENCH_CHECKS.get(name, ())] + ([GPU_MODEL] if expect else [])
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
        f.action = settled_action(f.check, f.status, f.action)
    return f


def annotate_references(machine: Machine) -> None:
    """Record which reference row each GPU matched (`machine.gpus[i].reference`)."""
    for gpu in machine.gpus:
        ref = reference.match(gpu.name, gpu.memory_total_mib)
        gpu.reference = ref.id if ref else None
