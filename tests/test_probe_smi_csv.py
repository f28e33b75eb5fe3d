"""nvidia-smi --query-gpu CSV captures (tests/fixtures/smi_csv/, see SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvet.probe.errors import CaptureError
from gpuvet.probe.smi_csv import looks_like_smi_csv, parse_smi_csv

FIXTURES = Path(__file__).parent / "fixtures"
CSV = FIXTURES / "smi_csv"


def parse(name: str):
    return parse_smi_csv((CSV / name).read_text())


def test_l40s_identity_power_ecc_and_link():
    driver, gpus = parse("l40s-vm-595.80-idle.csv")
    assert driver.version == "595.80"
    assert len(gpus) == 1
    gpu = gpus[0]
    assert (gpu.index, gpu.name, gpu.compute_capability) == (0, "NVIDIA L40S", "8.9")
    assert gpu.pcie.bus_id == "0000:01:00.0"
    assert gpu.vbios == "95.02.66.00.02"
    assert (gpu.memory_total_mib, gpu.memory_reserved_mib) == (46068, 609)
    p = gpu.power
    assert (p.limit_w, p.enforced_limit_w, p.default_limit_w, p.min_limit_w, p.max_limit_w) == (
        350.0, 350.0, 350.0, 100.0, 350.0,
    )
    assert (gpu.ecc.enabled, gpu.ecc.pending_enabled) == (True, True)
    assert (gpu.ecc.volatile_uncorrected, gpu.ecc.aggregate_corrected) == (0, 0)
    assert (gpu.ecc.remapped_rows_pending, gpu.ecc.remapped_rows_failure) == (False, False)
    (link,) = gpu.pcie.readings
    assert (link.current_gen, link.max_gen, link.current_width, link.max_width) == (4, 4, 16, 16)
    assert link.source == "nvidia-smi"
    assert gpu.pcie.device_max_gen == 4
    assert gpu.pcie.host_max_gen is None  # "[N/A]" in this VM
    assert gpu.thermal.memory_c is None  # GDDR6: "N/A"
    assert gpu.mig_enabled is None  # "[N/A]": no MIG on L40S


def test_h100_idle_versus_load():
    _, (idle,) = parse("h100-80gb-hbm3-vm-590.48.01-idle.csv")
    _, (load,) = parse("h100-80gb-hbm3-vm-590.48.01-load.csv")
    assert (idle.power.draw_w, load.power.draw_w) == (69.85, 631.95)
    assert (idle.utilization_pct, load.utilization_pct) == (0, 100)
    assert (idle.memory_used_mib, load.memory_used_mib) == (0, 19818)
    assert (idle.clocks.sm_mhz, load.clocks.sm_mhz) == (345, 1980)
    assert (idle.thermal.gpu_c, load.thermal.gpu_c) == (41.0, 59.0)
    assert idle.clocks.event_reasons == ["gpu_idle"]  # active mask 0x...01
    assert load.clocks.event_reasons == []  # mask 0: nothing holds the clocks back
    for gpu in (idle, load):
        assert gpu.name == "NVIDIA H100 80GB HBM3"
        assert gpu.power.enforced_limit_w == 700.0
        assert gpu.clocks.max_sm_mhz == 1980
        assert gpu.memory_total_mib == 81559
        assert gpu.mig_enabled is False
        assert gpu.persistence_mode is True
        assert (gpu.pcie.readings[0].current_gen, gpu.pcie.readings[0].current_width) == (5, 16)
        assert gpu.thermal.memory_c is not None  # HBM3 reports its temperature


def test_h100_tlimit_gives_the_slowdown_margin():
    _, (idle,) = parse("h100-80gb-hbm3-vm-590.48.01-idle.csv")
    _, (load,) = parse("h100-80gb-hbm3-vm-590.48.01-load.csv")
    assert (idle.thermal.slowdown_margin_c, load.thermal.slowdown_margin_c) == (46.0, 26.0)


def test_h200_mig_and_na_utilization():
    _, (gpu,) = parse("h200-mig-vm-590.48.01-idle.csv")
    assert (gpu.mig_enabled, gpu.mig_pending) == (True, True)
    assert gpu.utilization_pct is None  # "[N/A]" with MIG on
    assert "utilization_pct" not in gpu.unavailable  # plain N/A says nothing more
    assert gpu.ecc.remapped_rows_correctable is None  # "[N/A]" in MIG mode


def test_geforce_idle_sw_power_cap_and_link_limits():
    _, (gpu,) = parse("rtx-2080-super-595.71.05-idle.csv")
    assert gpu.name == "NVIDIA GeForce RTX 2080 SUPER"  # full name, unlike the default table
    assert gpu.pstate == 8
    assert gpu.clocks.event_reasons == ["sw_power_cap"]  # mask 0x...04 while idle
    (link,) = gpu.pcie.readings
    assert (link.current_gen, link.max_gen) == (1, 3)
    assert (gpu.pcie.device_max_gen, gpu.pcie.host_max_gen) == (3, 4)
    assert gpu.ecc.enabled is None  # GeForce: "[N/A]"
    assert gpu.serial is None


def test_deprecated_fields_keep_their_reason():
    _, (gpu,) = parse("rtx-4080-super-595.71.05-idle.csv")
    assert gpu.clocks.applications_graphics_mhz is None
    assert gpu.unavailable["clocks.applications_graphics_mhz"] == "deprecated by this driver"
    assert "ecc.enabled" not in gpu.unavailable  # "[N/A]" is not worth a reason


def test_kmd_version_column_of_newer_drivers():
    driver, (gpu,) = parse("rtx-2080-super-610.57.04-idle.csv")
    assert driver.version == "610.57.04"
    assert gpu.clocks.event_reasons == ["gpu_idle"]


def test_windows_driver_model():
    _, (gpu,) = parse("rtx-2080-super-windows-610.62-idle.csv")
    assert gpu.driver_model == "WDDM"
    assert gpu.persistence_mode is None  # "[N/A]" on Windows
    assert gpu.pcie.bus_id == "0000:0c:00.0"


def test_noheader_capture_is_refused_with_a_reason():
    lines = (CSV / "l40s-vm-595.80-idle.csv").read_text().splitlines()
    noheader = "\n".join(lines[1:]) + "\n"
    assert not looks_like_smi_csv(noheader)
    with pytest.raises(CaptureError, match="noheader"):
        parse_smi_csv(noheader)


def test_other_query_csv_is_not_a_gpu_query():
    # The --query-compute-apps header from the H100 bundle.
    header = "timestamp, gpu_name, gpu_bus_id, gpu_serial, gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n"
    assert not looks_like_smi_csv(header)
    with pytest.raises(CaptureError):
        parse_smi_csv(header)


def test_old_throttle_name_and_several_gpus():
    # Hand-written: a short selection with the pre-535 field name and two rows.
    text = (
        "index, name, pci.bus_id, clocks_throttle_reasons.active, power.draw [W], memory.total [MiB]\n"
        "0, Tesla V100-SXM2-16GB, 00000000:00:1E.0, 0x0000000000000004, 250.00 W, 16160 MiB\n"
        "1, Tesla V100-SXM2-16GB, 00000001:00:1F.0, 0x0000000000000000, [N/A], 16160 MiB\n"
    )
    assert looks_like_smi_csv(text)
    _, gpus = parse_smi_csv(text)
    assert [g.index for g in gpus] == [0, 1]
    assert [g.pcie.bus_id for g in gpus] == ["0000:00:1e.0", "0001:00:1f.0"]
    assert [g.clocks.event_reasons for g in gpus] == [["sw_power_cap"], []]
    assert [g.power.draw_w for g in gpus] == [250.0, None]
    assert gpus[0].pcie.readings == []  # no link fields queried


def test_row_with_missing_values_is_refused():
    text = "index, name, pci.bus_id\n0, NVIDIA L40S\n1, NVIDIA L40S, 00000000:02:00.0\n"
    with pytest.raises(CaptureError, match="2 values for 3"):
        parse_smi_csv(text)


def test_csv_cut_inside_its_last_row_says_truncated():
    real = (FIXTURES / "smi_csv" / "l40s-vm-595.80-idle.csv").read_text()
    synthetic_cut = real[: real.rindex(",")]  # the last value and what follows it dropped
    with pytest.raises(CaptureError, match=r"truncated --query-gpu CSV: its last row has \d+ of \d+ values"):
        parse_smi_csv(synthetic_cut)


def fixture_files():
    return sorted(p for p in FIXTURES.rglob("*") if p.is_file())


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_looks_like_claims_only_query_gpu_csv(path):
    text = path.read_text(errors="replace")
    is_csv = path.parent.name == "smi_csv" or (path.parent.name == "edited" and path.suffix == ".csv")
    assert looks_like_smi_csv(text) == is_csv


def test_a_one_gpu_loop_repeating_index_0_is_one_gpu(tmp_path):
    # SYNTHETIC rows in the shape `nvidia-smi --query-gpu=index,timestamp,temperature.gpu,power.draw,clocks.gr
    # --format=csv -l 5` prints on one GPU: its index 0 repeats. A zeroed value is how collectors redact a
    # serial or a UUID, never an index: read as redacted, the loop became three GPUs (issue 25).
    from gpuvet import runner

    loop = tmp_path / "loop.csv"
    loop.write_text("index, timestamp, temperature.gpu, power.draw [W], clocks.gr [MHz]\n"
                    "0, 2024/11/14 05:34:15.123, 61, 318.20 W, 2235 MHz\n"
                    "0, 2024/11/14 05:34:20.123, 62, 320.10 W, 2235 MHz\n"
                    "0, 2024/11/14 05:34:25.123, 62, 321.55 W, 2250 MHz\n")
    assert [g.index for g in runner.inspect([str(loop)]).machine.gpus] == [0]
