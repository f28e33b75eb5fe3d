"""Captures that must not be judged as they are: cut short, from two machines, the wrong command,
and `gpuvet inspect -` reading one from stdin.

Every cut or mixed input here is built in the test from real captures in tests/fixtures, in a
file whose name says "synthetic".
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from cli_runner import gpuvet
from gpuvet.probe import capture
from gpuvet.probe.errors import CaptureError

FIXTURES = Path(__file__).parent / "fixtures"
RTX4090_8X = FIXTURES / "smi_text/q-8x-rtx4090-all-idle-535.154.05.txt"
V100_4X = FIXTURES / "smi_text/q-4x-v100-pcie-16gb-azure-ncv3-460.32.03.txt"
A100_8X = FIXTURES / "smi_text/q-8x-a100-sxm4-40gb-azure-ndv4-460.32.03.txt"
RTX3090_XML = FIXTURES / "smi_xml/rtx-3090-swpowercap-590.44.01-v13.xml"
GT1030_XML = FIXTURES / "smi_xml/gt-1030-x4-470.74-v11.xml"
TOPO_4X = FIXTURES / "topo/asus-esc8000a-4x-rtx6000ada-node-sys-nics-spaces.txt"
LSPCI_TREE = FIXTURES / "lspci/lspci-tv-asus-esc8000a-4x-rtx6000ada.txt"
LSPCI_NO_GPU = FIXTURES / "lspci/lspci-vvv-nonGPU-nvme-carrier-width-x1-downgraded-spaces.txt"


def synthetic(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}-synthetic.txt"
    path.write_text(text)
    return path


def first_lines(path: Path, count: int) -> str:
    return "".join(path.read_text().splitlines(keepends=True)[:count])


# -- cut short ---------------------------------------------------------------------------------

def test_first_400_lines_of_an_8_gpu_report_exit_2_with_one_line(tmp_path, capsys):
    cut = synthetic(tmp_path, "q-8x-rtx4090-first-400-lines", first_lines(RTX4090_8X, 400))
    code, out, err = gpuvet(capsys, "inspect", str(cut))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert f"{cut}: truncated nvidia-smi -q output: 8 GPUs attached, 2 in the file" in err
    assert "`nvidia-smi -q > gpu.txt`" in err


def test_first_1500_bytes_of_a_one_gpu_report_are_refused(tmp_path):
    cut = synthetic(tmp_path, "q-titan-v-first-1500-bytes", (FIXTURES / "smi_text/q-titan-v-560.35.03.txt").read_text()[:1500])
    with pytest.raises(CaptureError, match="1 GPU attached, 1 in the file, and the last GPU block stops before its Processes"):
        capture.read_captures(str(cut))


def test_a_d_section_report_cut_inside_its_last_block_is_refused(tmp_path):
    lines = (FIXTURES / "smi_text/q-d-page-retirement-8gpu-azure-535.86.10.txt").read_text().rstrip().splitlines()
    cut = synthetic(tmp_path, "q-d-page-retirement-last-line-dropped", "\n".join(lines[:-1]) + "\n")
    with pytest.raises(CaptureError, match="truncated nvidia-smi -q output: 8 GPUs attached, 8 in the file"):
        capture.read_captures(str(cut))


def test_a_report_cut_between_two_gpus_is_read_with_a_note_about_the_rest(tmp_path, capsys):
    # Just as `nvidia-smi -q -i 0` prints it: "Attached GPUs : 4", then one complete GPU block.
    text = V100_4X.read_text()
    second_gpu = text.index("\nGPU ", text.index("\nGPU ") + 1)
    cut = synthetic(tmp_path, "q-4x-v100-first-gpu-only", text[:second_gpu + 1])
    (c,) = capture.read_captures(str(cut))
    assert len(c.gpus) == 1 and "4 GPUs attached but 1 in this report" in c.note
    code, out, _ = gpuvet(capsys, "inspect", str(cut))
    assert "4 GPUs attached but 1 in this report" in out and "the other 3 are not in it" in out


def test_a_report_of_some_gpus_merges_into_the_full_report_of_the_same_machine(tmp_path):
    text = V100_4X.read_text()
    second_gpu = text.index("\nGPU ", text.index("\nGPU ") + 1)
    first_gpu_only = synthetic(tmp_path, "q-4x-v100-first-gpu-only", text[:second_gpu + 1])
    machine = capture.merge(capture.read_captures(str(first_gpu_only)) + capture.read_captures(str(V100_4X)))
    assert [g.name for g in machine.gpus] == ["Tesla V100-PCIE-16GB"] * 4


def test_real_xml_with_fewer_gpus_than_attached_says_so():
    (c,) = capture.read_captures(str(FIXTURES / "smi_xml/a100-sxm4-80gb-mig-4x1g-535.54.03-v12.xml"))
    assert len(c.gpus) == 1 and c.note.startswith("4 GPUs attached but 1 in this report")


def test_every_complete_real_report_has_no_such_note():
    for path in sorted((FIXTURES / "smi_text").glob("q-*.txt")) + [RTX3090_XML, GT1030_XML]:
        (c,) = capture.read_captures(str(path))
        assert c.note is None, path


def test_default_table_cut_inside_a_gpu_is_refused(tmp_path):
    table = FIXTURES / "smi_text/default-table-8x-h100-550.90.07.txt"
    cut = synthetic(tmp_path, "default-table-8x-h100-first-14-lines", first_lines(table, 14))
    with pytest.raises(CaptureError, match=r"truncated nvidia-smi table: .* after 1 complete GPU\(s\), without the closing"):
        capture.read_captures(str(cut))


# -- two machines ------------------------------------------------------------------------------

def test_reports_of_two_machines_are_refused_naming_both(capsys):
    code, out, err = gpuvet(capsys, "inspect", str(RTX3090_XML), str(GT1030_XML))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{RTX3090_XML}: 1 x NVIDIA GeForce RTX 3090 driver 590.44.01" in err
    assert f"{GT1030_XML}: 1 x NVIDIA GeForce GT 1030 driver 470.74" in err
    assert "not one machine" in err and "inspect them one at a time" in err


def test_same_bus_id_but_another_model_is_another_machine():
    dual_2070 = FIXTURES / "smi_xml/dual-rtx-2070-x8-590.44.01-v13.xml"
    dual_2080 = FIXTURES / "smi_xml/dual-rtx-2080-x8-590.44.01-v13.xml"
    with pytest.raises(CaptureError, match=r"not one machine \(different GPU models"):
        capture.merge(capture.read_captures(str(dual_2070)) + capture.read_captures(str(dual_2080)))


def test_reports_of_one_machine_still_merge():
    name = "h100-80gb-hbm3-vm-590.48.01"
    captures = []
    for path in (f"smi_text/q-{name}-idle.txt", f"smi_csv/{name}-idle.csv", "smi_text/default-table-h100-vm-590.48.01.txt"):
        captures += capture.read_captures(str(FIXTURES / path))
    (gpu,) = capture.merge(captures).gpus
    assert gpu.name == "NVIDIA H100 80GB HBM3"


def test_a_topology_with_fewer_gpus_is_noted_and_not_used(capsys):
    machine = capture.merge(capture.read_captures(str(A100_8X)) + capture.read_captures(str(TOPO_4X)))
    assert machine.topology is None and len(machine.gpus) == 8
    (topo_entry,) = [c for c in machine.captures if c["kind"] == "topo"]
    assert "shows 4 GPUs, the nvidia-smi report 8" in topo_entry["note"]
    code, out, _ = gpuvet(capsys, "inspect", str(A100_8X), str(TOPO_4X))
    assert code == 0 and "this topo matrix shows 4 GPUs, the nvidia-smi report 8: not used" in out
    assert "FAIL" not in out


# -- lspci -------------------------------------------------------------------------------------

def test_lspci_tree_exits_2_with_the_command_to_run(capsys):
    code, out, err = gpuvet(capsys, "inspect", str(LSPCI_TREE))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "`lspci -tv` tree output is not supported" in err and "`sudo lspci -vvv -d 10de:`" in err


def test_lspci_without_nvidia_gpu_alone_exits_2(capsys):
    code, out, err = gpuvet(capsys, "inspect", str(LSPCI_NO_GPU))
    assert code == 2 and out == ""
    assert f"{LSPCI_NO_GPU}: lspci output with no NVIDIA GPU (vendor 10de" in err


def test_lspci_without_nvidia_gpu_beside_a_report_is_a_note(capsys):
    code, out, _ = gpuvet(capsys, "inspect", str(RTX3090_XML), str(LSPCI_NO_GPU))
    assert code in (0, 1) and "1 x NVIDIA GeForce RTX 3090" in out
    assert "no NVIDIA GPU in this lspci output" in out


# -- stdin -------------------------------------------------------------------------------------

class _Stdin(io.TextIOWrapper):
    def __init__(self, data: bytes, tty: bool = False):
        super().__init__(io.BytesIO(data))
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_inspect_dash_reads_the_capture_from_stdin(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", _Stdin(RTX3090_XML.read_bytes()))
    code, out, _ = gpuvet(capsys, "inspect", "-", "--json")
    record = json.loads(out)
    assert code in (0, 1)
    assert record["machine"]["gpus"][0]["name"] == "NVIDIA GeForce RTX 3090"
    assert record["machine"]["captures"][0]["path"] == "stdin"


def test_inspect_dash_names_stdin_in_its_errors(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", _Stdin(first_lines(RTX4090_8X, 400).encode()))
    code, _, err = gpuvet(capsys, "inspect", "-")
    assert code == 2 and err.startswith("gpuvet: stdin: truncated nvidia-smi -q output")


def test_inspect_dash_refuses_a_terminal_and_a_second_dash(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", _Stdin(b"", tty=True))
    code, _, err = gpuvet(capsys, "inspect", "-")
    assert code == 2 and "stdin is a terminal" in err and "| gpuvet inspect -" in err
    code, _, err = gpuvet(capsys, "inspect", "-", "-")
    assert code == 2 and 'give "-" (stdin) once' in err
