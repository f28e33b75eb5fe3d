"""NIC and RDMA facts: the parsers on the formats the kernel writes, the collectors on a sysfs tree
built like the kernel's, and on this machine's /sys/class/net."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuvet.facts import Nic, RdmaPort
from gpuvet.probe import network


@pytest.mark.parametrize("text, speed", [
    ("25000\n", 25000), ("100000", 100000), ("-1\n", None),  # -1: virtio and other NICs that do not know
    ("", None), (None, None), ("garbage", None), ("0", None),
])
def test_parse_speed(text, speed):
    assert network.parse_speed(text) == speed


@pytest.mark.parametrize("name, device_path, virtual", [
    ("lo", "/sys/devices/virtual/net/lo", True),
    ("docker0", "/sys/devices/virtual/net/docker0", True),
    ("eth0", "/sys/devices/pci0000:00/0000:00:03.0/virtio2/net/eth0", False),
    ("ens1f0np0", "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/net/ens1f0np0", False),
    ("veth3f2a1b", None, True), ("br-5c1d", None, True), ("cali12ab", None, True),
    ("ens5", None, False), ("lom1", None, False),
])
def test_is_virtual(name, device_path, virtual):
    assert network.is_virtual(name, device_path) is virtual


@pytest.mark.parametrize("text, state", [
    ("4: ACTIVE\n", "ACTIVE"), ("1: DOWN", "DOWN"), ("2: INIT", "INIT"),
    ("5: LinkUp\n", "LinkUp"), ("3: Disabled", "Disabled"), ("2: Polling", "Polling"),
    ("", None), (None, None),
])
def test_parse_ib_state(text, state):
    assert network.parse_ib_state(text) == state


@pytest.mark.parametrize("text, rate", [
    ("400 Gb/sec (4X NDR)\n", 400.0), ("200 Gb/sec (4X HDR)", 200.0), ("100 Gb/sec (4X EDR)", 100.0),
    ("56 Gb/sec (4X FDR)", 56.0), ("2.5 Gb/sec (1X SDR)", 2.5), ("25 Gb/sec (1X EDR)", 25.0),
    ("", None), (None, None), ("invalid", None),
])
def test_parse_ib_rate(text, rate):
    assert network.parse_ib_rate(text) == rate


# -- collectors on a sysfs tree laid out like the kernel's ------------------------------------

def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_net(root: Path) -> Path:
    """class/net/{lo,ens1f0,eth1}: links into devices/, as the kernel makes them."""
    lo = root / "devices/virtual/net/lo"
    for name, text in {"operstate": "unknown\n", "mtu": "65536\n"}.items():
        write(lo / name, text)  # lo has no readable speed (EINVAL): no file here
    pci = root / "devices/pci0000:3a/0000:3b:00.0"
    nic = pci / "net/ens1f0"
    for name, text in {"speed": "100000\n", "operstate": "up\n", "mtu": "9000\n"}.items():
        write(nic / name, text)
    driver = root / "bus/pci/drivers/mlx5_core"
    driver.mkdir(parents=True)
    (pci / "driver").symlink_to(driver)
    (nic / "device").symlink_to(pci)
    down = root / "devices/pci0000:00/0000:00:05.0/net/eth1"
    for name, text in {"speed": "-1\n", "operstate": "down\n", "mtu": "1500\n"}.items():
        write(down / name, text)
    classes = root / "class/net"
    classes.mkdir(parents=True)
    for target in (lo, nic, down):
        (classes / target.name).symlink_to(os.path.relpath(target, classes))
    return classes


def test_collect_nics_from_a_sysfs_tree(tmp_path):
    nics = network.collect_nics(str(fake_net(tmp_path)))
    assert nics == [
        Nic(name="ens1f0", speed_mbps=100000, operstate="up", mtu=9000, driver="mlx5_core", virtual=False),
        Nic(name="eth1", speed_mbps=None, operstate="down", mtu=1500, driver=None, virtual=False),
        Nic(name="lo", speed_mbps=None, operstate="unknown", mtu=65536, driver=None, virtual=True),
    ]


def fake_infiniband(root: Path) -> Path:
    ports = {
        "mlx5_0/ports/1": ("4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand"),
        "mlx5_1/ports/1": ("1: DOWN", "3: Disabled", "10 Gb/sec (4X SDR)", "InfiniBand"),
        "mlx5_2/ports/1": ("4: ACTIVE", "5: LinkUp", "100 Gb/sec (4X EDR)", "Ethernet"),
    }
    for port, (state, phys, rate, layer) in ports.items():
        for name, text in {"state": state, "phys_state": phys, "rate": rate, "link_layer": layer}.items():
            write(root / port / name, text + "\n")
    (root / "mlx5_3/ports").mkdir(parents=True)  # a device without ports: nothing to list
    return root


def test_collect_rdma_from_a_sysfs_tree(tmp_path):
    assert network.collect_rdma(str(fake_infiniband(tmp_path))) == [
        RdmaPort("mlx5_0", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand"),
        RdmaPort("mlx5_1", 1, "DOWN", "Disabled", 10.0, "InfiniBand"),
        RdmaPort("mlx5_2", 1, "ACTIVE", "LinkUp", 100.0, "Ethernet"),  # RoCE
    ]


def test_absent_directories_give_empty_lists(tmp_path):
    assert network.collect_nics(str(tmp_path / "none")) == []
    assert network.collect_rdma(str(tmp_path / "none")) == []


# -- this machine -----------------------------------------------------------------------------

@pytest.mark.skipif(not os.path.isdir("/sys/class/net"), reason="no /sys/class/net (not Linux)")
def test_this_machines_nics():
    nics = network.collect_nics()
    by_name = {n.name: n for n in nics}
    assert set(by_name) == set(os.listdir("/sys/class/net"))
    lo = by_name["lo"]
    assert lo.virtual and lo.speed_mbps is None and lo.mtu and lo.operstate
    virtual = [n.virtual for n in nics]
    assert virtual == sorted(virtual)  # physical interfaces first


def test_this_machines_rdma_ports():
    ports = network.collect_rdma()
    if not os.path.isdir(network.SYS_CLASS_INFINIBAND):
        assert ports == []
    for port in ports:
        assert port.device and port.port >= 1
