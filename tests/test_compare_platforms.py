"""Four machines on two platforms: keep the cheapest (issue 29). Four real captures (8x H100, 8x
RTX 4090, 8x A100 Azure, an L40S VM) judged by `gpuvet inspect`, stored with labels that name
their platform ("autodl/4090-A") and prices in CNY; the sustained TFLOPS a capture cannot have
are SYNTHETIC, added per GPU, and the 4090 machine is measured twice."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from cli_runner import gpuvet

from gpuvet import runner
from gpuvet.record import Measurement, RunRecord
from gpuvet.store import Store

FIXTURES = Path(__file__).parent / "fixtures"
MACHINES = {  # label: (capture, synthetic sustained TFLOPS per GPU, CNY per hour)
    "autodl/4090-A": ("smi_text/q-8x-rtx4090-all-idle-535.154.05.txt", 150.0, 16.0),
    "autodl/h100-B": ("smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt", 650.0, 140.0),
    "vast/a100-C": ("smi_text/q-8x-a100-sxm4-40gb-azure-ndv4-460.32.03.txt", 250.0, 70.0),
    "vast/l40s-D": ("bundles/l40s-vm-595.80.txt", 300.0, 12.0),
}


def measured(capture: str, tflops: float, started_at: str) -> RunRecord:
    record = runner.inspect([str(FIXTURES / capture)])
    record.started_at = started_at
    record.measurements += [Measurement("sustained.tflops", tflops, "TFLOPS", f"gpu{g.index}") for g in record.machine.gpus]
    record.options["synthetic"] = True
    return record


@pytest.fixture
def db(tmp_path) -> str:
    path = str(tmp_path / "runs.sqlite3")
    with Store(path) as store:
        for day, (label, (capture, tflops, price)) in enumerate(MACHINES.items(), start=1):
            store.save(measured(capture, tflops, f"2026-11-0{day}T10:00:00Z"), label=label, price_per_hour=price)
        again = measured(MACHINES["autodl/4090-A"][0], 140.0, "2026-11-09T03:00:00Z")  # the same 4090s, a night later
        store.save(copy.deepcopy(again), label="autodl/4090-A", price_per_hour=16.0)
    return path


def test_two_platforms_compared_in_cny_by_their_cheapest_machine(capsys, db):
    code, out, err = gpuvet(capsys, "compare", "autodl", "vast", "--currency", "CNY", "--json", "--db", db)
    assert code == 0, err
    data = json.loads(out)
    assert [run["name"] for run in data["runs"]] == ["#1+#5 autodl/4090-A", "#2 autodl/h100-B", "#3 vast/a100-C",
                                                     "#4 vast/l40s-D"]  # one machine measured twice is one column
    assert data["currency"] == "CNY" and data["currency_symbol"] == "¥"
    sustained = next(row for row in data["costs"] if row["name"] == "usd_per_pflop_hour_sustained")
    assert sustained["unit"] == "CNY" and sustained["label"] == "CNY per PFLOP-hour (sustained)"
    assert "¥" in data["verdict"] and "$" not in data["verdict"]
    # Per PFLOP-hour: the 4090s ¥16 / (8 x median 145 TFLOPS) = ¥13.79, the H100s ¥26.92, the A100s ¥35.00,
    # the one L40S ¥40.00: autodl is the cheaper platform, by its 4090 machine.
    assert data["platforms"] == ["autodl: cheapest machine #1+#5 autodl/4090-A at ¥13.79 per PFLOP-hour (sustained) "
                                 "(2 machines compared)",
                                 "vast: cheapest machine #3 vast/a100-C at ¥35.00 per PFLOP-hour (sustained) "
                                 "(2 machines compared)"]
    merged = next(note for note in data["notes"] if note.startswith("#1+#5 autodl/4090-A: 2 runs of one machine"))
    assert "sustained 140-150 TFLOPS (spread 6.9%)" in merged


def test_a_label_with_a_slash_is_a_label_not_a_file_and_prices_keep_their_symbol(capsys, db):
    code, out, err = gpuvet(capsys, "compare", "autodl/4090-A", "vast/l40s-D", "--price", "vast/l40s-D=¥24", "--json", "--db", db)
    assert code == 0, err
    data = json.loads(out)
    assert data["currency"] == "CNY"  # from the price's own symbol
    assert [run["price_per_hour"] for run in data["runs"]] == [16.0, 24.0]
    code, _, err = gpuvet(capsys, "compare", "autodl", "--currency", "CNY", "--price", "autodl/h100-B=$20", "--db", db)
    assert code == 2 and "prices in CNY, USD: give every price in one currency" in err


def test_each_run_keeps_a_machines_runs_apart(capsys, db):
    code, out, err = gpuvet(capsys, "compare", "autodl/4090-A", "--each-run", "--json", "--db", db)
    assert code == 0, err
    assert [run["name"] for run in json.loads(out)["runs"]] == ["#1 autodl/4090-A", "#5 autodl/4090-A"]


def test_a_job_timed_on_a_labelled_machine_is_priced_on_the_others_as_the_readme_shows(capsys, db):
    code, out, err = gpuvet(capsys, "compare", "autodl/4090-A", "vast/a100-C", "--job", "8 h on autodl/4090-A",
                            "--currency", "CNY", "--json", "--db", db)
    assert code == 0, err
    job = json.loads(out)["job"]
    assert job["reference"] == "#1+#5 autodl/4090-A" and job["hours"][0] == 8.0
    assert job["hours"][1] == pytest.approx(8 * 145 / 250)  # the A100s do it in 4.6 h
    assert job["cost_usd"] == [pytest.approx(8 * 16.0), pytest.approx(8 * 145 / 250 * 70.0)]  # in CNY, as asked


def test_the_tables_a_person_reads_show_the_prices_currency(capsys, db):
    # The terminal table and the Markdown one (a support ticket): prices, costs and the ranking in ¥.
    for fmt in ([], ["--md"]):
        code, out, err = gpuvet(capsys, "compare", "autodl", "vast", "--currency", "CNY", *fmt, "--db", db)
        assert code == 0, err
        assert "¥16.00/h" in out and "¥13.79" in out and "$" not in out, fmt
