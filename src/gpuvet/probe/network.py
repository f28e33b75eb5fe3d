"""Network facts: NICs from /sys/class/net and RDMA ports from /sys/class/infiniband.

Read-only sysfs reads, no commands, no root. Both collectors never raise: a machine without
the directory (not Linux, no RDMA driver) gives an empty list, and a file that cannot be read
leaves its field None. The parsers are pure functions, tested on the formats the kernel writes.
"""

from __future__ import annotations

import os
import re

from gpuvet.facts import Nic, RdmaPort

SYS_CLASS_NET = "/sys/class/net"
SYS_CLASS_INFINIBAND = "/sys/class/infiniband"

# Names of software interfaces, for the odd kernel that does not place them under
# /sys/devices/virtual (and for captures, where only the name is known).
_VIRTUAL_PREFIXES = ("veth", "docker", "br-", "virbr", "cni", "flannel", "cali", "vxlan",
                     "tun", "tap", "wg", "ifb", "dummy", "kube-ipvs", "tailscale", "zt")


# -- parsers (pure) ---------------------------------------------------------------------------

def parse_speed(text: str | None) -> int | None:
    """/sys/class/net/<nic>/speed in Mb/s; -1 (unknown, e.g. virtio), garbage or None -> None."""
    try:
        speed = int((text or "").strip())
    except ValueError:
        return None
    return speed if speed > 0 else None


def is_virtual(name: str, device_path: str | None) -> bool:
    """A software interface (loopback, bridge, veth, tunnel...), not a physical or SR-IOV port.

    `device_path` is the resolved /sys/class/net/<name> link: the kernel puts every interface
    that has no bus device under /sys/devices/virtual/net.
    """
    if device_path and "/devices/virtual/" in device_path:
        return True
    return name == "lo" or name.startswith(_VIRTUAL_PREFIXES)


def parse_ib_state(text: str | None) -> str | None:
    """ports/<n>/state and phys_state: "4: ACTIVE" -> "ACTIVE", "5: LinkUp" -> "LinkUp"."""
    if not text or not text.strip():
        return None
    _, _, name = text.strip().partition(":")
    return name.strip() or text.strip()


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def parse_ib_rate(text: str | None) -> float | None:
    """ports/<n>/rate: "400 Gb/sec (4X NDR)" -> 400.0, "2.5 Gb/sec (1X SDR)" -> 2.5."""
    match = _RATE.match(text or "")
    return float(match.group(1)) if match else None


# -- collectors -------------------------------------------------------------------------------

def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:  # speed of a down link is EINVAL; files differ between drivers
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _driver(nic_dir: str) -> str | None:
    link = os.path.join(nic_dir, "device", "driver")
    return os.path.basename(os.path.realpath(link)) if os.path.exists(link) else None


def _nic(root: str, name: str) -> Nic:
    nic_dir = os.path.join(root, name)
    virtual = is_virtual(name, os.path.realpath(nic_dir))
    return Nic(name=name,
               speed_mbps=None if virtual else parse_speed(_read(os.path.join(nic_dir, "speed"))),
               operstate=_read(os.path.join(nic_dir, "operstate")),
               mtu=_int(_read(os.path.join(nic_dir, "mtu"))),
               driver=_driver(nic_dir),
               virtual=virtual)


def collect_nics(root: str = SYS_CLASS_NET) -> list[Nic]:
    """Every network interface, physical ones first; [] where /sys/class/net is missing."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    nics = []
    for name in names:
        try:
            nics.append(_nic(root, name))
        except Exception:  # noqa: BLE001 - one odd interface must not hide the others
            nics.append(Nic(name=name))
    return sorted(nics, key=lambda n: (n.virtual, n.name))


def _rdma_port(device_dir: str, device: str, port: str) -> RdmaPort:
    port_dir = os.path.join(device_dir, "ports", port)
    return RdmaPort(device=device, port=int(port),
                    state=parse_ib_state(_read(os.path.join(port_dir, "state"))),
                    phys_state=parse_ib_state(_read(os.path.join(port_dir, "phys_state"))),
                    rate_gbps=parse_ib_rate(_read(os.path.join(port_dir, "rate"))),
                    link_layer=_read(os.path.join(port_dir, "link_layer")))


def collect_rdma(root: str = SYS_CLASS_INFINIBAND) -> list[RdmaPort]:
    """Every port of every RDMA device (InfiniBand, RoCE, iWARP); [] when there is none."""
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return []
    ports = []
    for device in devices:
        device_dir = os.path.join(root, device)
        try:
            numbers = sorted((p for p in os.listdir(os.path.join(device_dir, "ports")) if p.isdigit()), key=int)
        except OSError:
            continue
        for port in numbers:
            try:
                ports.append(_rdma_port(device_dir, device, port))
            except Exception:  # noqa: BLE001
                ports.append(RdmaPort(device=device, port=int(port)))
    return ports
