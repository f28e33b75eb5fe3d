"""The live NVML paths (probe.nvml, the telemetry sampler, watch, the exporter) run on real machines
without a GPU: GPUVET_NVML_REPLAY answers every NVML call from a real `nvidia-smi -q -x` capture.

The consistency test is the point: for every XML fixture, the facts the live backend builds through
the replay equal, field by field, the facts the capture parser builds from the same file. A
mismatch is a bug in one of the two backends (or in the replay's reading of nvidia-smi's words).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from cli_runner import gpuvet
from gpuvet.watch import exporter as ex
from gpuvet import watch as w
from gpuvet.facts import Gpu, Machine, to_dict
from gpuvet.probe import live, nvml, nvml_replay, smi_xml
from gpuvet.telemetry import Sampler
from gpuvet.watch.log import snapshot_to_dict
from gpuvet.watch.view import render

FIXTURES = Path(__file__).parent / "fixtures" / "smi_xml"
CAPTURES = sorted(FIXTURES.glob("*.xml"))
ROOT = Path(__file__).parent.parent

# Fields one backend cannot have, and why. Everything else must be equal.
ONE_SIDE_ONLY = {
    "unavailable": "reasons are worded per backend (NVML's error vs what nvidia-smi printed)",
    "pcie.readings[].source": "'nvml' vs 'nvidia-smi' by design",
    "pcie.host_max_gen": "nvidia-smi prints the host's max generation; NVML has no call for it",
}


@pytest.fixture
def replay(monkeypatch):
    """Point every gpuvet module that holds pynvml at the replay of a capture (what the variable
    does at import, for this test only)."""

    def install(path: Path) -> nvml_replay.Replay:
        fake = nvml_replay.load(str(path))
        for name, module in list(sys.modules.items()):
            if name.startswith("gpuvet") and getattr(module, "pynvml", None) is pynvml:
                monkeypatch.setattr(module, "pynvml", fake)
        return fake

    return install


def _comparable(gpu: Gpu, tlimit_margin: float | None) -> dict:
    facts = to_dict(gpu)
    facts.pop("unavailable")
    facts["pcie"].pop("host_max_gen")
    for reading in facts["pcie"]["readings"]:
        reading.pop("source")
    if facts["processes"] is not None:  # NVML lists compute then graphics; nvidia-smi its own order
        facts["processes"] = sorted(facts["processes"], key=lambda p: p["pid"])
    if tlimit_margin is not None:
        # Only T.Limit-relative temperatures: nvidia-smi adds the slowdown offset it prints, which
        # nvidia-ml-py has no call for; NVML gives the margin to T.Limit itself.
        facts["thermal"]["slowdown_margin_c"] = None
    return facts


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.stem)
def test_live_backend_through_the_replay_builds_the_facts_the_parser_builds(replay, path):
    replay(path)
    driver, gpus, _, error = nvml.collect()
    parsed_driver, parsed = smi_xml.parse_smi_xml(path.read_text())
    assert error is None and len(gpus) == len(parsed) >= 1
    assert (driver.version, driver.cuda_version) == (parsed_driver.version, parsed_driver.cuda_version)
    for live_gpu, parsed_gpu in zip(gpus, parsed):
        tlimit = None if parsed_gpu.thermal.slowdown_c is not None else parsed_gpu.thermal.slowdown_margin_c
        assert _comparable(live_gpu, tlimit) == _comparable(parsed_gpu, tlimit)


def test_values_come_in_nvml_units_and_enums(replay):
    fake = replay(FIXTURES / "rtx-3090-swpowercap-590.44.01-v13.xml")
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetEnforcedPowerLimit(h) % 1000 == 0 and fake.nvmlDeviceGetEnforcedPowerLimit(h) > 100_000  # mW
    assert fake.nvmlDeviceGetCurrentClocksEventReasons(h) & pynvml.nvmlClocksEventReasonSwPowerCap
    assert fake.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).total == 24576 * 2**20  # bytes
    assert fake.nvmlDeviceGetBrand(h) == pynvml.NVML_BRAND_GEFORCE
    assert fake.nvmlDeviceGetArchitecture(h) == pynvml.NVML_DEVICE_ARCH_AMPERE
    assert fake.nvmlDeviceGetVirtualizationMode(h) == pynvml.NVML_GPU_VIRTUALIZATION_MODE_NONE


def test_what_the_capture_says_na_raises_the_drivers_error(replay):
    fake = replay(FIXTURES / "a100-sxm4-80gb-mig-4x1g-535.54.03-v12.xml")
    h = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetUtilizationRates(h)  # <gpu_util>N/A</gpu_util> on a MIG GPU
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetRemappedRows(h)  # <remapped_rows>N/A</remapped_rows>
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(len(fake.devices))
    assert fake.nvmlDeviceGetMigMode(h) == [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]


def test_a_power_limit_printed_as_err_reads_as_nvmls_error_not_a_crash(replay, tmp_path):
    # EDITED: a real capture's max power limit as nvidia-smi prints a reading NVML failed ("ERR!").
    # The replay multiplied None by 1000: a TypeError out of the live backend instead of the facts.
    text = (FIXTURES / "rtx-3090-swpowercap-590.44.01-v13.xml").read_text()
    edited = text.replace("<max_power_limit>480.00 W</max_power_limit>", "<max_power_limit>ERR!</max_power_limit>")
    assert edited != text
    path = tmp_path / "rtx-3090-swpowercap-590.44.01-v13-edited-max-power-limit-err.xml"
    path.write_text(edited)
    fake = replay(path)
    with pytest.raises(pynvml.NVMLError_Unknown):
        fake.nvmlDeviceGetPowerManagementLimitConstraints(fake.nvmlDeviceGetHandleByIndex(0))
    _, gpus, _, error = nvml.collect()
    assert error is None and gpus[0].name == "NVIDIA GeForce RTX 3090"
    assert gpus[0].power.max_limit_w is None and gpus[0].power.enforced_limit_w == 350.0
    assert smi_xml.parse_smi_xml(edited)[1][0].power.max_limit_w is None  # as the capture parser reads it


def test_the_record_says_replayed_and_the_machines_sysfs_is_left_out(replay):
    path = FIXTURES / "dual-rtx-a5000-590.44.01-v13.xml"
    replay(path)
    machine = live.collect(steal_window_s=0.0, import_torch=False)
    assert machine.source == f"replay: {path}"
    assert {"path": str(path), "kind": "nvml-replay"} in machine.captures
    assert [g.name for g in machine.gpus] == ["NVIDIA RTX A5000"] * 2
    assert all(r.source == "nvml" for g in machine.gpus for r in g.pcie.readings)


def _gpu_findings(record: dict, tlimit_only: set[str]) -> list[tuple]:
    """Each GPU finding: its verdict, and its words unless it is a SKIP (a SKIP says why a fact is
    missing in the backend's own words: NVML's "not supported" vs "no NVLink data in the capture"),
    or the temperature of a GPU that reports only T.Limit values (see _comparable)."""
    def words(f: dict) -> str | None:
        if f["status"] == "skip" or (f["check"] == "gpu.temperature" and f["subject"] in tlimit_only):
            return None
        return f["summary"]

    return [(f["check"], f["subject"], f["status"], words(f)) for f in record["findings"] if f["subject"].startswith("gpu")]


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.stem)
def test_run_quick_on_the_replay_gives_the_gpus_and_findings_of_inspect(replay, capsys, path):
    code, out, err = gpuvet(capsys, "inspect", str(path), "--json")
    assert code in (0, 1), err
    inspected = json.loads(out)
    replay(path)
    code, out, err = gpuvet(capsys, "run", "--quick", "--json")
    assert code in (0, 1), err
    replayed = json.loads(out)
    assert replayed["source"] == f"replay: {path}"
    names = lambda r: [(g["index"], g["name"], g["uuid"], g["memory_total_mib"]) for g in r["machine"]["gpus"]]  # noqa: E731
    assert names(replayed) == names(inspected)
    _, parsed = smi_xml.parse_smi_xml(path.read_text())
    tlimit_only = {f"gpu{g.index}" for g in parsed if g.thermal.slowdown_c is None and g.thermal.slowdown_margin_c is not None}
    assert _gpu_findings(replayed, tlimit_only) == _gpu_findings(inspected, tlimit_only)


def test_the_variable_switches_a_real_process_onto_the_capture(tmp_path):
    path = FIXTURES / "rtx-3090-swpowercap-590.44.01-v13.xml"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "GPUVET_NVML_REPLAY": str(path)}
    done = subprocess.run([sys.executable, "-m", "gpuvet", "watch", "--once", "--json"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (gpu,) = json.loads(done.stdout)["gpus"]
    assert gpu["name"] == "NVIDIA GeForce RTX 3090"


def test_a_file_that_is_no_capture_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "GPUVET_NVML_REPLAY": str(bad)}
    done = subprocess.run([sys.executable, "-m", "gpuvet", "run", "--quick"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"gpuvet: GPUVET_NVML_REPLAY={bad}: not an `nvidia-smi -q -x` capture (the NVML replay needs one)"]


# -- the sampler, watch and the exporter on each recorded machine ------------------------------

@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.stem)
def test_sampler_reads_what_the_capture_shows(replay, path):
    replay(path)
    _, parsed = smi_xml.parse_smi_xml(path.read_text())
    sampler = Sampler(None, interval_s=1.0)
    try:
        assert sampler.open(), sampler.error
        samples = sampler.sample_once()
    finally:
        sampler.stop()
    assert sorted(samples) == [g.index for g in parsed]
    for gpu in parsed:
        s = samples[gpu.index]
        assert s.power_w == gpu.power.draw_w and s.power_limit_w == gpu.power.enforced_limit_w
        assert s.temp_c == gpu.thermal.gpu_c and s.util_pct == gpu.utilization_pct
        assert s.sm_mhz == gpu.clocks.sm_mhz and s.mem_used_mib == gpu.memory_used_mib
        link = next(iter(gpu.pcie.readings), None)
        assert s.pcie_width == (link.current_width if link else None)


def _snapshot(path: Path) -> w.Snapshot:
    machine = live.collect(steal_window_s=0.0, import_torch=False)
    monitor = w.Monitor(interval_s=1.0, machine=machine, threaded=False)
    monitor.start()
    try:
        return monitor.tick()
    finally:
        monitor.close()


def _metric(text: bytes, name: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {s.labels.get("gpu", ""): s.value for f in text_string_to_metric_families(text.decode())
            for s in f.samples if s.name == name}


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.stem)
def test_watch_and_exporter_show_each_machine_as_its_capture_does(replay, path):
    replay(path)
    _, parsed = smi_xml.parse_smi_xml(path.read_text())
    snap = _snapshot(path)
    exporter = ex.Exporter()
    exporter.update(snap)
    text = exporter.text()
    assert [v.name for v in snap.gpus] == [g.name for g in parsed]
    power = _metric(text, "DCGM_FI_DEV_POWER_USAGE")
    limit = _metric(text, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT")
    reasons = _metric(text, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
    for view, gpu in zip(snap.gpus, parsed):
        key = str(gpu.index)
        assert power.get(key) == gpu.power.draw_w and limit.get(key) == gpu.power.enforced_limit_w
        if gpu.clocks.event_reasons is not None:
            assert sorted(view.reasons) == sorted(gpu.clocks.event_reasons)
            assert ("sw_power_cap" in gpu.clocks.event_reasons) == bool(int(reasons[key]) & 0x4)


def _licence_status(path: Path) -> tuple[dict[str, float], dict[str, str]]:
    snap = _snapshot(path)
    exporter = ex.Exporter()
    exporter.update(snap)
    return _metric(exporter.text(), "DCGM_FI_DEV_VGPU_LICENSE_STATUS"), snap.gpus[0].extras.unavailable


def test_a_licence_section_on_a_gpu_that_is_no_vgpu_serves_no_vgpu_license_status(replay):
    """The real T4 report has a licence section ('NVIDIA Virtual Applications', 'Licensed') but the
    GPU is no vGPU (virtualization None): no series (not a 0), and the reason."""
    replay(FIXTURES / "tesla-t4-windows-wddm-512.78-v11.xml")
    served, unavailable = _licence_status(FIXTURES)
    assert served == {} and unavailable["vgpu_license"] == "not available: not a vGPU (virtualization mode none)"


def test_a_licensed_vgpu_guest_serves_vgpu_license_status_1(replay):
    replay(FIXTURES.parent / "edited/tesla-t4-windows-wddm-512.78-v11-edited-virtualization-vgpu.xml")
    served, unavailable = _licence_status(FIXTURES)
    assert served == {"0": 1.0} and "vgpu_license" not in unavailable


def test_a_power_capped_gpu_shows_power_capped(replay):
    """The capture's GPU has SW Power Cap active (at idle, its limit the default one): watch shows
    the reason, and does not call it a lowered power limit, which it is not."""
    replay(FIXTURES / "rtx-3090-swpowercap-590.44.01-v13.xml")
    snap = _snapshot(FIXTURES)
    (view,) = snap.gpus
    assert view.reasons == ["sw_power_cap"] and snap.source.startswith("replay: ")
    assert view.diagnosis.state != "power_capped"
    assert "sw_power_cap" in render_text(snap)


def test_a_mig_gpu_shows_as_mig(replay):
    replay(FIXTURES / "a100-sxm4-80gb-mig-4x1g-535.54.03-v12.xml")
    snap = _snapshot(FIXTURES)
    assert [v.mig_instances for v in snap.gpus] == [4]
    data = snapshot_to_dict(snap)
    assert [g["mig_instances"] for g in data["gpus"]] == [4] and data["source"].startswith("replay: ")
    assert "MIG: 4 instance(s)" in render_text(snap)


def render_text(snap: w.Snapshot) -> str:
    from rich.console import Console

    console = Console(width=200, record=True, file=open(os.devnull, "w"))
    console.print(render(snap, interactive=False))
    return console.export_text()
