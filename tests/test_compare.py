"""Runs side by side and the cost of a result, on real records.

Machine facts and findings come from real captures judged by `gpuvet inspect`; the CPU runs are
real measurements of this machine by the sustained-load benchmark. Figures a capture cannot
have (GPU throughput, workload tokens/s) are added to copies of real records and called
synthetic where they are.
"""

from __future__ import annotations

import copy
import json
import statistics
from datetime import datetime, timezone
from pathlib import Path

import pytest
from rich.console import Console

from gpuvet import judge
from gpuvet.cli import main
from gpuvet.compare import (TOKENS, Comparison, compare, entry, find_run, history_trend, key_figures, parse_job, run_figures,
                            with_prices)
from gpuvet.facts import Machine
from gpuvet.probe import live
from gpuvet.record import Measurement, RunRecord
from gpuvet.report import compare_view

FIXTURES = Path(__file__).parent / "fixtures"
H100_8X = "smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"
RTX4090_8X = "smi_text/q-8x-rtx4090-all-idle-535.154.05.txt"


def inspected(fixture: str, tmp_path_factory) -> RunRecord:
    """`gpuvet inspect FIXTURE --out FILE`, read back."""
    out = tmp_path_factory.mktemp("records") / "run.json"
    with pytest.raises(SystemExit):
        main(["inspect", str(FIXTURES / fixture), "--out", str(out), "--json"])
    return RunRecord.from_dict(json.loads(out.read_text()))


def measured_on_this_cpu(machine: Machine) -> RunRecord:
    """A real run of this machine: one short sustained load on the CPU, judged."""
    from gpuvet.bench import sustained
    from gpuvet.bench.common import Budget, BenchContext

    machine = copy.deepcopy(machine)
    ctx = BenchContext(device="cpu", subject="cpu", budget=Budget(10.0), params={"duration_s": 1.0, "size": 256})
    measurements = [Measurement(**m) for m in sustained.run(ctx)]
    started = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    record = RunRecord(machine=machine, started_at=started, measurements=measurements, series=ctx.series,
                       options={"benchmarks": ["sustained"], "device": "cpu"})
    record.findings = judge.judge(machine, measurements, record.options)
    return record


@pytest.fixture(scope="module")
def h100(tmp_path_factory) -> RunRecord:
    return inspected(H100_8X, tmp_path_factory)


@pytest.fixture(scope="module")
def rtx4090(tmp_path_factory) -> RunRecord:
    return inspected(RTX4090_8X, tmp_path_factory)


@pytest.fixture(scope="module")
def cpu_runs() -> list[RunRecord]:
    machine = live.collect(steal_window_s=0.1, import_torch=False)
    return [measured_on_this_cpu(machine), measured_on_this_cpu(machine)]


def synthetic(record: RunRecord, per_gpu: dict[str, float], gpus: int | None = None) -> RunRecord:
    """A copy of a real record with SYNTHETIC measurements, the same value on each of `gpus` GPUs
    (all of the machine's by default)."""
    units = {"gemm.bf16": "TFLOPS", "sustained.tflops": "TFLOPS", "workload.tokens_per_s": "tokens/s"}
    record = copy.deepcopy(record)
    for name, value in per_gpu.items():
        for i in range(gpus if gpus is not None else len(record.machine.gpus)):
            record.measurements.append(Measurement(name, value, units[name], f"gpu{i}"))
    return record


# -- side by side -----------------------------------------------------------------------------

def test_measurements_of_real_runs_side_by_side_with_the_difference_to_the_best(cpu_runs):
    first, second = cpu_runs
    result = compare([("first", first, None), ("second", second, None)])
    rows = {row.name: row for row in result.measurements}
    tflops = rows["sustained.tflops"]
    values = [first.measurements[0].value, second.measurements[0].value]
    assert tflops.values == values and tflops.unit == "TFLOPS" and not tflops.lower_is_better
    best = max(values)
    assert tflops.best == values.index(best)
    assert tflops.relative_pct == pytest.approx([(v - best) / best * 100 for v in values])
    assert rows["sustained.decay_pct"].lower_is_better  # a decay is worse the larger it is
    assert result.costs == [] and result.ranking == [] and result.verdict is None
    assert set(result.unranked.values()) == {"no price per hour"}


def test_a_quantity_is_the_median_over_gpus(h100):
    record = copy.deepcopy(h100)
    values = [700.0, 705.0, 710.0, 300.0, 702.0, 698.0, 701.0, 699.0]  # synthetic: one slow GPU
    record.measurements += [Measurement("gemm.bf16", v, "TFLOPS", f"gpu{i}") for i, v in enumerate(values)]
    assert run_figures(record)[("gemm.bf16", "TFLOPS")].value == statistics.median(values)
    assert key_figures(record) == {"gemm.bf16": statistics.median(values)}


def test_findings_side_by_side_show_real_differences_first_and_skips_are_not_differences(h100, rtx4090):
    result = compare([("h100", h100, None), ("4090", rtx4090, None)])
    rows = {row.check: row for row in result.findings}
    assert rows["gpu.throttle"].statuses == ["fail", "pass"]  # the H100 capture is power-capped under load
    assert rows["gpu.throttle"].differs
    # shown first (failures, warnings, then other differences), the rest after
    shown = [row for row in result.findings if row.shown]
    assert result.findings[:len(shown)] == shown and all(rows[c] in shown for c in rows if rows[c].differs)
    # the H100's link is known under load (full at idle already), the 4090's read only at idle
    assert rows["gpu.pcie_under_load"].statuses == ["pass", "measured"] and rows["gpu.pcie_under_load"].differs
    skipped_on_both = [row for row in result.findings if set(row.statuses) == {"skip"}]
    assert skipped_on_both and not any(row.differs for row in skipped_on_both)
    assert [run.gpus for run in result.runs] == ["8 x NVIDIA H100 80GB HBM3", "8 x NVIDIA GeForce RTX 4090"]


# -- cost per unit of work --------------------------------------------------------------------

def test_cost_per_pflop_hour_and_per_million_tokens(h100):
    # synthetic: 700 TFLOPS bf16, 650 sustained and 40,000 tokens/s on each of the 8 GPUs, at $16/h
    record = synthetic(h100, {"gemm.bf16": 700.0, "sustained.tflops": 650.0, "workload.tokens_per_s": 40000.0})
    result = compare([("h100", record, 16.0)])
    costs = {row.name: row.values[0] for row in result.costs}
    assert costs["usd_per_pflop_hour_bf16"] == pytest.approx(16.0 / (700.0 * 8 / 1000))  # $2.857
    assert costs["usd_per_pflop_hour_sustained"] == pytest.approx(16.0 / (650.0 * 8 / 1000))
    assert costs["usd_per_million_tokens"] == pytest.approx(16.0 / (40000.0 * 8 * 3600 / 1e6))  # $0.0139
    assert any("price per hour / (sum of the GPUs' bf16 GEMM TFLOPS / 1000)" in n for n in result.notes)
    assert not any(row.name.endswith("_slowest_gpu") for row in result.costs)  # equal GPUs: no second row


def test_a_figure_measured_on_some_gpus_counts_for_all_of_them_and_says_so(h100):
    record = synthetic(h100, {"sustained.tflops": 500.0}, gpus=2)  # synthetic, 2 of 8 GPUs measured
    result = compare([("h100", record, 8.0)])
    assert result.costs[0].values[0] == pytest.approx(8.0 / (500.0 * 8 / 1000))
    assert any("measured on 2 of 8 GPUs" in n for n in result.notes)


def test_the_cost_of_a_real_cpu_run(cpu_runs):
    run = cpu_runs[0]
    tflops = next(m.value for m in run.measurements if m.name == "sustained.tflops")
    result = compare([("this machine", run, 0.05)])
    (row,) = result.costs
    assert row.name == "usd_per_pflop_hour_sustained"
    assert row.values[0] == pytest.approx(0.05 / (tflops * 1 / 1000))  # the CPU counts once
    assert result.verdict.startswith("Only this machine has both a price and a measured throughput")


# -- the job ----------------------------------------------------------------------------------

def test_parse_job_and_find_its_run():
    assert parse_job("8 h on 12") == (8.0, "12")
    assert parse_job("90 min on provider A") == (1.5, "provider A")
    assert parse_job("2.5 hours on #3") == (2.5, "#3")
    assert parse_job("1 d on x") == (24.0, "x")
    for bad in ("8 on 12", "h on 12", "8 parsecs on 12", "0 h on 12"):
        with pytest.raises(ValueError, match="job"):
            parse_job(bad)
    names = ["#12 provider A", "#13 provider B", "lab box"]
    assert find_run("12", names) == 0 and find_run("#13", names) == 1 and find_run("LAB BOX", names) == 2
    with pytest.raises(ValueError, match="names no single run"):
        find_run("14", names)


def test_a_job_is_scaled_by_machine_throughput_and_priced_by_the_hour(h100, rtx4090):
    fast = synthetic(h100, {"workload.tokens_per_s": 60000.0, "sustained.tflops": 650.0})  # synthetic
    slow = synthetic(rtx4090, {"workload.tokens_per_s": 9000.0, "sustained.tflops": 150.0})  # synthetic
    result = compare([("#1 h100", fast, 16.0), ("#2 4090", slow, 3.2)], job="8 h on 1")
    job = result.job
    assert job.reference == "#1 h100" and job.metric == "workload.tokens_per_s"
    assert job.hours == pytest.approx([8.0, 8.0 * (60000.0 * 8) / (9000.0 * 8)])  # 53.3 h
    assert job.cost_usd == pytest.approx([8.0 * 16.0, 8.0 * 60000.0 / 9000.0 * 3.2])  # $128 vs $170.67
    assert result.rank_basis == "job"
    assert [r.name for r in result.ranking] == ["#1 h100", "#2 4090"]


def test_a_job_falls_back_to_a_throughput_every_run_has(h100, cpu_runs):
    gpu = synthetic(h100, {"workload.tokens_per_s": 60000.0, "sustained.tflops": 650.0})  # synthetic
    cpu = cpu_runs[0]  # real: sustained TFLOPS only
    cpu_tflops = run_figures(cpu)[("sustained.tflops", "TFLOPS")].value
    result = compare([("gpu", gpu, 16.0), ("cpu", cpu, 0.05)], job="30 min on gpu")
    assert result.job.metric == "sustained.tflops"
    assert result.job.hours[1] == pytest.approx(0.5 * 650.0 * 8 / cpu_tflops)


# -- ranking and its sentence -----------------------------------------------------------------

def test_cheapest_per_hour_is_not_cheapest_per_result_when_it_is_much_slower(h100, rtx4090):
    # synthetic figures: the 4090 box costs a fifth per hour but trains 6.7x slower
    fast = synthetic(h100, {"workload.tokens_per_s": 60000.0})
    slow = synthetic(rtx4090, {"workload.tokens_per_s": 9000.0})
    result = compare([("H100 box", fast, 16.0), ("4090 box", slow, 3.2)])
    assert result.rank_basis == "usd_per_million_tokens"
    assert [r.name for r in result.ranking] == ["H100 box", "4090 box"]
    assert result.ranking[0].cost == pytest.approx(16.0 / (60000.0 * 8 * 0.0036))
    assert result.verdict == (
        "4090 box is the cheapest per hour ($3.20/h vs $16.00/h) but not per result: H100 box costs $0.0093 per "
        "million training tokens against $0.0123, because it does the work 6.7x as fast for 5.0x the price.")


def test_cheapest_per_hour_is_cheapest_per_result_when_the_faster_one_is_not_fast_enough(h100, rtx4090):
    fast = synthetic(h100, {"sustained.tflops": 650.0})  # synthetic
    slow = synthetic(rtx4090, {"sustained.tflops": 150.0})  # synthetic
    result = compare([("H100 box", fast, 24.0), ("4090 box", slow, 3.2)])
    assert [r.name for r in result.ranking] == ["4090 box", "H100 box"]
    assert result.verdict.startswith("4090 box is both the cheapest per hour ($3.20/h) and the cheapest per result")
    assert "H100 box, costs 7.5x as much per hour but does the work only 4.3x as fast" in result.verdict


def test_runs_without_a_price_are_listed_as_unranked(h100, rtx4090):
    result = compare([("a", synthetic(h100, {"sustained.tflops": 650.0}), 16.0),
                      ("b", synthetic(rtx4090, {"sustained.tflops": 150.0}), None), ("c", rtx4090, 2.0)])
    assert [r.name for r in result.ranking] == ["a"]
    assert result.unranked == {"b": "no price per hour", "c": "not measured for USD per PFLOP-hour (sustained)"}


def test_bad_input_is_refused(h100):
    with pytest.raises(ValueError, match="positive"):
        compare([("a", h100, -1.0)])
    with pytest.raises(ValueError, match="nothing to compare"):
        compare([])
    names = [run.name for run in compare([("same", h100, None), ("same", h100, None)]).runs]
    assert names == ["same", "same (2)"]


# -- views ------------------------------------------------------------------------------------

@pytest.fixture
def priced(h100, rtx4090) -> Comparison:
    fast = synthetic(h100, {"workload.tokens_per_s": 60000.0, "gemm.bf16": 700.0})  # synthetic
    slow = synthetic(rtx4090, {"workload.tokens_per_s": 9000.0, "gemm.bf16": 160.0})  # synthetic
    return compare([("H100 box", fast, 16.0), ("4090 box", slow, 3.2)], job="8 h on H100 box")


def test_terminal_markdown_and_json_views_carry_the_same_comparison(priced):
    console = Console(record=True, width=160, color_system=None)
    compare_view.render(priced, console)
    text = console.export_text()
    assert "H100 box" in text and "4090 box" in text and "best" in text
    assert "gpu.throttle" in text and "Job: 8 h on H100 box" in text and "53.3 h" in text
    assert priced.verdict in " ".join(text.split())
    markdown = compare_view.to_markdown(priced)
    assert markdown.startswith("| | H100 box | 4090 box |\n|---|---|---|")
    assert "| gemm.bf16 TFLOPS | **700** (best) | 160 (-77%) |" in markdown
    assert "1. H100 box: $128.00 at $16.00/h" in markdown
    data = json.loads(json.dumps(compare_view.to_dict(priced)))
    assert data["schema"] == "gpuvet.compare/1"
    assert data["verdict"] == priced.verdict and data["job"]["hours"][1] == pytest.approx(8 * 60000 / 9000)


# -- one machine over time --------------------------------------------------------------------

def test_history_trend_compares_day_and_night_in_utc(h100):
    runs = []
    for when, tflops in (("2025-03-01T02:00:00Z", 700.0), ("2025-03-01T14:00:00Z", 560.0),
                         ("2025-03-02T03:00:00Z", 690.0), ("2025-03-02T15:00:00Z", 580.0)):
        run = synthetic(h100, {"sustained.tflops": tflops})  # synthetic figures, real machine
        run.started_at = when
        runs.append(run)
    trend = history_trend(list(reversed(runs)))  # any order in, oldest first out
    (figure,) = trend.figures
    assert [p[0] for p in figure.points] == [r.started_at for r in runs]
    assert (figure.first, figure.last) == (700.0, 580.0)
    assert figure.change_pct == pytest.approx((580 - 700) / 700 * 100)
    assert (figure.day_median, figure.day_runs, figure.night_median, figure.night_runs) == (570.0, 2, 695.0, 2)
    assert figure.sentence.endswith("18% lower by day")
    assert "UTC" in trend.clock and "UTC" in figure.sentence
    shifted = history_trend(runs, utc_offset_hours=8)  # 02:00 UTC is 10:00 at UTC+8: day there
    assert shifted.figures[0].day_median == pytest.approx(statistics.median([700.0, 690.0]))
    assert "UTC+8" in shifted.clock


def test_history_trend_of_real_cpu_runs(cpu_runs):
    trend = history_trend(cpu_runs)
    # the CPU runs measured the sustained load; the host facts add the CPU steal of each run
    figure, steal = trend.figures
    assert figure.name == "sustained.tflops" and len(figure.points) == 2
    assert "2 runs" in figure.sentence and "UTC" in figure.sentence
    assert steal.name == "host.steal_pct" and steal.unit == "%" and len(steal.points) == 2


def test_entries_are_named_by_reference_and_label_and_a_job_finds_them(h100, rtx4090):
    labelled = synthetic(h100, {"sustained.tflops": 650.0})  # synthetic
    labelled.options.update(label="provider A", price=16.0)
    plain = synthetic(rtx4090, {"sustained.tflops": 150.0})  # synthetic
    entries = [entry(labelled, "#7"), entry(plain, "runs.json")]
    assert [(name, price) for name, _, price in entries] == [("#7 provider A", 16.0), ("runs.json", None)]
    assert compare(entries, job="2 h on 7").job.reference == "#7 provider A"


def test_tied_values_are_all_marked_best(h100, rtx4090):
    a = synthetic(h100, {"sustained.tflops": 650.0})  # synthetic: the same figure on both
    b = synthetic(rtx4090, {"sustained.tflops": 650.0})
    result = compare([("a", a, None), ("b", b, None)])
    (row,) = [r for r in result.measurements if r.name == "sustained.tflops"]
    assert row.best_runs == [0, 1] and row.relative_pct == [0.0, 0.0]
    assert "| sustained.tflops TFLOPS | **650** (best) | **650** (best) |" in compare_view.to_markdown(result)
    console = Console(record=True, width=200, color_system=None)
    compare_view.render(result, console)
    line = next(l for l in console.export_text().splitlines() if l.startswith("│sustained.tflops"))
    assert line.count("best") == 2


def test_the_workload_step_time_spread_is_compared(h100, rtx4090):
    def with_steps(record: RunRecord, median: float, p10: float, p90: float) -> RunRecord:
        record = copy.deepcopy(record)  # synthetic step times, as the workload records them
        record.measurements.append(Measurement("workload.step_time_ms", median, "ms", "gpu0", {"p10": p10, "p90": p90}))
        return record

    result = compare([("steady", with_steps(h100, 10.0, 9.8, 10.4), None),
                      ("jittery", with_steps(rtx4090, 10.0, 8.0, 19.0), None)])
    rows = {r.name: r for r in result.measurements}
    assert rows["workload.step_time_ms.p90"].values == [10.4, 19.0] and rows["workload.step_time_ms.p90"].best_runs == [0]
    assert rows["workload.step_time_ms.p10"].label == "workload.step_time_ms p10"
    console = Console(record=True, width=200, color_system=None)
    compare_view.render(result, console)
    assert "workload.step_time_ms p90 ms" in console.export_text()


def test_a_run_is_found_by_its_label_id_or_file_name(h100, rtx4090):
    a, b = copy.deepcopy(h100), copy.deepcopy(rtx4090)
    a.options["label"] = "8 h on provider A"
    entries = [entry(a, "#4"), entry(b, "/tmp/exports/box-b.json")]
    names, labels = [n for n, _, _ in entries], ["8 h on provider A", None]
    for reference, index in (("8 h on provider A", 0), ("#4", 0), ("4", 0), ("box-b.json", 1), ("box-b", 1),
                             ("/tmp/exports/box-b.json", 1)):
        assert find_run(reference, names, labels) == index, reference
    assert compare(entries, job="3 h on 8 h on provider A").job.reference == "#4 8 h on provider A"
    with pytest.raises(ValueError, match="names several runs"):
        find_run("box", ["#1 box", "#2 box"], ["box", "box"])


def test_prices_for_one_comparison_replace_the_stored_ones(h100, rtx4090):
    a = synthetic(h100, {"sustained.tflops": 650.0})  # synthetic
    a.options.update(label="provider A", price=16.0)
    entries = [entry(a, "#1"), entry(rtx4090, "#2")]
    priced = with_prices(entries, [("provider A", 12.0), ("2", 3.0)])
    assert [p for _, _, p in priced] == [12.0, 3.0] and entries[0][2] == 16.0
    with pytest.raises(ValueError, match="--price: '3' names no single run"):
        with_prices(entries, [("3", 1.0)])
    for bad in (float("inf"), float("nan"), 0.0):
        with pytest.raises(ValueError, match="positive finite"):
            compare([("a", a, bad)])


def test_history_trend_names_its_time_zone(h100):
    run = synthetic(h100, {"sustained.tflops": 650.0})  # synthetic
    assert history_trend([run], utc_offset_hours=1, zone="local time CET").clock.startswith(
        "day = 08:00-20:00 local time CET (UTC+1 h)")


# -- a second audit: failures always shown, throttled GPUs priced, shapes, directions, ties ----

RECORDS = FIXTURES / "records"


def record_file(name: str) -> RunRecord:
    return RunRecord.from_dict(json.loads((RECORDS / f"{name}.json").read_text()))


def test_a_failure_on_one_run_shows_even_where_the_other_run_skipped_the_check(capsys):
    code = 0
    try:
        main(["compare", str(RECORDS / "h100-8x-synthetic-sustained.json"), str(RECORDS / "cpu-quick.json"), "--md"])
    except SystemExit as exit_:
        code = exit_.code
    markdown = capsys.readouterr().out
    assert code in (0, None)
    assert "| gpu.throttle | FAIL | not checked (skip) |" in markdown
    assert "| gpu.sustained | FAIL | not checked |" in markdown  # the CPU run has no such check at all
    assert "- FAIL gpu.sustained on " in markdown and "gpu2: throughput fell 40%" in markdown
    assert "checks agree on every run" not in markdown
    result = compare([("h100", record_file("h100-8x-synthetic-sustained"), None), ("cpu", record_file("cpu-quick"), None)])
    data = compare_view.to_dict(result)
    throttle = next(row for row in data["findings"] if row["check"] == "gpu.throttle")
    assert throttle["shown"] and throttle["problem"] and throttle["statuses"] == ["fail", "skip"]
    assert data["findings"][0]["statuses"][0] == "fail"  # failures first
    console = Console(record=True, width=200, color_system=None)
    compare_view.render(result, console)
    text = console.export_text()
    assert "gpu.sustained" in text and "gpu.isolation" in text and "not checked (skip)" in text


def test_cost_counts_every_gpus_own_rate_and_the_slowest_gpu_for_a_data_parallel_job():
    record = record_file("h100-8x-synthetic-sustained")  # synthetic: gpu2 power-braked to 398 TFLOPS
    rates = [m.value for m in record.measurements if m.name == "sustained.tflops"]
    result = compare([("h100", record, 24.0)])
    costs = {row.name: row.values[0] for row in result.costs}
    assert costs["usd_per_pflop_hour_sustained"] == pytest.approx(24.0 / (sum(rates) / 1000))  # ~$4.79, not $4.55
    assert costs["usd_per_pflop_hour_sustained_slowest_gpu"] == pytest.approx(24.0 / (min(rates) * 8 / 1000))  # ~$7.53
    assert result.rank_basis == "usd_per_pflop_hour_sustained"
    assert any("paced by the slowest GPU" in n and "the ranking uses the sum" in n for n in result.notes)
    markdown = compare_view.to_markdown(result)
    assert "| USD per PFLOP-hour (sustained) | $4.79 |" in markdown
    assert "| USD per PFLOP-hour (sustained, paced by the slowest GPU) | $7.53 |" in markdown


def test_a_decay_is_judged_by_its_size_whatever_its_sign():
    steady, cpu = record_file("h100-8x-synthetic-sustained"), record_file("cpu-sustained")  # cpu: -165.6%
    result = compare([("h100", steady, None), ("cpu", cpu, None)])
    decay = next(row for row in result.measurements if row.name == "sustained.decay_pct")
    assert decay.closer_to_zero and decay.best_runs == [0]
    assert "sustained.decay_pct % (closer to 0 is better) | **" in compare_view.to_markdown(result)


def with_workload(record: RunRecord, tokens_per_s: float, d_model: int, layers: int, batch: int, dtype: str) -> RunRecord:
    """Synthetic workload figures with the shape details the workload records."""
    record = copy.deepcopy(record)
    shape = {"d_model": d_model, "layers": layers, "heads": 4, "seq_len": 64, "batch": batch, "vocab": 512}
    for i in range(max(1, len(record.machine.gpus))):
        subject = f"gpu{i}" if record.machine.gpus else "cpu"
        record.measurements.append(Measurement(TOKENS, tokens_per_s, "tokens/s", subject, {"shape": shape, "dtype": dtype}))
    return record


def test_tokens_of_different_model_shapes_are_shown_but_not_ranked(h100, rtx4090):
    gpu = with_workload(h100, 60000.0, 768, 12, 16, "bfloat16")  # synthetic
    cpu = with_workload(rtx4090, 90000.0, 128, 2, 8, "float32")  # synthetic, a smaller model
    cpu = synthetic(cpu, {"sustained.tflops": 100.0})
    gpu = synthetic(gpu, {"sustained.tflops": 600.0})
    result = compare([("big", gpu, 16.0), ("small", cpu, 3.2)], job="1 h on big")
    tokens = next(row for row in result.measurements if row.name == TOKENS)
    assert tokens.values == [60000.0, 90000.0] and tokens.best_runs == [] and tokens.relative_pct == [None, None]
    assert tokens.not_comparable == "different workload shapes: not comparable"
    per_token = next(row for row in result.costs if row.name == "usd_per_million_tokens")
    assert per_token.not_comparable and per_token.best_runs == []
    assert result.rank_basis == "job" and result.job.metric == "sustained.tflops"  # not tokens of another model
    assert any("d_model 768 x 12 layers" in n and "batch 16" in n and "bfloat16" in n for n in result.notes)
    markdown = compare_view.to_markdown(result)
    assert "| workload.tokens_per_s tokens/s (different workload shapes: not comparable) | 60,000 | 90,000 |" in markdown
    same = compare([("a", with_workload(h100, 60000.0, 768, 12, 16, "bfloat16"), 16.0),
                    ("b", with_workload(rtx4090, 9000.0, 768, 12, 16, "bfloat16"), 3.2)])
    assert same.rank_basis == "usd_per_million_tokens"


def test_a_tie_is_worded_as_the_same(h100, rtx4090):
    a = synthetic(h100, {"sustained.tflops": 650.0})  # synthetic: the same speed at the same price
    b = synthetic(rtx4090, {"sustained.tflops": 650.0})
    result = compare([("a", a, 8.0), ("b", b, 8.0)])
    assert "costs the same per hour and does the work at the same speed" in result.verdict
    assert "1.0x" not in result.verdict


def test_a_short_job_shows_seconds_not_zero_minutes(h100, rtx4090):
    fast = synthetic(h100, {"sustained.tflops": 650.0})  # synthetic
    slow = synthetic(rtx4090, {"sustained.tflops": 150.0})
    result = compare([("fast", fast, 16.0), ("slow", slow, 3.2)], job="10 s on fast")
    assert "| time | 10 s | 43 s |" in compare_view.to_markdown(result)


def test_the_trend_follows_disk_network_cpu_feed_and_steal_where_runs_have_them():
    runs = []
    for when, seq, iops, loop, feed, steal in (("2025-03-01T02:00:00Z", 900.0, 40000, 20.0, 800.0, 0.1),
                                               ("2025-03-01T14:00:00Z", 500.0, 20000, 12.0, 600.0, 4.0)):
        run = record_file("cpu-quick")  # synthetic figures on the real cpu-quick facts
        run.started_at = when
        run.machine.host.steal_pct = steal
        run.measurements = [Measurement("disk.seq_read", seq, "MB/s", "/tmp"),
                            Measurement("disk.rand_read_iops", iops, "IOPS", "/tmp"),
                            Measurement("net.loopback_throughput", loop, "Gbit/s", "loopback"),
                            Measurement("cpu.feed_rate", feed, "samples/s", "cpu")]
        runs.append(run)
    trend = {f.name: f for f in history_trend(runs).figures}
    assert set(trend) == {"disk.seq_read", "disk.rand_read_iops", "net.loopback_throughput", "cpu.feed_rate", "host.steal_pct"}
    assert trend["disk.seq_read"].sentence.endswith("44% lower by day")
    assert trend["host.steal_pct"].sentence.endswith("3.9 points higher by day")


def _same_machine_twice(h100: RunRecord, tokens: float, p10: float, p90: float, cpu_share: float | None = None) -> RunRecord:
    """A copy of the real 8x H100 record with a SYNTHETIC workload run: tokens/s, the step times
    behind it (median, p10, p90 in ms) and a resume check, as the workload records them."""
    record = copy.deepcopy(h100)
    median = 1000.0 / tokens
    record.measurements += [Measurement("workload.tokens_per_s", tokens, "tokens/s", "gpu0"),
                            Measurement("workload.step_time_ms", median, "ms", "gpu0", {"p10": p10, "p90": p90}),
                            Measurement("workload.resume_ok", 1.0, "bool", "gpu0")]
    if cpu_share is not None:  # the CPU feed benchmark saw its workers get this share of their cores
        record.measurements.append(Measurement("cpu.feed_rate", 900.0, "samples/s", "cpu", {"cpu_share": cpu_share}))
    return record


def test_two_runs_of_one_machine_within_their_own_spread_are_not_called_a_difference(h100):
    steady = _same_machine_twice(h100, 801.0, 1.0, 1.6)  # step times 1.25 ms median, 1.0-1.6 ms
    noisy = _same_machine_twice(h100, 375.0, 1.2, 6.0, cpu_share=0.45)  # 2.7 ms median, 1.2-6.0 ms: very jittery
    result = compare([("first", steady, 2.0), ("again", noisy, 2.0)])
    rows = {r.name: r for r in result.measurements}
    assert rows["workload.tokens_per_s"].within_spread == [False, True]
    assert "differs from the best workload.tokens_per_s by less than the runs' own run-to-run spread" in result.verdict
    assert "again ran with contended CPUs" in result.verdict and "measure again before choosing" in result.verdict
    assert any("again: its CPU feed workers got only 45% of their cores' time" in n for n in result.notes)
    console = Console(record=True, width=250, color_system=None)
    compare_view.render(result, console)
    text = console.export_text()
    assert "within run-to-run spread" in text
    resume = next(line for line in text.splitlines() if "workload.resume_ok" in line)
    assert "yes" in resume and "bool" not in resume and " 1 " not in resume


def test_a_difference_wider_than_both_spreads_is_still_a_difference(h100):
    result = compare([("fast", _same_machine_twice(h100, 801.0, 1.2, 1.3), 2.0),
                      ("slow", _same_machine_twice(h100, 375.0, 2.6, 2.8), 2.0)])
    rows = {r.name: r for r in result.measurements}
    assert rows["workload.tokens_per_s"].within_spread == [False, False] and "Caveat" not in result.verdict
