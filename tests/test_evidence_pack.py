"""The provider asks for evidence (issue 29): `gpuvet report RUN --for-provider` of a real faulty
capture, read back for what it keeps (the GPUs' UUID, serial, bus id and VBIOS, the capture's own
time, the lines each finding rests on, the command that shows it again, what we ask for) and what
it drops (the renter's home directory, host name, addresses)."""

from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from cli_runner import gpuvet

from gpuvet.record import RunRecord
from gpuvet.report import evidence
from gpuvet.report.provider_redact import ProviderRedaction, strip_paths

FIXTURES = Path(__file__).parent / "fixtures"
H100 = FIXTURES / "smi_text" / "q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"  # gpu2: HW power brake, a stranger's process
GPU2 = ("GPU-973565ff-45cf-12ea-4e91-33386720f7bb", "1654922018857", "0000:75:00.0", "96.00.74.00.01")


@pytest.fixture
def inspected(tmp_path, capsys) -> Path:
    """The capture as a renter keeps it (in their home directory), inspected into a run record."""
    home = tmp_path / "home" / "alice" / "tickets"
    home.mkdir(parents=True)
    shutil.copy(H100, home / H100.name)
    record = tmp_path / "h100.json"
    code, out, err = gpuvet(capsys, "inspect", str(home / H100.name), "--out", str(record))
    assert code == 1, err  # FAIL: the power brake
    return record


def test_the_pack_keeps_what_the_provider_needs_and_drops_the_renters_side(inspected, capsys, tmp_path):
    code, pack, err = gpuvet(capsys, "report", str(inspected), "--for-provider")
    assert code == 0, err
    assert all(value in pack for value in GPU2)  # the card, as the provider finds it
    assert "captured Fri Jun 21 02:03:08 2024 (the capture's own timestamp), 2." in pack  # not the day it was inspected
    first, second = pack.index("## 1. FAIL: "), pack.index("## 2. WARN: ")
    failing = pack[first:second]
    assert "check `gpu.throttle` on gpu2" in failing
    assert "   498:             HW Power Brake Slowdown       : Active" in failing  # the capture's own line
    assert "reproduce on the machine: `nvidia-smi -q -d PERFORMANCE -i 0000:75:00.0`" in failing
    assert "**What we ask for.** Fix what slows this GPU down" in failing
    assert "Give us the whole GPU we rented" in pack[second:]  # the stranger's process: gpu.isolation
    assert "alice" not in pack and str(tmp_path) not in pack and "/home/" not in pack


def test_the_html_pack_carries_the_whole_capture_and_reads_as_html(inspected, capsys, tmp_path):
    out = tmp_path / "pack.html"
    code, _, err = gpuvet(capsys, "report", str(inspected), "--for-provider", "--format", "html", "--out", str(out))
    assert code == 0, err
    page = out.read_text()
    HTMLParser().feed(page)
    assert page.index('class="finding fail"') < page.index('class="finding warn"')
    assert f"<code>{GPU2[0]}</code>" in page and "<summary>q-8x-h100-sxm-vm-swpowercap-535.183.01.txt (whole)</summary>" in page
    assert "alice" not in page and str(tmp_path) not in page
    assert "<summary>Every fact and figure gpuvet read (JSON, gpuvet.run/1)</summary>" in page
    assert page.count(GPU2[0]) > 3  # in the record too: identity kept there as well


def test_a_live_run_loses_its_host_name_and_addresses_but_not_system_paths():
    data = json.loads((FIXTURES / "records" / "cpu-quick.json").read_text())
    redaction = ProviderRedaction(RunRecord.from_dict(data))
    text = json.dumps(redaction.record().to_dict())
    assert "gpu-node-17" not in text and "HOST-REDACTED-1" in text
    pack = evidence.render_markdown(evidence.build(RunRecord.from_dict(data), {}, {}))
    assert "gpu-node-17" not in pack and "measured on the machine" in pack
    assert strip_paths("/home/bob/run/q.xml and /proc/driver/nvidia/version, /tmp") == "…/q.xml and /proc/driver/nvidia/version, /tmp"


def test_a_capture_gone_from_its_path_is_named_for_the_renter_to_attach(inspected, capsys, tmp_path):
    shutil.rmtree(tmp_path / "home")
    code, pack, err = gpuvet(capsys, "report", str(inspected), "--for-provider")
    assert code == 0, err
    assert "q-8x-h100-sxm-vm-swpowercap-535.183.01.txt: no longer at its path here" in pack
    assert "HW power brake" in pack and "```text" not in pack  # the evidence, without excerpts


def test_a_kernel_logs_host_name_is_dropped_and_its_lines_kept(capsys, tmp_path):
    """A real syslog capture of a GPU the driver could not start (RmInitAdapter failed), on host worker4."""
    log = FIXTURES / "kernel_log" / "syslog-rminitadapter-failed-gpu-operator.txt"
    record = tmp_path / "run.json"
    gpuvet(capsys, "inspect", str(log), "--out", str(record))
    code, pack, err = gpuvet(capsys, "report", str(record), "--for-provider")
    assert code == 0, err
    assert "worker4" not in pack
    assert ("     1: Dec  2 11:49:53 HOST-REDACTED-1 kernel: [  885.242168] NVRM: GPU 0000:0a:00.0: RmInitAdapter failed! "
            "(0x24:0x72:1568)") in pack
    assert "reproduce on the machine: `sudo dmesg -T | grep -E" in pack
