"""`gpuvet health`: the checks only a fleet health check needs (are
all the GPUs still answering; did a probe hang), and what the whole answer is for a scheduler:
healthy, a problem, or could not tell (node-problem-detector's OK / NonOK / Unknown)."""

from __future__ import annotations

from ..catalog import checked
from ..facts import Gpu, Machine
from ..record import Finding
from ..record.verdict import EXIT_CODES, HEALTHY, PROBLEM, UNKNOWN  # noqa: F401 (health's answer: its words live in record)
from .common import FAIL, PASS, SKIP, Context, finding, subject

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
GPU_REACHABLE = checked("gpu.reachable")
HEALTH_PROBE = checked("health.probe")


# Probes whose hang means the GPU or its driver is stuck (NVML blocks in the kernel on a GPU
# that fell off the bus); a cut probe of anything else only means that part was not read.
_GPU_PROBES = ("gpu",)
_LOST = "fallen off the bus"


def check_reachable(ctx: Context) -> list[Finding]:
    """gpu.reachable: every NVIDIA GPU on the PCI bus answers NVML, and as many as expected are
    there (`--expect-gpus`: a GPU gone from the bus entirely leaves no trace on the node)."""
    machine, expected = ctx.machine, ctx.options.get("expect_gpus")
    lost = [g for g in machine.gpus if _is_lost(g)]
    found = len(machine.gpus)
    source = "NVML device list and the PCI devices of vendor 10de (sysfs)"
    remedy = ("`nvidia-smi -q` and `dmesg | grep -i -E 'NVRM|Xid'` on the node; a GPU that fell off the bus "
              "needs a reset (`nvidia-smi -r -i N`) or a reboot, and a repeat means the board or its slot")
    findings = [finding(GPU_REACHABLE, subject(g), FAIL, _why_lost(g),
                        measured=_why_lost(g), expected="NVML answers for every GPU on the bus", source=source,
                        remedy=remedy) for g in lost]
    if expected is not None and found < expected:
        findings.append(finding(GPU_REACHABLE, "machine", FAIL, f"{found} of {expected} GPUs visible",
                                measured=f"{found} GPU(s) seen by NVML or on the PCI bus", expected=f"{expected} (--expect-gpus)",
                                source=source, remedy=remedy))
    if not machine.gpus and expected is None:
        why = machine.gpu_error or "no NVIDIA GPU found"
        return [finding(GPU_REACHABLE, "gpu", SKIP, f"no GPU to check: {why}", measured="0 GPUs",
                        source=source)]
    if machine.gpu_error and machine.gpus and not lost:  # the driver is broken while the bus shows GPUs
        findings.append(finding(GPU_REACHABLE, "machine", FAIL, f"GPUs on the bus, NVML broken: {machine.gpu_error}",
                                measured=machine.gpu_error, expected="NVML starts", source=source, remedy=remedy))
    if not findings:
        findings.append(finding(GPU_REACHABLE, "machine", PASS, f"{found} GPU(s) answering NVML",
                                measured=f"{found} GPU(s)", expected=f"{expected}" if expected is not None else "every GPU on the bus",
                                source=source))
    return findings


def _is_lost(gpu: Gpu) -> bool:
    reasons = gpu.unavailable.values()
    return "gpu" in gpu.unavailable or any(_LOST in r for r in reasons) or "NVML does not see this GPU" in gpu.unavailable.get("name", "")


def _why_lost(gpu: Gpu) -> str:
    for reason in gpu.unavailable.values():
        if _LOST in reason:
            return f"{_LOST} (NVML reports the GPU lost)"
    return f"not answering: {gpu.unavailable.get('gpu') or gpu.unavailable.get('name') or 'not reported'}"


def check_probes(ctx: Context) -> list[Finding]:
    """health.probe: a probe cut at its deadline is a finding. The GPU probe hanging is itself the
    classic sign of a wedged GPU (FAIL); another probe cut leaves only its part unread (SKIP)."""
    findings = []
    budgets = ctx.options.get("probe_budgets_s") or {}
    for probe, error in sorted(ctx.machine.probe_errors.items()):
        timed_out = error.startswith("timed out")
        status = FAIL if timed_out and probe in _GPU_PROBES else SKIP
        summary = (f"NVML hung past its {budgets.get(probe, '?')} s deadline: GPU or driver wedged"
                   if status == FAIL else f"{probe} probe did not answer: {error}")
        findings.append(finding(HEALTH_PROBE, probe, status, summary, measured=error,
                                expected=f"an answer within {budgets.get(probe, '?')} s",
                                source="gpuvet health's per-probe deadline",
                                remedy="`timeout 10 nvidia-smi -q`; if it hangs too, drain the node and reset the GPU or reboot"
                                if status == FAIL else None))
    return findings


def outcome(machine: Machine, findings: list[Finding]) -> str:
    """healthy / problem / unknown. A FAIL is a problem; with no failure, a node whose GPUs could
    not be read at all is 'could not tell', never healthy."""
    if any(f.status == FAIL for f in findings):
        return PROBLEM
    if any(f.check == GPU_REACHABLE and f.status == SKIP for f in findings):
        return UNKNOWN
    return HEALTHY
