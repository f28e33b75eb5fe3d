"""What a remediator does about a finding: one small, ordered set of machine-readable actions.

A person reads a finding's remedy; a scheduler, NVSentinel or a Slurm script reads its action.
The names keep the meaning of NVIDIA's Xid catalogue "Resolution Bucket (Immediate Action)"
(IGNORE, RESTART_APP, RESET_GPU, RESTART_VM/RESTART_BM, CONTACT_SUPPORT, CHECK_MECHANICALS,
UPDATE_SWFW, CHECK_UVM) and of NVSentinel's RecommendedAction (NONE, COMPONENT_RESET, RESTART_BM,
CONTACT_SUPPORT), mapped below, so a fleet tool can act on either.

This module imports nothing of gpuvet: every layer may read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Action:
    name: str  # stable: scripts and policies match on it
    meaning: str  # what a remediator does
    nvidia_xid: tuple[str, ...]  # the Xid catalogue resolutions it stands for
    nvsentinel: str  # NVSentinel's RecommendedAction of the same meaning


# Ordered from least to most disruptive to the node's other work: the worst action of a run is the
# latest in this order that any of its findings names.
ACTIONS: tuple[Action, ...] = (
    Action("none", "nothing to do: the finding is information", ("IGNORE",), "NONE"),
    Action("configure", "change a setting the user owns (an environment variable, a config line, a flag)",
           (), "NONE"),
    Action("update_software", "install or update the driver, firmware, PyTorch or another package",
           ("UPDATE_SWFW", "CHECK_UVM"), "NONE"),
    Action("restart_job", "restart the application or job; the node and its GPUs stay in service",
           ("RESTART_APP",), "NONE"),
    Action("ask_provider", "a limit set outside the machine (power cap, slot, sharing, virtualization): the "
           "provider or the admin changes it, or you move to another machine", ("CHECK_MECHANICALS",),
           "CONTACT_SUPPORT"),
    Action("reset_gpu", "drain the GPU's work and reset it (nvidia-smi -r); the node's other GPUs keep running",
           ("RESET_GPU",), "COMPONENT_RESET"),
    Action("reboot_node", "drain the node and reboot it (the VM or the bare-metal host)",
           ("RESTART_VM", "RESTART_BM"), "RESTART_BM"),
    Action("drain_and_repair", "take the node out of service and send the GPU or board for repair (RMA)",
           ("CONTACT_SUPPORT",), "CONTACT_SUPPORT"),
)

BY_NAME: dict[str, Action] = {a.name: a for a in ACTIONS}
NAMES: tuple[str, ...] = tuple(a.name for a in ACTIONS)
NONE = "none"
CONFIGURE = "configure"
UPDATE_SOFTWARE = "update_software"
RESTART_JOB = "restart_job"
RESET_GPU = "reset_gpu"
REBOOT_NODE = "reboot_node"
ASK_PROVIDER = "ask_provider"
DRAIN_AND_REPAIR = "drain_and_repair"

# NVIDIA's Xid catalogue resolution -> gpuvet's action (a WORKFLOW_* or XID_*_EVAL resolution is a
# procedure that ends in a reset or a repair: the caller names which).
FROM_XID_RESOLUTION: dict[str, str] = {res: a.name for a in ACTIONS for res in a.nvidia_xid}


def rank(name: str) -> int:
    """Position in ACTIONS (an unknown name ranks as none)."""
    return NAMES.index(name) if name in BY_NAME else 0


def worst(names: list[str] | tuple[str, ...]) -> str:
    """The most disruptive of the actions named (none when there is none)."""
    return max(names, key=rank, default=NONE)


# The most a WARN may ask for: a warning never takes a GPU or a node out of service.
WARN_CEILING = ASK_PROVIDER


def for_status(name: str, status: str) -> str:
    """The action a finding of this status carries: none unless it failed or warned, and a warning
    capped at WARN_CEILING (a rule's reset or reboot on a warning becomes none)."""
    if status not in ("fail", "warn"):
        return NONE
    if status == "warn" and rank(name) > rank(WARN_CEILING):
        return NONE
    return name if name in BY_NAME else NONE
