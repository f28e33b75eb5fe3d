"""`nvidia-smi topo -m` / `-mp` parsing, checked against the real captures in tests/fixtures/topo."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from gpuvet.probe.errors import CaptureError
from gpuvet.probe.topo import looks_like_topo, nvlink_count, parse_topo

FIXTURES = Path(__file__).parent / "fixtures"
TOPO = FIXTURES / "topo"
DGX_A100 = TOPO / "dgx-a100-8gpu-nv12-12nics-topo-m.txt"
DGX1_MP = TOPO / "dgx1-8gpu-topo-mp-pcie-only.txt"
ASUS_4X_ADA = TOPO / "asus-esc8000a-4x-rtx6000ada-node-sys-nics-spaces.txt"
PUGET_2X_ADA = TOPO / "puget-wrx90-2x-rtx6000ada-phb-spaces.txt"
H100_VM = TOPO / "h100-vm-1gpu-ansi-underline-590.48.01.txt"
WINDOWS_EMPTY = TOPO / "windows-1gpu-empty-affinity-610.62.txt"
WINDOWS_ERROR = TOPO / "windows-topo-m-error-591.86.txt"


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_dgx_a100_every_gpu_pair_is_nv12():
    topo = parse_topo(read(DGX_A100))
    assert topo.gpus == [f"GPU{i}" for i in range(8)]
    for a, b in itertools.permutations(topo.gpus, 2):
        assert topo.links[a][b] == "NV12", (a, b)
        assert nvlink_count(topo.links[a][b]) == 12
    assert all(topo.links[gpu][gpu] == "X" for gpu in topo.gpus)
    assert topo.shows_nvlink is True


def test_dgx_a100_nics_are_mlx5_columns_with_affinity_per_gpu():
    topo = parse_topo(read(DGX_A100))
    assert topo.devices[8:] == [f"mlx5_{i}" for i in range(12)]
    assert topo.links["GPU0"]["mlx5_0"] == "PXB"
    assert topo.links["GPU0"]["mlx5_2"] == "SYS"
    assert topo.links["mlx5_4"]["mlx5_5"] == "PIX"
    assert topo.cpu_affinity["GPU0"] == "48-63,176-191"
    assert topo.numa_affinity == {
        "GPU0": "3", "GPU1": "3", "GPU2": "1", "GPU3": "1",
        "GPU4": "7", "GPU5": "7", "GPU6": "5", "GPU7": "5",
    }
    assert topo.nic_names == {}  # this older driver names the NICs in the header, no NIC Legend
    assert "mlx5_0" not in topo.cpu_affinity  # NIC rows carry no affinity


def test_asus_4x_rtx6000ada_node_within_socket_sys_across_with_nic_legend():
    topo = parse_topo(read(ASUS_4X_ADA))
    assert topo.devices == ["GPU0", "GPU1", "GPU2", "GPU3", "NIC0", "NIC1", "NIC2", "NIC3"]
    assert topo.links["GPU0"]["GPU1"] == "NODE"
    assert topo.links["GPU0"]["GPU2"] == "SYS"
    assert topo.links["GPU2"]["GPU3"] == "NODE"
    assert topo.links["GPU3"]["NIC2"] == "NODE"
    assert topo.links["NIC0"]["NIC1"] == "PIX"
    assert topo.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1", "NIC2": "mlx5_2", "NIC3": "mlx5_3"}
    assert topo.cpu_affinity == {"GPU0": "0-31", "GPU1": "0-31", "GPU2": "32-63", "GPU3": "32-63"}
    assert topo.numa_affinity == {"GPU0": "0", "GPU1": "0", "GPU2": "1", "GPU3": "1"}
    assert not any(nvlink_count(c) for row in topo.links.values() for c in row.values())


def test_puget_2x_rtx6000ada_phb_between_gpus():
    topo = parse_topo(read(PUGET_2X_ADA))
    assert topo.gpus == ["GPU0", "GPU1"]
    assert topo.links["GPU0"]["GPU1"] == "PHB"
    assert topo.links["NIC0"]["NIC1"] == "PIX"
    assert topo.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert topo.numa_affinity == {"GPU0": "0", "GPU1": "0"}


def test_dgx1_topo_mp_hides_nvlink():
    topo = parse_topo(read(DGX1_MP))
    assert len(topo.gpus) == 8
    assert topo.shows_nvlink is False
    codes = {code for row in topo.links.values() for code in row.values()}
    assert codes == {"X", "PIX", "PHB", "SYS"}
    assert topo.links["GPU0"]["GPU1"] == "PIX"
    assert topo.numa_affinity["GPU3"] == "0" and topo.numa_affinity["GPU4"] == "1"
    assert topo.cpu_affinity["GPU7"] == "20-39,60-79"


def test_h100_vm_single_gpu_ansi_header_and_extra_empty_cell():
    topo = parse_topo(read(H100_VM), source="h100.txt")
    assert topo.devices == ["GPU0"]
    assert topo.links == {"GPU0": {"GPU0": "X"}}
    assert topo.cpu_affinity == {"GPU0": "0-19"}
    assert topo.numa_affinity == {"GPU0": "0"}
    assert topo.shows_nvlink is True
    assert topo.source == "h100.txt"


def test_windows_empty_affinity_cells_stay_unknown():
    topo = parse_topo(read(WINDOWS_EMPTY))
    assert topo.devices == ["GPU0"]
    assert topo.cpu_affinity == {}
    assert topo.numa_affinity == {}  # not "N/A" taken from the GPU NUMA ID column


@pytest.mark.parametrize("path", [DGX_A100, DGX1_MP, H100_VM, WINDOWS_EMPTY], ids=lambda p: p.name)
def test_tabs_expanded_to_spaces_parse_the_same(path):
    """A Markdown paste turns TABs into spaces; empty cells must not shift the others."""
    text = read(path)
    assert "\t" in text
    with_tabs, with_spaces = parse_topo(text), parse_topo(text.expandtabs(8))
    assert with_spaces.links == with_tabs.links
    assert with_spaces.cpu_affinity == with_tabs.cpu_affinity
    assert with_spaces.numa_affinity == with_tabs.numa_affinity


def test_empty_cell_before_a_value_keeps_columns_in_place_after_tab_expansion():
    """The Windows row with only NUMA Affinity filled in: a whitespace split would shift "0" left."""
    text = read(WINDOWS_EMPTY).replace("GPU0\t X \t\t\t", "GPU0\t X \t\t0\t")
    for variant in (text, text.expandtabs(8)):
        topo = parse_topo(variant)
        assert topo.cpu_affinity == {}
        assert topo.numa_affinity == {"GPU0": "0"}


# `nvidia-smi topo -p2p r`: same matrix shape, P2P status codes instead of link types.
P2P_TWO_GPUS = (
    "\tGPU0\tGPU1\n GPU0\tX\tOK\n GPU1\tOK\tX\n"
    "\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n  CNS  = Chipset not supported\n"
)
P2P_ONE_GPU = "\tGPU0\n GPU0\tX\n\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n  NS   = Not supported\n"


P2P_WITHOUT_LEGEND = "        GPU0    GPU1\n GPU0   X       CNS\n GPU1   CNS     X\n"


@pytest.mark.parametrize("text", [P2P_TWO_GPUS, P2P_ONE_GPU, P2P_TWO_GPUS.expandtabs(8), P2P_WITHOUT_LEGEND])
def test_p2p_status_matrix_is_not_topo(text):
    assert not looks_like_topo(text)
    with pytest.raises(CaptureError):
        parse_topo(text)


def test_legend_of_a_later_matrix_is_not_read():
    """topo -mp (no NV# line) followed by another capture: only the first matrix's legend counts."""
    topo = parse_topo(read(DGX1_MP) + "\n" + read(DGX_A100))
    assert len(topo.devices) == 12
    assert topo.shows_nvlink is False


def test_respaced_by_hand_still_parses():
    """Two spaces for each TAB: not on 8-column stops, so the cells are split on whitespace."""
    text = read(DGX_A100)
    respaced = parse_topo(text.replace("\t", "  "))
    original = parse_topo(text)
    assert respaced.links == original.links
    assert respaced.numa_affinity == original.numa_affinity


def test_unknown_link_codes_are_kept():
    topo = parse_topo(read(DGX1_MP).replace("SYS", "SOC"))  # what drivers before NODE/SYS printed
    assert topo.links["GPU0"]["GPU4"] == "SOC"


def test_windows_error_message_raises_capture_error():
    with pytest.raises(CaptureError, match="Option -m is missing its value"):
        parse_topo(read(WINDOWS_ERROR))


def test_text_without_matrix_raises():
    legend_only = read(DGX_A100).split("Legend:", 1)[1]
    with pytest.raises(CaptureError):
        parse_topo(legend_only)
    with pytest.raises(CaptureError, match="empty"):
        parse_topo("")


def test_truncated_matrix_raises():
    lines = read(DGX_A100).splitlines()
    without_last_row = "\n".join(line for line in lines if not line.startswith("mlx5_11"))
    assert looks_like_topo(without_last_row)  # recognised, so that the user gets this message
    with pytest.raises(CaptureError, match="20 device columns but 19 rows"):
        parse_topo(without_last_row)


def test_matrix_inside_a_bundle_is_found():
    topo = parse_topo(read(FIXTURES / "bundles" / "l40s-vm-595.80.txt"))
    assert topo.gpus == ["GPU0"]
    assert topo.cpu_affinity == {"GPU0": "0-7"}


@pytest.mark.parametrize(
    ("code", "count"), [("NV12", 12), ("NV4", 4), ("NV18", 18), ("PIX", 0), ("SYS", 0), ("X", 0), ("NV", 0)]
)
def test_nvlink_count(code, count):
    assert nvlink_count(code) == count


def _every_fixture() -> list[Path]:
    return sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.name != "SOURCES.md")


@pytest.mark.parametrize("path", _every_fixture(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_is_claimed_only_if_it_is_a_topo_matrix(path):
    text = path.read_text(encoding="utf-8", errors="replace")
    # topo/ holds the matrices; an edited one elsewhere says so in its name ("...-topo-m-edited-...").
    is_topo_matrix = path != WINDOWS_ERROR and (path.parent == TOPO or "-topo-m-" in path.name)
    assert looks_like_topo(text) is is_topo_matrix
    try:
        parse_topo(text)  # whatever the file, either a Topology or a CaptureError
    except CaptureError:
        assert not is_topo_matrix
