"""The seeds' monitoring commands as input: `nvidia-smi --query-gpu=... --format=csv -l 5` and
`nvidia-smi dmon` are one GPU's samples over time, judged as a trend (gpu.trend), not one GPU per
row nor only the last sample. Real captures (the H100 bundle's dmon) and named edits of real ones
(tests/fixtures/edited, made by make_edited.py; SOURCES.md says what each changes)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cli_runner import gpuvet
from gpuvet import runner
from gpuvet.probe import smi_table
from gpuvet.probe.errors import CaptureError
from gpuvet.record import MEASURED

FIXTURES = Path(__file__).parent / "fixtures"
EDITED = FIXTURES / "edited"


def trend(record):
    found = [f for f in record.findings if f.check == "gpu.trend"]
    assert len(found) == 1, found
    return found[0]


def test_seed_loop_is_one_gpu_heating_with_its_clock_falling():
    # The seeds' own `--query-gpu=temperature.gpu,power.draw,clocks.gr --format=csv -l 5`: no index column.
    record = runner.inspect([str(EDITED / "csv-h100-load-590.48.01-edited-seed-loop-l5-heating.csv")])
    assert len(record.machine.gpus) == 1  # was "10 x unknown GPU", each PASS
    f = trend(record)
    assert f.status == "fail"
    assert "heating: 59 -> 87 C" in f.summary and "SM clock fell 16% under load (first to last fifth): 1980 -> 1650 MHz" in f.summary
    assert "interval not in the capture" in f.summary
    assert "rows read as samples of one GPU" in record.machine.captures[0]["note"]
    assert record.verdict == "fail"


def test_indexed_loop_with_timestamps_is_one_gpu_over_45_seconds():
    record = runner.inspect([str(EDITED / "csv-h100-load-590.48.01-edited-indexed-loop-l5-heating.csv")])
    assert [g.name for g in record.machine.gpus] == ["NVIDIA H100 80GB HBM3"]
    assert record.machine.gpus[0].thermal.gpu_c == 87  # facts from the last sample
    f = trend(record)
    assert f.status == "fail" and "(45 s)" in f.summary
    series = [s for s in record.series if s["name"] == "capture.telemetry"]
    assert [row[0] for row in series[0]["rows"]][:3] == [0.0, 5.0, 10.0]


def test_dmon_hot_at_full_load_with_the_clock_falling_fails():
    record = runner.inspect([str(EDITED / "dmon-h100-vm-load-590.48.01-edited-hot-clock-falling.txt")])
    assert len(record.machine.gpus) == 1
    f = trend(record)
    assert f.status == "fail"
    assert "reached 90 C" in f.summary and "fell 21%" in f.summary and "1980 -> 1545 MHz" in f.summary


def test_real_dmon_under_load_is_steady_but_not_a_pass_without_a_model_or_limit():
    # dmon names no model and no limit: a GPU held flat under a lowered limit would look the same.
    record = runner.inspect([str(FIXTURES / "smi_text/dmon-h100-vm-load-590.48.01.txt")])
    f = trend(record)
    assert f.status == MEASURED and "power wall is not judged" in f.summary and "--expect" in f.remedy
    assert "5 samples" in f.evidence.measured and "temperature 63 -> 65 C" in f.evidence.measured
    assert f.evidence.expected and "sustained-load and watch rules" in f.evidence.source


def test_real_idle_dmon_is_measured_not_judged():
    record = runner.inspect([str(FIXTURES / "smi_text/dmon-h100-vm-idle-590.48.01.txt")])
    f = trend(record)
    assert f.status == MEASURED and "idle through all 5 samples" in f.summary


def test_snapshot_csv_is_still_one_gpu_per_row_and_no_trend():
    record = runner.inspect([str(FIXTURES / "smi_csv/h100-80gb-hbm3-vm-590.48.01-load.csv")])
    assert len(record.machine.gpus) == 1
    assert not [f for f in record.findings if f.check == "gpu.trend"]


def test_dmon_damaged_cells_are_missing_readings_not_a_traceback():
    samples = smi_table.parse_dmon((EDITED / "dmon-h100-vm-idle-590.48.01-edited-na-nan-inf-sentinel.txt").read_text())
    assert [s["pwr"] for s in samples] == [None] * 5  # N/A, [N/A], nan, inf, 0x7fffffff
    assert [s["gtemp"] for s in samples] == [41] * 5
    record = runner.inspect([str(EDITED / "dmon-h100-vm-idle-590.48.01-edited-na-nan-inf-sentinel.txt")])
    json.dumps(record.to_dict(), allow_nan=False)  # no NaN/inf reaches the record


@pytest.mark.parametrize("index", ["20000000", "2000000000", "1e30"])
def test_gpu_index_too_large_is_refused_in_one_line(capsys, index):
    path = EDITED / f"dmon-h100-vm-idle-590.48.01-edited-gpu-index-{index}.txt"
    started = time.monotonic()
    code, out, err = gpuvet(capsys, "inspect", str(path))
    assert code == 2
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"GPU index '{index}' is not an index 0..1023" in err
    assert time.monotonic() - started < 5  # 20000000 once took 21 s and 820 MB


def test_csv_gpu_index_too_large_is_refused():
    text = (FIXTURES / "smi_csv/h100-80gb-hbm3-vm-590.48.01-load.csv").read_text()
    header, row = text.splitlines()[:2]
    names = [n.strip() for n in header.split(",")]
    cells = row.split(", ")
    cells[names.index("index")] = "2000000000"
    from gpuvet.probe import smi_csv
    with pytest.raises(CaptureError, match="GPU index '2000000000'"):
        smi_csv.parse_smi_csv(header + "\n" + ", ".join(cells) + "\n")


def test_terminal_shows_the_trend_and_one_gpu(capsys):
    code, out, _ = gpuvet(capsys, "inspect", str(EDITED / "csv-h100-load-590.48.01-edited-seed-loop-l5-heating.csv"))
    assert code == 1
    assert "GPUs: 1 x" in out and "gpu.trend" in out and "heating: 59 -> 87 C" in out
