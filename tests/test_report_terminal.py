"""The terminal report: checklist first, problems in full (failures first), skips with their
reasons, passes counted in one line (-v lists them), measurements, verdict last; on stored
records and on records made fresh from the captures."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from gpuvet import catalog, runner
from gpuvet.record import FAIL, Finding, RunRecord
from gpuvet.report import terminal
from gpuvet.report.html import render_html
from gpuvet.report.markdown import render_markdown

FIXTURES = Path(__file__).parent / "fixtures"
RECORDS = FIXTURES / "records"


def record(name: str) -> RunRecord:
    return RunRecord.from_dict(json.loads((RECORDS / f"{name}.json").read_text()))


def text(r: RunRecord, verbose: bool = False) -> str:
    console = Console(record=True, width=400, highlight=False, soft_wrap=True, color_system=None)
    terminal.render(r, console, verbose=verbose)
    return console.export_text()


def test_checklist_leads_then_problems_skips_the_pass_count_and_the_verdict_last():
    out = text(record("h100-8x-throttle"))
    order = [out.index(h) for h in ("Acceptance checklist", "Hidden parameters", "Problems (1 failed, 1 warning)",
                                    "\nNot checked\n", "\n55 passed (")]
    assert order == sorted(order)
    assert out.splitlines()[0].startswith("gpuvet 0.1")
    assert out.rstrip().splitlines()[-1] == "FAIL: something is wrong with this machine  (1 failed, 1 warnings, 55 passed, 15 skipped)"
    assert "  ✗  Power wall" in out and "  !  Whole GPU, not shared" in out and "  ?  TCP stack latency" in out


def test_a_bench_run_shows_only_the_checklist_items_its_benchmarks_decided_then_its_figures():
    out = text(record("h100-8x-synthetic-sustained"))  # `gpuvet bench sustained` on 8 GPUs
    assert "  ✗  Power wall" in out and "  !  Whole GPU, not shared" in out
    assert "TCP stack latency" not in out and "  ?  " not in out  # no page of undecided items
    # 10: the record predates gpu.pcie_under_load and gpu.pcie_driver_view, which its two PCIe lines need
    assert "  and 11 more items these benchmarks do not decide; `gpuvet run` checks them all" in out
    order = [out.index(h) for h in ("Acceptance checklist", "Problems (2 failed, 1 warning)", "\n62 passed (", "Measured")]
    assert order == sorted(order)
    assert out.rstrip().splitlines()[-1] == "FAIL: something is wrong with this machine  (2 failed, 1 warnings, 62 passed, 15 skipped)"


def test_a_bench_run_says_in_one_line_what_it_does_not_decide():
    out = text(record("cpu-sustained"))  # `gpuvet bench sustained --device cpu`: no GPU facts; the host's cores only
    assert "Acceptance checklist" not in out and "CPU cores to feed each GPU" in out
    assert "  and 13 more items these benchmarks do not decide; `gpuvet run` checks them all" in out
    assert "sustained.tflops" in out


def test_a_synthetic_record_says_so_in_every_format():
    r = record("h100-8x-synthetic-sustained")
    words = "synthetic: sustained telemetry and throughput invented by tests/fixtures/records/make_synthetic.py"
    assert f"  options: profile bench · benchmarks sustained · device cuda · {words}" in text(r)
    assert words in render_markdown(r) and words in render_html(r)


def test_failures_come_before_warnings_with_evidence_and_remedy():
    out = text(record("h100-8x-throttle"))
    problems = out[out.index("Problems"):out.index("\nNot checked\n")]
    assert problems.index("FAIL  gpu.throttle") < problems.index("WARN  gpu.isolation")
    assert "measured active: sw_power_cap, hw_power_brake_slowdown, sw_thermal_slowdown" in problems
    assert "source: NVML clock-event reasons" in problems
    assert "fix/confirm: watch it under load: `nvidia-smi -i 2 -q -d PERFORMANCE,TEMPERATURE,POWER`" in problems


def test_passes_are_counted_in_one_line_and_verbose_lists_them_all():
    out = text(record("h100-8x-throttle"))
    assert "PASS  " not in out and "\n55 passed (8 checks; -v lists them)\n" in out
    assert len(out.splitlines()) < 45  # quiet: the checklist, the problems, the skips, the verdict
    verbose = text(record("h100-8x-throttle"), verbose=True)
    assert verbose.count("PASS  gpu.temperature") == 6 and "\nGPU\n" in verbose and "passed (" not in verbose


def test_a_clean_machine_is_quiet():
    record = runner.inspect([str(FIXTURES / "smi_text/q-titan-v-560.35.03.txt")])
    out = text(record)
    assert "Problems" not in out and "PASS  " not in out
    # The passes counted in one line: as many as the record's, of as many checks of the catalogue's
    # facts (the count follows the catalogue as checks are added; it is not pinned here).
    passed = [f for f in record.findings if f.status == "pass"]
    checks = {f.check for f in passed}
    assert checks <= set(catalog.at_level(catalog.QUICK)) and {"gpu.model", "gpu.fan_failure"} <= checks
    assert f"\n{len(passed)} passed ({len(checks)} checks; -v lists them)\n" in out
    assert re.search(r"SKIP  gpu\.ecc +gpu0 +no ECC on this GPU \(or not in the capture\)", out)  # a skip says why
    # the subject column stays aligned past the longest id shown (gpu.throttle_history)
    ecc, history = (next(line for line in out.splitlines() if f"SKIP  {check} " in line)
                    for check in ("gpu.ecc", "gpu.throttle_history"))
    assert ecc.index(" gpu0 ") == history.index(" gpu0 ")
    assert out.rstrip().splitlines()[-1].startswith("PASS: nothing wrong found")


def test_measurements_of_a_cpu_run_are_listed():
    out = text(record("cpu-sustained"))
    assert "sustained.tflops       cpu 0.03" in out and "PASS  cpu.sustained" in text(record("cpu-sustained"), verbose=True)


def test_checks_from_areas_the_report_does_not_know_still_show():
    r = record("cpu-quick")
    r.findings += [Finding("env.jupyter", "host", FAIL, "Jupyter on 0.0.0.0:8888 without a token", remedy="jupyter server password"),
                   Finding("net.loopback", "host", "pass", "TCP round trip 21 us"),
                   Finding("fabric.future", "machine", "pass", "a check from a newer gpuvet")]
    assert "FAIL  env.jupyter" in text(r) and "fix/confirm: jupyter server password" in text(r)
    out = text(r, verbose=True)
    assert "\nNetwork\n" in out and "PASS  net.loopback" in out
    assert "\nFabric\n" in out and "PASS  fabric.future" in out


def test_the_names_other_modules_use_are_kept():
    m = record("h100-8x-throttle").machine
    assert terminal.machine_lines(m)[0] == "GPUs: 8 x NVIDIA H100 80GB HBM3 · driver 535.183.01 (CUDA 12.2)"
    assert terminal.subject_range(["gpu0", "gpu1"]) == "gpu0-1"
    assert terminal.measurement_lines(record("h100-8x-synthetic-sustained"))[0].startswith("sustained.tflops       gpu0 655.2")


@pytest.mark.parametrize("capture", [
    "smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt",
    "smi_xml/gtx-1070-x6-riser-pcie-x1-384.66-v9.xml",
    "bundles/h200-mig-vm-590.48.01.txt",
    "smi_xml/tesla-k80-x4-azure-ecc-retired-430.26-v10.xml",
    "topo/dgx-a100-8gpu-nv12-12nics-topo-m.txt",
])
def test_every_format_renders_a_record_made_now_from_a_capture(capture):
    """Today's rules on the real captures: whatever they find, every report renders it."""
    r = runner.inspect([str(FIXTURES / capture)])
    out = text(r, verbose=True)
    assert "Acceptance checklist" in out and out.rstrip().splitlines()[-1].startswith(r.verdict.upper())
    for f in r.findings:
        assert f.check in out
    quiet = text(r)
    assert quiet.rstrip().splitlines()[-1].startswith(r.verdict.upper())
    for f in r.findings:
        assert (f.check in quiet) or f.status == "pass"
    markdown = render_markdown(r)
    assert "| | Item | What decided it |" in markdown
    page = render_html(r)
    assert page.startswith("<!doctype html>") and 'id="checklist"' in page and page.rstrip().endswith("</html>")


def test_input_where_every_check_skips_does_not_read_nothing_wrong_found():
    for name in ("proc_sysfs/proc-driver-nvidia-version-470.63.01.txt", "lspci/lspci-nn-a10-kvm.txt"):
        r = runner.inspect([str(FIXTURES / name)])
        assert r.verdict == "pass"  # the record's field: the worst status, unchanged
        last = text(r).rstrip().splitlines()[-1]
        assert last.startswith("SKIP: nothing could be checked from this input: capture `nvidia-smi -q -x")
        assert "nothing wrong found" not in last and "0 passed" in last
        assert "nothing could be checked" in render_markdown(r)


def test_the_same_problem_on_every_gpu_is_printed_once_with_the_subject_range():
    r = runner.inspect([str(FIXTURES / "smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt")], expect="H100 PCIe")
    out = text(r)
    lines = [line for line in out.splitlines() if "is not the 'H100 PCIe' you expected" in line]
    assert len(lines) == 1 and "gpu0-7" in lines[0]
    assert "Problems (9 failed" in out  # the count still counts every GPU


def test_grouped_remedies_that_differ_only_in_the_gpu_index_name_every_gpu():
    r = runner.inspect([str(FIXTURES / "smi_text/q-8x-rtx4090-all-idle-535.154.05.txt")])
    for f in r.findings:
        if f.check == "gpu.power_limit":  # edited (synthetic): every GPU capped alike
            f.status, f.summary, f.remedy = FAIL, "capped at 300 W", f"sudo nvidia-smi -i {f.subject[3:]} -pl 450"
    out = text(r)
    assert [line.split()[2] for line in out.splitlines() if line.startswith("  FAIL  gpu.power_limit")] == ["gpu0-7"]
    assert "sudo nvidia-smi -i 0,1,2,3,4,5,6,7 -pl 450" in out


def test_a_window_in_the_options_line_reads_as_a_duration():
    r = record("cpu-sustained")
    r.options["xid_window_s"] = 7200.0  # as `gpuvet health` records its default window
    assert "xid_window 2 h" in text(r) and "7200" not in text(r)


def test_the_pytorch_pip_line_is_said_once_in_the_header():
    """A full run without PyTorch: every GPU benchmark, and three checklist items, skip for it."""
    out = text(record("cpu-full-no-torch"))
    assert out.count("pip install torch --index-url https://download.pytorch.org/whl/cpu") == 1
    header = out.splitlines()[:5]
    assert any(line.startswith("  PyTorch: not installed; to add one this machine runs: `") for line in header)
    assert out.count("PyTorch is not installed (see PyTorch above)") == 4  # three checklist items, one SKIP line


def test_the_saved_run_is_named_by_the_verdict():
    console = Console(record=True, width=400, force_terminal=False)
    terminal.render(record("h100-8x-throttle"), console, saved_as=7)
    last = console.export_text().rstrip().splitlines()[-2:]
    assert last[0].startswith("FAIL: something is wrong with this machine")
    assert last[1] == "saved as run 7: gpuvet report 7 --for-provider writes the evidence to send the provider"


def test_the_catalogue_of_checks_wraps_to_the_terminal_under_its_text_column():
    from gpuvet import catalog
    from gpuvet.report.catalog_view import catalog_lines

    console = Console(record=True, width=100, force_terminal=True, color_system=None)
    terminal.print_columns(console, list(catalog_lines(catalog.CHECKS, catalog.BENCHMARKS)))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 100
    model = next(i for i, line in enumerate(lines) if line.startswith("    gpu.model "))
    assert lines[model].index("the exact name") == 29  # the text column
    assert lines[model + 1].startswith(" " * 29) and lines[model + 1][29] != " "  # continued under it
