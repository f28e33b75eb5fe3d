"""How identifiers that gpuvet finds in free text are spelled, as regular-expression source to
build patterns from: probe/ reads them in captures and kernel logs, report/ recognises them in
remedies and redacts them. Pure text, importable from every layer.
"""

from __future__ import annotations

HEX = "[0-9A-Fa-f]"
# A PCI device without its function, as Xid lines print it: domain (4 digits in sysfs and lspci,
# 8 in nvidia-smi and NVML), bus and device: "00000000:3b:00".
PCI_SLOT = rf"{HEX}{{4,8}}:{HEX}{{2}}:{HEX}{{2}}"
# With the function: "0000:3b:00.0".
PCI_BUS_ID = rf"{PCI_SLOT}\.[0-7]"
