"""Real faults through every fleet output: each capture goes through `gpuvet health --json
--textfile DIR` once, and the action it asks for is read back from the verdict object, from the
summary line (node-problem-detector's message, --brief), from the Slurm drain reason made of it,
and from DIR/gpuvet.prom, which Prometheus' own promtool must accept as it is.

The captures are real (tests/fixtures/SOURCES.md) unless their name says `edited`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuvet.actions import NAMES
from gpuvet.report.health import drain_reason

FIXTURES = Path(__file__).parent / "fixtures"
POWER_BRAKE = FIXTURES / "smi_text" / "q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"  # gpu2: HW power brake
HEALTHY = FIXTURES / "smi_text" / "q-8x-a100-sxm4-40gb-azure-ndv4-460.32.03.txt"
KERNEL_LOG = FIXTURES / "kernel_log"
# A summary line as a remediator reads it: "gpuvet: CHECK ACTION[ GPU][ (+N more)]: what failed".
SUMMARY = re.compile(r"^gpuvet: (\S+) ([a-z_]+)[ :]")

# (captures, check, action, gpu that fails or None): what a remediator is told to do.
FAULTS = {
    # Xid 79, GPU fallen off the bus (a K40m's dmesg with the PCIe surprise-down before it): NVIDIA's RESTART_BM.
    "xid79": ([KERNEL_LOG / "dmesg-tesla-k40m-aer-surprise-down-xid79-390.30.txt"], "gpu.xid", "reboot_node", None),
    # Xid 79 on the H100 box's gpu3 (its bus edited in), beside gpu2's power brake: the worst action wins.
    "xid79-on-gpu3": ([POWER_BRAKE, FIXTURES / "edited" / "dmesg-tesla-k40m-xid79-390.30-edited-bus-86-as-h100-gpu3.txt"],
                      "gpu.xid", "reboot_node", "3"),
    # SXid 12028 from an NVSwitch (a fabric error, gpud#338).
    "sxid-fabric": ([KERNEL_LOG / "dmesg-iso-sxid-12028-nvswitch.txt"], "gpu.xid", "reboot_node", None),
    # Xid 154 "GPU recovery action changed ... Reset Required" after a GSP timeout (Talos).
    "xid154-reset": ([KERNEL_LOG / "talos-dmesg-gsp-timeout-xid154-reset-required.txt"], "gpu.xid", "reset_gpu", None),
    # The driver's NV_ERR_RESET_REQUIRED.
    "reset-required": ([KERNEL_LOG / "dmesg-ctime-nv-err-reset-required-gsp.txt"], "gpu.xid", "reset_gpu", None),
    # ECC and remapped-row fields the driver answered "Unknown Error" for (edited from the H100 report).
    "ecc-unknown": ([FIXTURES / "edited" / "q-8x-h100-sxm-vm-535.183.01-edited-ecc-unknown-error.txt"],
                    "gpu.ecc", "reset_gpu", None),
    # HW power brake on gpu2: a limit outside the machine.
    "power-brake": ([POWER_BRAKE], "gpu.throttle", "ask_provider", "2"),
}


def _health(tmp_path: Path, captures: list[Path]) -> tuple[int, dict, str]:
    args = [a for c in captures for a in ("--from", str(c))]
    done = subprocess.run([sys.executable, "-m", "gpuvet", "health", "--no-save", "--json", "--textfile", str(tmp_path),
                           *args], check=False, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.stderr == "", done.stderr
    return done.returncode, json.loads(done.stdout), (tmp_path / "gpuvet.prom").read_text()


def _samples(text: str) -> dict[str, list]:
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: `apt-get install -y prometheus` (scripts/install-test-packages installs it)")
    return path


def promtool_accepts(text: str) -> None:
    done = subprocess.run([_promtool(), "check", "metrics"], input=text, check=False, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_names_its_action_in_every_output(tmp_path, fault):
    captures, check, action, gpu = FAULTS[fault]
    code, verdict, prom = _health(tmp_path, captures)
    # The verdict object (gpuvet.health/1).
    assert code == verdict["exit_code"] == 1 and verdict["status"] == "problem"
    assert verdict["action"] == action
    assert any(f["check"] == check and f["status"] == "fail" and f["action"] == action for f in verdict["findings"])
    # node-problem-detector's message and --brief: "gpuvet: CHECK ACTION ...".
    assert SUMMARY.match(verdict["summary"]).groups() == (check, action)
    # Slurm's drain reason: the check and the action in the 20 characters sinfo -R shows.
    assert drain_reason(verdict["summary"]).startswith(f"{check} {action}")
    # The textfile: Prometheus' own checker, then the series a rule or a remediator reads.
    promtool_accepts(prom)
    samples = _samples(prom)
    assert {s.labels["action"]: s.value for s in samples["gpuvet_health_action"]} == {n: float(n == action) for n in NAMES}
    assert samples["gpuvet_health_action_rank"][0].value == NAMES.index(action)
    assert {s.labels["status"]: s.value for s in samples["gpuvet_health_status"]} == \
        {"healthy": 0.0, "problem": 1.0, "unknown": 0.0}
    failing = [s for s in samples.get("gpuvet_health_check_ok", []) if s.value == 0]
    assert any(s.labels["check"] == check and s.labels["action"] == action for s in failing)
    if gpu is not None:
        by_gpu = {s.labels["gpu"]: s for s in samples["gpuvet_health_gpu_ok"]}
        assert by_gpu[gpu].value == 0 and by_gpu[gpu].labels["UUID"].startswith("GPU-")
        assert by_gpu[gpu].labels["action"] == action
        assert {g for g, s in by_gpu.items() if s.value == 0} == {str(g["index"]) for g in verdict["gpus"]
                                                                  if g["status"] == "fail"}


def test_a_healthy_node_writes_healthy_gauges_and_lists_what_it_could_not_read(tmp_path):
    code, verdict, prom = _health(tmp_path, [HEALTHY])
    assert code == 0 and verdict["action"] == "none"
    promtool_accepts(prom)
    samples = _samples(prom)
    assert [s.labels["status"] for s in samples["gpuvet_health_status"] if s.value == 1] == ["healthy"]
    assert [s.value for s in samples["gpuvet_health_gpu_ok"]] == [1.0] * 8
    assert sorted(s.labels["gpu"] for s in samples["gpuvet_health_gpu_ok"]) == [str(i) for i in range(8)]
    assert all(s.value == 1 for s in samples["gpuvet_health_check_ok"])
    # No kernel log among the captures: gpu.xid is unread, never a passing gauge.
    assert any(s.labels["check"] == "gpu.xid" for s in samples["gpuvet_health_check_unread"])
    assert not any(s.labels["check"] == "gpu.xid" for s in samples["gpuvet_health_check_ok"])
    info = samples["gpuvet_health_info"][0].labels
    assert info["summary"] == verdict["summary"] == "gpuvet: healthy, 8 GPU(s)"
    assert samples["gpuvet_health_last_run_timestamp_seconds"][0].value > 1.7e9


def test_the_textfile_is_replaced_whole_and_leaves_nothing_else(tmp_path):
    _health(tmp_path, [POWER_BRAKE])
    first = (tmp_path / "gpuvet.prom").stat().st_ino
    _health(tmp_path, [HEALTHY])
    assert (tmp_path / "gpuvet.prom").stat().st_ino != first  # a new file renamed over the old one
    assert [p.name for p in tmp_path.iterdir()] == ["gpuvet.prom"]  # no temporary file left behind
    samples = _samples((tmp_path / "gpuvet.prom").read_text())
    assert all(s.value == 1 for s in samples["gpuvet_health_gpu_ok"])  # the power brake's 0 is gone


def test_a_missing_textfile_folder_is_refused_before_any_work(tmp_path):
    done = subprocess.run([sys.executable, "-m", "gpuvet", "health", "--no-save", "--from", str(HEALTHY), "--textfile",
                           str(tmp_path / "nope")], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--textfile" in done.stderr and "no such folder" in done.stderr
