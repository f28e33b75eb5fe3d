"""Recognising captures by content, splitting bundles, merging several files of one machine."""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest

from gpuvet.probe import capture
from gpuvet.probe.errors import CaptureError

FIXTURES = Path(__file__).parent / "fixtures"
# Every real capture (records/ holds gpuvet run records made from them, not captures).
ALL_FILES = sorted(p for p in FIXTURES.rglob("*")
                   if p.is_file() and p.name != "SOURCES.md" and p.relative_to(FIXTURES).parts[0] != "records")

# Files that are not captures of a working machine: each must give one clear error.
NOT_CAPTURES = {
    "docs_embedded/gengwg-cheatsheets-gpu.md": "not a capture gpuvet knows",
    "docs_embedded/stelline-asus-esc8000a-e12-4x-rtx6000ada.md": "not a capture gpuvet knows",
    "docs_embedded/stelline-puget-wrx90-2x-rtx6000ada.md": "not a capture gpuvet knows",
    "smi_text/error-nvml-driver-library-mismatch.txt": "Driver/library version mismatch",
    "smi_text/nvlink-status-a10-none.txt": "empty",
    "topo/windows-topo-m-error-591.86.txt": "error message",
    "lspci/lspci-tv-asus-esc8000a-4x-rtx6000ada.txt": r"`lspci -tv` tree output is not supported",
    "lspci/lspci-vvv-nonGPU-nvme-carrier-width-x1-downgraded-spaces.txt": "lspci output with no NVIDIA GPU",
    "edited/make_edited.py": "not a capture gpuvet knows",
    "edited/make_edited_seeds.py": "not a capture gpuvet knows",  # the script that makes the seed commands' cuts
    "grafana/dcgm-exporter-dashboard-12239.json": "not a capture gpuvet knows",  # a dashboard, read by the exporter's tests
    "jupyter/nbresuse-serverextension.json": "not a capture gpuvet knows",  # a Jupyter config file (env audit tests)  # the script that makes the edited captures
    "edited/dmon-h100-vm-idle-590.48.01-edited-gpu-index-20000000.txt": "GPU index '20000000' is not an index",
    "edited/dmon-h100-vm-idle-590.48.01-edited-gpu-index-2000000000.txt": "GPU index '2000000000' is not an index",
    "edited/dmon-h100-vm-idle-590.48.01-edited-gpu-index-1e30.txt": "GPU index '1e30' is not an index",
}


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_is_read_or_refused_with_one_clear_reason(path):
    name = str(path.relative_to(FIXTURES))
    if name in NOT_CAPTURES:
        with pytest.raises(CaptureError, match=NOT_CAPTURES[name]) as err:
            capture.merge(capture.read_captures(str(path)))
        assert str(path) in str(err.value) and "\n" not in str(err.value)
        return
    captures = capture.read_captures(str(path))
    assert captures and all(c.kind for c in captures)
    capture.merge(captures)  # must not raise either


@pytest.mark.parametrize(
    "name, kind",
    [
        ("smi_xml/gtx-1050-laptop-x8-515.65.01-nodoctype.xml", "smi-xml"),
        ("smi_text/q-titan-v-560.35.03.txt", "smi-text"),
        ("smi_csv/rtx-4080-super-595.71.05-idle.csv", "smi-csv"),
        ("smi_text/default-table-8x-h100-550.90.07.txt", "smi-table"),
        ("smi_text/dmon-h100-vm-idle-590.48.01.txt", "smi-dmon"),
        ("topo/puget-wrx90-2x-rtx6000ada-phb-spaces.txt", "topo"),
        ("smi_text/nvlink-status-8x-a100-sxm4.txt", "nvlink-status"),
        ("lspci/lspci-vvv-rtx6000ada-wrx90-idle-downgraded-spaces.txt", "lspci"),
        ("proc_sysfs/proc-driver-nvidia-version-470.63.01.txt", "proc-version"),
    ],
)
def test_kind_comes_from_content_not_name(tmp_path, name, kind):
    renamed = tmp_path / "capture.dat"
    renamed.write_bytes((FIXTURES / name).read_bytes())
    (c,) = capture.read_captures(str(renamed))
    assert c.kind == kind


def test_windows_powershell_utf16_copy_of_a_real_capture_is_read(tmp_path):
    # PowerShell's `>` writes UTF-16 with a BOM; this re-encodes a real capture the same way.
    original = (FIXTURES / "smi_text/q-rtx-2080-super-windows-610.62-idle.txt").read_text()
    path = tmp_path / "q-rtx-2080-super-windows-610.62-idle-utf16-copy.txt"
    path.write_bytes(codecs.BOM_UTF16_LE + original.encode("utf-16-le"))
    (c,) = capture.read_captures(str(path))
    assert c.kind == "smi-text" and c.gpus[0].name == "NVIDIA GeForce RTX 2080 SUPER"


def test_h100_bundle_merges_idle_report_load_link_topology_and_nvlinks():
    captures = capture.read_captures(str(FIXTURES / "bundles/h100-80gb-hbm3-vm-590.48.01.txt"))
    kinds = {c.kind for c in captures}
    assert {"smi-text", "topo", "nvlink-status"} <= kinds
    machine = capture.merge(captures)
    (gpu,) = machine.gpus
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.utilization_pct == 0  # the base facts are the idle report
    assert any(r.under_load for r in gpu.pcie.readings)  # the load report's link reading
    assert len([link for link in gpu.nvlinks if link.active]) == 18
    assert machine.topology.gpus == ["GPU0"]


def test_windows_bundle_with_failed_topo_still_reads_the_rest():
    captures = capture.read_captures(str(FIXTURES / "bundles/rtx-2080-super-windows-591.86.txt"))
    assert any(c.kind == "error" and "Option -m" in (c.note or "") for c in captures)
    machine = capture.merge(captures)
    assert machine.gpus[0].name == "NVIDIA GeForce RTX 2080 SUPER"


def test_topology_alone_gives_one_entry_per_gpu():
    machine = capture.merge(capture.read_captures(str(FIXTURES / "topo/dgx-a100-8gpu-nv12-12nics-topo-m.txt")))
    assert [g.index for g in machine.gpus] == list(range(8))
    assert all(g.name is None for g in machine.gpus)


def test_nvlink_status_in_mig_mode_means_not_read_not_inactive():
    captures = capture.read_captures(str(FIXTURES / "bundles/h200-mig-vm-590.48.01.txt"))
    (gpu,) = capture.merge(captures).gpus
    assert gpu.nvlinks is None and "MIG" in gpu.unavailable["nvlinks"]


def test_all_links_inactive_means_an_empty_link_list():
    captures = capture.read_captures(str(FIXTURES / "smi_text/nvlink-status-a100-all-links-inactive.txt"))
    (gpu,) = capture.merge(captures).gpus
    assert gpu.index == 6 and gpu.nvlinks == [] and "inactive" in gpu.unavailable["nvlinks"]


def test_lspci_adds_the_hosts_link_view_and_driver_to_the_same_gpu(tmp_path):
    xml = FIXTURES / "smi_xml/rtx-3080-595.58.03-v13.xml"
    lspci = FIXTURES / "lspci/lspci-vvv-rtx6000ada-idle-gen1-downgraded-spaces.txt"
    machine = capture.merge(capture.read_captures(str(xml)) + capture.read_captures(str(lspci)))
    # Different machines, different bus ids: the lspci GPU is kept apart, known by its bus id only.
    assert len(machine.gpus) == 2
    lspci_gpu = machine.gpus[1]
    assert lspci_gpu.pcie.bus_id == "0000:01:00.0" and lspci_gpu.pcie.kernel_driver == "nvidia"
    (reading,) = lspci_gpu.pcie.readings
    assert (reading.current_gen, reading.max_gen, reading.current_width, reading.source) == (1, 4, 16, "lspci")


@pytest.mark.parametrize(
    "content, message",
    [(b"", "empty"), (b"\x7fELF\x02\x01\x01\x00\x00\x00", "binary"), (b"just some notes\n", "not a capture")],
)
def test_bad_files_give_one_line(tmp_path, content, message):
    path = tmp_path / "input.txt"
    path.write_bytes(content)
    with pytest.raises(CaptureError, match=message):
        capture.read_captures(str(path))


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(CaptureError, match="cannot read"):
        capture.read_captures(str(tmp_path / "nope.xml"))
    with pytest.raises(CaptureError, match="directory"):
        capture.read_captures(str(tmp_path))


def test_a_captures_own_time_is_a_record_field_beside_the_inspection_time():
    # The 8x H100 report says "Timestamp : Fri Jun 21 02:03:08 2024"; the record is dated when inspected.
    from gpuvet import runner

    record = runner.inspect([str(FIXTURES / "smi_text" / "q-8x-h100-sxm-vm-swpowercap-535.183.01.txt")])
    (entry,) = record.machine.captures
    assert entry["taken_at"] == "2024-06-21T02:03:08" and "by its own timestamp" in entry["note"]
    assert not record.started_at.startswith("2024-06-21")


def test_a_command_run_in_process_leaves_later_reads_their_whole_window(capsys):
    # main() shares the 60 s read window across one command's reads; called in-process (tests, a
    # library), the next reads must not inherit a window that ran out minutes after it ended.
    from cli_runner import gpuvet

    from gpuvet.probe import bounded_read, capture

    gpuvet(capsys, "inspect", str(FIXTURES / "smi_text" / "q-titan-v-560.35.03.txt"))
    assert bounded_read._command_started is None
    bounded_read.start_command(age=bounded_read.READ_SECONDS + 60)  # a command begun long ago ...
    bounded_read.end_command()  # ... and over
    assert capture.read_captures(str(FIXTURES / "smi_text" / "q-titan-v-560.35.03.txt"))
