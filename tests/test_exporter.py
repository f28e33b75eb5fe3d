"""The Prometheus endpoint of `gpuvet watch`: names and labels as dcgm-exporter's, the diagnosis as a
state set, and a REAL Prometheus server (Debian's prometheus package) scraping it on loopback.

GPU readings come from test_telemetry's stand-in NVML through the watch's Monitor, driven by hand.
Waiting is on what the servers answer, with deadlines, never a fixed sleep.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuvet.watch import exporter as ex
from gpuvet import watch as w
from gpuvet.facts import Host, Machine
from gpuvet.judge.diagnose import GPU_STATES
from test_watch import _Clock, _machine, _ticks, _two_gpus


@pytest.mark.parametrize("spec, expected", [
    ("9400", ("127.0.0.1", 9400)),
    ("0.0.0.0:9401", ("0.0.0.0", 9401)),
    ("localhost:0", ("localhost", 0)),
    ("[::1]:9400", ("::1", 9400)),
    (":9400", ("127.0.0.1", 9400)),
    ("0.0.0.0", ("0.0.0.0", 9400)),  # a host alone: dcgm-exporter's port
    ("localhost", ("localhost", 9400)),
    ("[::]", ("::", 9400)),
])
def test_listen_spec(spec, expected):
    assert ex.parse_listen(spec) == expected


@pytest.mark.parametrize("spec", ["", "http", "host:", "1.2.3.4:99999", "::1:9400"])
def test_bad_listen_spec(spec):
    with pytest.raises(ValueError):
        ex.parse_listen(spec)


def _snapshot(monkeypatch, minor_numbers: dict[str, int] | None = None, machine: Machine | None = None,
              **answers) -> w.Snapshot:
    """Three ticks of the watch on the two stand-in GPUs; `answers`: more NVML calls of the stand-in."""
    import pynvml

    _two_gpus(monkeypatch)
    if minor_numbers is not None:
        answers["nvmlDeviceGetMinorNumber"] = lambda handle: minor_numbers[handle]
    for name, answer in answers.items():
        monkeypatch.setattr(pynvml, name, answer, raising=False)
    clock = _Clock()
    monitor = w.Monitor(interval_s=1.0, machine=machine or _machine(), threaded=False, clock=clock)
    monitor.start()
    try:
        return _ticks(monitor, clock, 3)
    finally:
        monitor.close()


def _samples(text: bytes) -> dict[str, list]:
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def test_gpu_metrics_carry_dcgm_names_and_labels(monkeypatch):
    exporter = ex.Exporter()
    exporter.update(_snapshot(monkeypatch, minor_numbers={"h0": 3, "h1": 7}))
    samples = _samples(exporter.text())
    (power0, power1) = samples["DCGM_FI_DEV_POWER_USAGE"]
    assert power0.labels == {"gpu": "0", "UUID": "GPU-00000000", "pci_bus_id": "0000:00:00.0", "device": "nvidia3",
                             "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "test-node", "DCGM_FI_DRIVER_VERSION": ""}
    assert power0.value == 612.345 and power1.labels["device"] == "nvidia7"  # /dev/nvidiaN, as dcgm-exporter names it
    values = {name: samples[name][0].value for name in (
        "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MAX_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK",
        "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SLOWDOWN_TEMP", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF",
        "DCGM_FI_DEV_PCIE_LINK_GEN", "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "DCGM_FI_DEV_POWER_VIOLATION",
        "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "gpuvet_sm_clock_ratio", "gpuvet_temp_slowdown_margin_celsius")}
    assert values == {"DCGM_FI_DEV_GPU_UTIL": 99, "DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_MAX_SM_CLOCK": 1980,
                      "DCGM_FI_DEV_MEM_CLOCK": 2619, "DCGM_FI_DEV_GPU_TEMP": 71, "DCGM_FI_DEV_SLOWDOWN_TEMP": 88,
                      "DCGM_FI_DEV_FB_USED": 3072, "DCGM_FI_DEV_FB_FREE": 81559 - 3072,
                      "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": 700, "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": 700,
                      "DCGM_FI_DEV_PCIE_LINK_GEN": 5, "DCGM_FI_DEV_PCIE_LINK_WIDTH": 16,
                      "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": 1500, "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": 300,
                      "DCGM_FI_DEV_POWER_VIOLATION": 5_000_000_000, "DCGM_FI_DEV_THERMAL_VIOLATION": 0,  # ns, as DCGM
                      "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0x44, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0x44,
                      "gpuvet_sm_clock_ratio": 1.0, "gpuvet_temp_slowdown_margin_celsius": 17}
    # DCGM's equivalents replaced these gpuvet names.
    for gone in ("gpuvet_sm_clock_max_mhz", "gpuvet_power_limit_watts", "gpuvet_power_default_limit_watts",
                 "gpuvet_pcie_link_gen", "gpuvet_pcie_link_width", "gpuvet_clock_violation_seconds_total"):
        assert gone not in samples
    reasons = {(s.labels["gpu"], s.labels["reason"]): s.value for s in samples["gpuvet_clock_event_reason"]}
    assert reasons[("0", "hw_thermal_slowdown")] == 1 and reasons[("1", "hw_thermal_slowdown")] == 0
    assert reasons[("0", "sw_power_cap")] == 1 and reasons[("0", "gpu_idle")] == 0


def test_dcgm_default_counters_replays_energy_memory_temp_rows_and_the_last_xid(monkeypatch):
    import threading
    import types

    import pynvml

    _two_gpus(monkeypatch)
    second_wait = threading.Event()
    waits = iter([types.SimpleNamespace(device="h1", eventData=79, eventType=pynvml.nvmlEventTypeXidCriticalError)])

    def wait(event_set, timeout_ms):
        for event in waits:
            return event
        second_wait.set()  # the first event has been taken in
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    field = types.SimpleNamespace(nvmlReturn=pynvml.NVML_SUCCESS, value=types.SimpleNamespace(uiVal=54))
    for name, fn in {"nvmlEventSetCreate": lambda: "set", "nvmlDeviceRegisterEvents": lambda h, types_, s: None,
                     "nvmlEventSetWait_v2": wait, "nvmlEventSetFree": lambda s: None,
                     "nvmlDeviceGetIndex": lambda h: int(h[1:]),
                     "nvmlDeviceGetPcieReplayCounter": lambda h: 120 if h == "h0" else 43,
                     "nvmlDeviceGetTotalEnergyConsumption": lambda h: 123_456_789,
                     "nvmlDeviceGetFieldValues": lambda h, ids: [field],
                     "nvmlDeviceGetRemappedRows": lambda h: (2, 1, 0, 0) if h == "h0" else (0, 0, 0, 1)}.items():
        monkeypatch.setattr(pynvml, name, fn, raising=False)
    clock = _Clock()
    monitor = w.Monitor(interval_s=1.0, machine=_machine(), threaded=False, clock=clock)
    monitor.start()
    try:
        assert second_wait.wait(5)
        exporter = ex.Exporter()
        exporter.update(_ticks(monitor, clock, 3))
    finally:
        monitor.close()
    samples = _samples(exporter.text())

    def by_gpu(name: str) -> dict[str, float]:
        return {s.labels["gpu"]: s.value for s in samples[name]}

    assert by_gpu("DCGM_FI_DEV_PCIE_REPLAY_COUNTER") == {"0": 120, "1": 43}
    assert by_gpu("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == {"0": 123_456_789, "1": 123_456_789}  # mJ
    assert by_gpu("DCGM_FI_DEV_MEMORY_TEMP") == {"0": 54, "1": 54}
    assert by_gpu("DCGM_FI_DEV_XID_ERRORS") == {"0": 0, "1": 79}
    assert by_gpu("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS") == {"0": 2, "1": 0}
    assert by_gpu("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS") == {"0": 1, "1": 0}
    assert by_gpu("DCGM_FI_DEV_ROW_REMAP_FAILURE") == {"0": 0, "1": 1}


def _licence(state: int | None, supported: int = 1):
    """nvidia-ml-py's own structure, as nvmlDeviceGetGridLicensableFeatures returns it (None: no feature)."""
    import pynvml

    licence = pynvml.c_nvmlGridLicensableFeatures_v4_t()
    licence.isGridLicenseSupported = supported
    if state is not None:
        licence.licensableFeaturesCount = 1
        licence.gridLicensableFeatures[0].featureCode = pynvml.NVML_GRID_LICENSE_FEATURE_CODE_VGPU
        licence.gridLicensableFeatures[0].featureState = state
    return licence


@pytest.mark.parametrize("state, supported, served", [(1, 1, 1.0), (0, 1, 0.0), (None, 0, 0.0)])
def test_vgpu_license_status_on_a_vgpu_guest_only(monkeypatch, state, supported, served):
    asked = []

    def features(handle):
        asked.append(handle)
        return _licence(state, supported)

    machine = _machine()
    machine.gpus[0].virtualization_mode, machine.gpus[1].virtualization_mode = "vgpu", "passthrough"
    snap = _snapshot(monkeypatch, machine=machine, nvmlDeviceGetGridLicensableFeatures=features)
    exporter = ex.Exporter()
    exporter.update(snap)
    (status,) = _samples(exporter.text())["DCGM_FI_DEV_VGPU_LICENSE_STATUS"]  # gpu1 is no vGPU: no series, not 0
    assert status.labels["gpu"] == "0" and status.value == served
    assert set(asked) == {"h0"}
    assert snap.gpus[1].extras.unavailable["vgpu_license"] == "not available: not a vGPU (virtualization mode passthrough)"


def test_nvlink_bandwidth_total_is_dcgms_rate_and_the_device_falls_back_to_the_index(monkeypatch):
    snap = _snapshot(monkeypatch)  # this stand-in NVML refuses nvmlDeviceGetMinorNumber
    snap.gpus[0].extras.nvlink_tx_bps = snap.gpus[0].extras.nvlink_rx_bps = 100 * 1024 * 1000.0  # 100,000 KiB/s each
    exporter = ex.Exporter()
    exporter.update(snap)
    samples = _samples(exporter.text())
    (nvlink,) = samples["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"]  # gpu1 has no NVLink reading: no sample, not 0
    assert nvlink.labels["gpu"] == "0" and nvlink.value == 200.0  # (TX + RX) KiB/s / 1000, as DCGM computes it
    assert [s.labels["device"] for s in samples["DCGM_FI_DEV_GPU_UTIL"]] == ["nvidia0", "nvidia1"]


def test_diagnosis_is_a_state_set(monkeypatch):
    exporter = ex.Exporter()
    exporter.update(_snapshot(monkeypatch))
    states = {(s.labels["gpu"], s.labels["state"]): s.value for s in _samples(exporter.text())["gpuvet_diagnosis"]}
    assert len(states) == 2 * len(GPU_STATES)
    assert [state for (gpu, state), v in states.items() if v == 1] == ["thermal", "neighbour"]
    assert sum(states.values()) == 2  # exactly one state per GPU


def test_host_metrics_and_why_there_are_no_gpu_metrics_here():
    snap = w.Snapshot(t=time.time(), tick=7, hostname="node-a", interval_s=1.0, gpus=[],
                      gpu_error="no NVIDIA driver", host=w.HostReading(t=time.time(), cpu_pct=37.5, steal_pct=2.0,
                                                                         iowait_pct=0.5, workers=3, workers_cpu_pct=95.0))
    exporter = ex.Exporter()
    exporter.update(snap)
    samples = _samples(exporter.text())
    (up,) = samples["gpuvet_gpu_telemetry_up"]
    assert up.value == 0 and up.labels == {"Hostname": "node-a", "reason": "no NVIDIA driver"}
    assert samples["gpuvet_host_cpu_percent"][0].value == 37.5 and samples["gpuvet_host_cpu_steal_percent"][0].value == 2.0
    assert samples["gpuvet_host_workers"][0].value == 3 and samples["gpuvet_watch_ticks_total"][0].value == 7
    assert "DCGM_FI_DEV_GPU_UTIL" not in samples  # no made-up zeros for GPUs that were not read
    assert "gpuvet_host_disk_read_bytes_per_second" not in samples  # unknown, not 0


def test_nothing_before_the_first_snapshot():
    assert ex.Exporter().text() == b""


def test_serves_on_loopback_and_stops(monkeypatch):
    exporter = ex.Exporter()
    exporter.update(_snapshot(monkeypatch))
    port = exporter.serve("127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            assert answer.status == 200
            sm = _samples(answer.read())["DCGM_FI_DEV_SM_CLOCK"]
            assert [(s.labels["gpu"], s.value) for s in sm] == [("0", 1980), ("1", 1980)]
    finally:
        exporter.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)


def test_watch_refuses_a_port_in_use(capsys):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        assert w.watch(once=True, prometheus=f"127.0.0.1:{port}", machine=Machine(host=Host(hostname="x"))) == w.EXIT_USAGE
        assert "cannot listen there" in capsys.readouterr().err
    finally:
        taken.close()


# -- a real Prometheus scraping the exporter -------------------------------------------------------

def _prometheus() -> str:
    path = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)
    if path is None:
        if os.environ.get("GPUVET_NO_EXTERNAL_TOOLS") == "1":
            pytest.skip("prometheus not installed and GPUVET_NO_EXTERNAL_TOOLS=1")
        pytest.fail("the prometheus server is not installed: `apt-get install -y prometheus` (scripts/test installs it)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    return body["data"]["result"]


def _until(what: str, fn, server: subprocess.Popen, log: Path, timeout_s: float = 60.0):
    """fn() until it returns something truthy; the server's log on failure."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = fn()
        except (urllib.error.URLError, ConnectionError, OSError):
            result = None
        if result:
            return result
        if server.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s (prometheus exit code {server.poll()}); "
                                 f"its log:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def test_a_real_prometheus_scrapes_the_exporter(monkeypatch, tmp_path):
    binary = _prometheus()
    exporter = ex.Exporter()
    exporter.update(_snapshot(monkeypatch))
    metrics_port = exporter.serve("127.0.0.1", 0)
    web_port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: gpuvet\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{metrics_port}']\n"
    )
    log = tmp_path / "prometheus.log"
    with open(log, "w") as log_file:
        server = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                                   f"--web.listen-address=127.0.0.1:{web_port}"], stdout=log_file, stderr=subprocess.STDOUT)
    try:
        power = _until("DCGM_FI_DEV_POWER_USAGE in Prometheus", lambda: _query(web_port, "DCGM_FI_DEV_POWER_USAGE"), server, log)
        by_gpu = {r["metric"]["gpu"]: r for r in power}
        assert sorted(by_gpu) == ["0", "1"]
        assert by_gpu["0"]["metric"]["job"] == "gpuvet" and by_gpu["0"]["metric"]["Hostname"] == "test-node"
        assert float(by_gpu["0"]["value"][1]) == 612.345
        thermal = _query(web_port, 'gpuvet_diagnosis{state="thermal"} == 1')
        assert [r["metric"]["gpu"] for r in thermal] == ["0"]
        assert _query(web_port, "gpuvet_host_memory_total_bytes")  # the host part arrives with the same scrape
        up = _query(web_port, 'up{job="gpuvet"}')
        assert [float(r["value"][1]) for r in up] == [1.0]
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        exporter.close()
