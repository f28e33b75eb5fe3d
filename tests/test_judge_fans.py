"""gpu.fan_failure on real captures: nvidia-smi's ERR! in the Fan column fails, fans answering
pass, a fan at 0% at idle is a GeForce's zero-RPM mode (pass), a passively cooled datacenter GPU
skips; the live NVML path under the replay judges a capture as `inspect` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpuvet import runner

FIXTURES = Path(__file__).parent / "fixtures"
ERR_FAN = FIXTURES / "smi_text" / "default-table-err-fan-525.125.06.txt"  # gpud's testdata: 'ERR!' in the Fan column
IDLE_4080 = FIXTURES / "smi_text" / "q-rtx-4080-super-595.71.05-idle.txt"  # Fan Speed 0 %, idle at 32 C
H100_SXM = FIXTURES / "smi_text" / "q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"  # Fan Speed N/A: passive
DUAL_2080 = FIXTURES / "smi_xml" / "dual-rtx-2080-x8-590.44.01-v13.xml"


def _fans(path: Path) -> list:
    return [f for f in runner.inspect([str(path)]).findings if f.check == "gpu.fan_failure"]


def test_err_in_the_fan_column_fails_and_asks_the_provider():
    (fan,) = _fans(ERR_FAN)
    assert fan.status == "fail" and "ERR!" in fan.summary and fan.action == "ask_provider"
    temperature = [f for f in runner.inspect([str(ERR_FAN)]).findings if f.check == "gpu.temperature"]
    assert all("fan" not in f.summary for f in temperature)  # said once, by the fan's own check


def test_a_fan_at_zero_on_an_idle_geforce_is_its_zero_rpm_mode():
    (fan,) = _fans(IDLE_4080)
    assert fan.status == "pass" and "0%" in fan.summary and fan.evidence.source


def test_a_stopped_fan_on_a_hot_gpu_fails():
    # The idle RTX 4080 SUPER capture, edited in memory: the GPU 5 C from its slowdown temperature
    # while its fan still reads 0% (the healthy card's fan turns long before that).
    from gpuvet import judge

    machine = runner.inspect([str(IDLE_4080)]).machine
    gpu = machine.gpus[0]
    gpu.thermal.slowdown_margin_c = 5.0
    (fan,) = [f for f in judge.judge(machine) if f.check == "gpu.fan_failure"]
    assert fan.status == "fail" and "has stopped" in fan.summary


def test_a_passively_cooled_gpu_skips_saying_why():
    fans = _fans(H100_SXM)
    assert len(fans) == 8 and {f.status for f in fans} == {"skip"} and "passively cooled" in fans[0].summary


def test_the_live_path_under_the_replay_judges_fans_as_inspect_does(tmp_path):
    out = tmp_path / "run.json"
    done = subprocess.run([sys.executable, "-m", "gpuvet", "run", "--quick", "--no-save", "--out", str(out)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "GPUVET_NVML_REPLAY": str(DUAL_2080)}, stdin=subprocess.DEVNULL)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    live = [(f["subject"], f["status"], f["summary"]) for f in json.loads(out.read_text())["findings"]
            if f["check"] == "gpu.fan_failure"]
    inspected = [(f.subject, f.status, f.summary) for f in _fans(DUAL_2080)]
    assert live == inspected and len(live) == 2 and {s for _, s, _ in live} == {"pass"}
