"""The words nvidia-smi prints for NVML's enums, shared by the live backend (enum -> word) and the
NVML replay (word -> enum), so a GPU read live and the same GPU read from its `nvidia-smi -q -x`
say the same thing ("GeForce", "NVIDIA RTX", "Ada Lovelace", not "Geforce", "Nvidia Rtx", "Ada").
"""

from __future__ import annotations

# nvmlBrandType_t -> nvidia-smi's "Product Brand".
BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NVIDIA Virtual Applications",
    8: "NVIDIA Virtual PC",
    9: "NVIDIA Virtual Compute Server",
    10: "NVIDIA RTX Virtual Workstation",
    11: "NVIDIA Cloud Gaming",
    12: "Quadro RTX",
    13: "NVIDIA RTX",
    14: "NVIDIA",
    15: "GeForce RTX",
    16: "Titan RTX",
}

# nvmlDeviceArchitecture_t -> nvidia-smi's "Product Architecture".
ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}

COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}

# nvmlGpuVirtualizationMode_t -> facts' virtualization_mode.
VIRTUALIZATION_MODES = {0: "none", 1: "passthrough", 2: "vgpu", 3: "host_vgpu", 4: "host_vsga"}

# nvmlDriverModel_t -> nvidia-smi's "Driver Model" (Windows only; WDM is printed as TCC).
DRIVER_MODELS = {0: "WDDM", 1: "TCC", 2: "MCDM"}

# nvmlGpuFabricState_t -> nvidia-smi's fabric "State" (0: not supported, no NVSwitch fabric).
FABRIC_STATES = {1: "Not Started", 2: "In Progress", 3: "Completed"}

# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION's values -> nvidia-smi's "GPU Recovery Action".
RECOVERY_ACTIONS = {0: "None", 1: "GPU Reset", 2: "Node Reboot", 3: "Drain P2P", 4: "Drain and Reset",
                    5: "Recover IMEX Domain", 6: "Bus Reset", 7: "System Reboot"}

# nvidia-smi's "Clocks Event Reasons Counters": the reason (as the parsers name it) -> its NVML
# field id's name (drivers since R535; values in ns). By name: older nvidia-ml-py lacks them.
EVENT_TIME_FIELDS = {
    "sw_power_cap": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
    "sync_boost": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST",
    "sw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "hw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "hw_power_brake_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
}


def code_of(names: dict[int, str], word: str | None) -> int | None:
    """The enum value whose word is `word` (case and spacing ignored), None when none is."""
    if word is None:
        return None
    key = "".join(word.lower().split())
    return next((code for code, name in names.items() if "".join(name.lower().split()) == key), None)
