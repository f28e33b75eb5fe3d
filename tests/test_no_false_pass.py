"""No false PASS (issue 15): the seeds' vendor B/C x8 link, hot GPUs without a reported threshold,
and figures with nothing to judge them against. Real captures, named edits of real ones
(tests/fixtures/edited), and facts edited inside a test where the test's name says so."""

from __future__ import annotations

from pathlib import Path

from gpuvet.facts import Audit, Machine, PcieLink
from gpuvet.judge import judge
from gpuvet.probe import capture
from gpuvet.record import MEASURED, Measurement

FIXTURES = Path(__file__).parent / "fixtures"
A10G_MAX_X8 = "edited/a10g-aws-passthrough-515.105.01-v11-edited-max-width-x8.xml"
ADA_LSPCI = "lspci/lspci-vvv-rtx6000ada-idle-gen1-downgraded-spaces.txt"


def machine_from(*names: str) -> Machine:
    captures = []
    for name in names:
        captures += capture.read_captures(str(FIXTURES / name))
    return capture.merge(captures)


def found(machine: Machine, check: str, measurements=None, **options) -> dict:
    return {f.subject: f for f in judge(machine, measurements, options) if f.check == check}


# -- PCIe: the driver's link against the host's and against the model's lanes -------------------

def test_a_max_of_x8_on_an_x16_model_warns_with_both_figures():
    f = found(machine_from(A10G_MAX_X8), "gpu.pcie_link")["gpu0"]
    assert f.status == "warn"  # was "Gen1 x8, the full Gen4 x8 link": PASS
    assert "tops out at x8, but A10G is an x16 card (reference)" in f.summary
    assert "max Gen4 x8" in f.evidence.measured and "x16" in f.evidence.expected
    assert "pcie_lanes" in f.evidence.source


def test_the_real_a10g_at_x8_of_x16_still_warns_once():
    f = found(machine_from("smi_xml/a10g-aws-passthrough-515.105.01-v11.xml"), "gpu.pcie_link")["gpu0"]
    assert f.status == "warn" and "x8 of x16 lanes" in f.summary and "is an x16 card" not in f.summary


def test_driver_x8_while_lspci_shows_x16_warns_with_both_readings__driver_reading_added_in_the_test():
    # The real RTX 6000 Ada lspci (LnkCap x16, LnkSta x16); the seed's vendor C adds a driver view of
    # max x8 (`nvidia-smi -q -d PCI`), added here by hand: no public capture holds both.
    m = machine_from(ADA_LSPCI)
    m.gpus[0].pcie.readings.insert(0, PcieLink(current_gen=4, max_gen=4, current_width=8, max_width=8, source="nvidia-smi"))
    f = found(m, "gpu.pcie_driver_view")["gpu0"]
    assert f.status == "warn"
    assert f.summary.startswith("the driver reports a max of Gen4 x8 (nvidia-smi) but the host shows Gen4 x16 (lspci LnkCap)")
    assert f.evidence.measured == "nvidia-smi: max Gen4 x8; lspci: max Gen4 x16"
    assert f.evidence.source == "the driver (nvidia-smi) and the host's PCIe capability (lspci)"
    assert found(m, "gpu.pcie_link")["gpu0"].status == "pass"  # the link the driver reads is full; the views are judged once


def pcie(h2d: float, d2h: float) -> list[Measurement]:
    return [Measurement("pcie.h2d_pinned", h2d, "GB/s", "gpu0"), Measurement("pcie.d2h_pinned", d2h, "GB/s", "gpu0")]


def test_bandwidth_of_a_halved_link_is_judged_against_the_model_link():
    # 14 GB/s is 89% of what x8 carries: PASS against the reported link, half of what an A10G moves.
    f = found(machine_from(A10G_MAX_X8), "gpu.pcie_bandwidth", pcie(14.0, 14.2), benchmarks=["pcie"], device="cuda")["gpu0"]
    assert f.status == "warn"
    assert "44% of what the A10G's own Gen4 x16 link (reference)" in f.summary
    assert "the link as read, Gen4 x8, carries ~16 GB/s" in f.summary
    assert "pcie_lanes" in f.evidence.source


def test_bandwidth_without_a_link_or_model_is_measured_not_passed__link_and_name_removed_in_the_test():
    m = machine_from(A10G_MAX_X8)
    m.gpus[0].pcie.readings.clear()
    m.gpus[0].name = None
    f = found(m, "gpu.pcie_bandwidth", pcie(24.0, 25.0), benchmarks=["pcie"], device="cuda")["gpu0"]
    assert f.status == MEASURED and "no link width or model reference to judge it against" in f.summary


# -- temperature without a reported slowdown threshold ------------------------------------------

def test_temperature_without_a_threshold_uses_the_conservative_default_and_says_so():
    ok = found(machine_from("smi_text/dmon-h100-vm-load-590.48.01.txt"), "gpu.temperature")["gpu0"]  # 65 C, no threshold
    assert ok.status == "pass" and "87 C assumed" in ok.evidence.expected
    assert "lowest 'GPU Slowdown Temp'" in ok.evidence.source
    hot = found(machine_from("edited/csv-h100-load-590.48.01-edited-seed-loop-l5-heating.csv"), "gpu.temperature")["gpu0"]
    assert hot.status == "fail" and "87 C: at the slowdown threshold" in hot.summary  # passed at any value before
    assert "87 C assumed" in hot.evidence.measured


# -- "measured, not judged" in every report, and verdicts that say how much was judged -----------

def _loop_record():
    from gpuvet import runner
    return runner.inspect([str(FIXTURES / "smi_text/dmon-h100-vm-idle-590.48.01.txt")])  # gpu.trend: measured


def test_measured_status_is_shown_by_terminal_markdown_html_and_compare():
    from rich.console import Console

    from gpuvet.compare import compare
    from gpuvet.report import compare_view, html, markdown, terminal

    record = _loop_record()
    assert any(f.status == MEASURED for f in record.findings)
    console = Console(record=True, width=200)
    terminal.render(record, console)
    out = console.export_text()
    assert "Measured, not judged" in out and "MEAS  gpu.trend" in out
    assert "1 measured (not judged)" in terminal.verdict_line(record)
    assert "📏 MEASURED (not judged)" in markdown.render_markdown(record)
    page = html.render_html(record)
    assert '<span class="badge measured">MEASURED</span>' in page and "measured, not judged</span>" in page
    console = Console(record=True, width=200)
    compare_view.render(compare([("a", record, None), ("b", record, None)]), console, verbose=True)
    assert "measured, not judged" in console.export_text()


def test_a_pass_built_on_skips_says_how_little_was_judged():
    from gpuvet import runner
    from gpuvet.report import terminal

    record = runner.inspect([str(FIXTURES / "smi_text/default-table-h100-vm-590.48.01.txt")])  # the plain table
    assert terminal.verdict_text(record).startswith("PASS: nothing wrong found, but only 6 of 31 findings could be judged")
    topo_only = runner.inspect([str(FIXTURES / "topo/dgx1-8gpu-topo-mp-pcie-only.txt")])  # "8 x unknown GPU"
    assert terminal.verdict_text(topo_only).startswith("SKIP: nothing could be checked")


def test_cpu_benchmarks_are_measured_not_passed():
    m = Machine()
    figures = [Measurement("gemm.fp32", 0.5, "TFLOPS", "cpu")]
    (f,) = [f for f in judge(m, figures, {"device": "cpu", "benchmarks": ["gemm"]}) if f.check == "cpu.gemm"]
    assert f.status == MEASURED and "no reference to judge against" in f.summary


def _all_fixture_records():
    from gpuvet import runner

    for path in sorted(FIXTURES.rglob("*")):
        if path.suffix not in (".xml", ".txt", ".csv") or "docs_embedded" in path.parts:
            continue
        try:
            yield runner.inspect([str(path)])
        except Exception:  # noqa: BLE001 (refused inputs are tested elsewhere)
            continue
    for path in sorted((FIXTURES / "records").glob("*.json")):
        yield runner.load_record(str(path))


def test_no_rule_passes_without_a_measured_value_an_expectation_and_its_source():
    # The rules themselves, before judge's safety net turns such a PASS into "measured".
    from gpuvet.judge import RULES
    from gpuvet.judge.common import Context

    bare = []
    for record in _all_fixture_records():
        ctx = Context(record.machine, record.measurements, record.options)
        for rule in RULES.values():
            try:
                results = rule(ctx)
            except Exception:  # noqa: BLE001 (judge reports a crashed rule as a SKIP)
                continue
            for f in results:
                e = f.evidence
                if f.status == "pass" and not (e.measured and e.expected and e.source):
                    bare.append((f.check, f.summary[:80]))
    assert not bare, sorted(set(bare))


# -- stack.toolkit: the CUDA toolkit against the driver and PyTorch's CUDA --------------------------

def _with_stack(name: str, **stack_fields):
    from gpuvet.facts import Stack, Torch

    m = machine_from(name)
    torch = stack_fields.pop("torch", Torch())
    m.stack = Stack(torch=torch, **stack_fields)
    return m


def test_toolkit_newer_than_the_driver_fails_like_the_seed__stack_given_in_the_test():
    # Seed 2: CUDA 12.1 needs driver 525.60.13; the machine had 515.65.01 (this real capture's driver).
    m = _with_stack("smi_xml/gtx-1050-laptop-x8-515.65.01-nodoctype.xml", nvcc_version="12.1.105")
    (f,) = found(m, "stack.toolkit").values()
    assert f.status == "fail" and "driver 515.65.01 is older than CUDA 12.1 needs (530.30.02)" in f.summary
    assert "stop deploying" in f.summary and "Tables 2-3" in f.evidence.source


def test_toolkit_of_another_major_than_pytorch_warns__stack_given_in_the_test():
    from gpuvet.facts import Torch

    m = _with_stack("smi_text/q-h100-80gb-hbm3-vm-590.48.01-idle.txt", cuda_home_version="12.4",
                    cuda_home_target="/usr/local/cuda-12.4",
                    torch=Torch(installed=True, version="2.7.1+cu118", cuda="11.8"))
    (f,) = found(m, "stack.toolkit").values()
    assert f.status == "warn" and "toolkit CUDA 12.4 vs PyTorch's CUDA 11.8" in f.summary
    assert "/usr/local/cuda-12.4/version.json" in f.evidence.measured


def test_matching_toolkit_passes_with_its_expectation__stack_given_in_the_test():
    from gpuvet.facts import Torch

    m = _with_stack("smi_text/q-h100-80gb-hbm3-vm-590.48.01-idle.txt", nvcc_version="12.8.93",
                    torch=Torch(installed=True, version="2.8.0+cu128", cuda="12.8"))
    (f,) = found(m, "stack.toolkit").values()
    assert f.status == "pass" and "driver >= 570.26" in f.evidence.expected


def test_toolkit_version_is_read_from_version_json_or_version_txt(tmp_path):
    from gpuvet.probe.stack import read_toolkit_version

    # The "cuda" entry as CUDA 11.1+ writes /usr/local/cuda/version.json (the SDK's third part may be a date).
    (tmp_path / "version.json").write_text('{\n   "cuda" : {\n      "name" : "CUDA SDK",\n      "version" : "11.8.20220929"\n   }\n}\n')
    assert read_toolkit_version(str(tmp_path)) == "11.8"
    (tmp_path / "version.json").unlink()
    (tmp_path / "version.txt").write_text("CUDA Version 10.2.89\n")  # before 11.1
    assert read_toolkit_version(str(tmp_path)) == "10.2"
    (tmp_path / "version.txt").unlink()
    assert read_toolkit_version(str(tmp_path)) is None


# -- gpu.allreduce: the 1 MiB latency judged against the topology (seed 2: 18 ms PCIe, 2.3 ms NVLink) --

def _allreduce(busbw: float, latency_ms: float) -> list[Measurement]:
    common = {"world_size": 8, "backend": "nccl", "check_ok": True}
    return [Measurement("allreduce.busbw", busbw, "GB/s", "machine", common),
            Measurement("allreduce.latency_1mb", latency_ms * 1000, "us", "machine", {**common, "bytes": 1 << 20})]


def test_allreduce_latency_over_nvlink_like_the_seeds_pcie_case_fails():
    m = machine_from("topo/dgx-a100-8gpu-nv12-12nics-topo-m.txt")  # NV12 between every pair
    ok = found(m, "gpu.allreduce", _allreduce(230.0, 0.09), benchmarks=["allreduce"], device="cuda")["machine"]
    assert ok.status == "pass" and "1 MiB all-reduce 0.09 ms" in ok.summary and "<= 2.3 ms over NVLink" in ok.evidence.expected
    slow = found(m, "gpu.allreduce", _allreduce(230.0, 18.0), benchmarks=["allreduce"], device="cuda")["machine"]
    assert slow.status == "fail"  # the bus bandwidth alone passed
    assert "1 MiB all-reduce 18.0 ms: slower than the seed's 2.3 ms over NVLink" in slow.summary
    assert "18 ms over PCIe, 2.3 ms over NVLink" in slow.evidence.source


def test_allreduce_latency_over_pcie_at_the_seeds_18_ms_warns():
    m = machine_from("topo/dgx1-8gpu-topo-mp-pcie-only.txt")  # `topo -mp`: PCIe paths only
    f = found(m, "gpu.allreduce", _allreduce(9.0, 18.5), benchmarks=["allreduce"], device="cuda")["machine"]
    assert f.status == "warn" and "the seed's slow PCIe case" in f.summary


# -- captures recognised from their content wherever the data starts ------------------------------

def test_smi_xml_with_an_embedded_dtd_is_read_like_the_plain_one():
    edited = machine_from("edited/quadro-p2000-x8-525.125.06-v12-edited-inline-dtd.xml")  # 5 KB of DTD first
    plain = machine_from("smi_xml/quadro-p2000-x8-525.125.06-v12.xml")
    assert [g.name for g in edited.gpus] == [g.name for g in plain.gpus] == ["Quadro P2000"]
    assert edited.driver.version == plain.driver.version == "525.125.06"
    assert capture.read_captures(str(FIXTURES / "edited/quadro-p2000-x8-525.125.06-v12-edited-inline-dtd.xml"))[0].attached == 1


def test_a_bundle_with_crlf_line_ends_is_read_like_the_original():
    edited = capture.read_captures(str(FIXTURES / "edited/l40s-vm-595.80-bundle-edited-crlf.txt"))
    plain = capture.read_captures(str(FIXTURES / "bundles/l40s-vm-595.80.txt"))
    assert [(c.kind, c.phase) for c in edited] == [(c.kind, c.phase) for c in plain]
    assert capture.merge(edited).gpus[0].name == "NVIDIA L40S"


# -- processes unknown vs none; an idle GPU the driver wakes is not a neighbour ---------------------

def test_a_capture_without_a_process_table_says_processes_unknown():
    f = found(machine_from("smi_csv/h100-80gb-hbm3-vm-590.48.01-idle.csv"), "gpu.isolation")["gpu0"]
    assert f.status == "pass" and "processes unknown (the capture has no process list)" in f.summary
    assert "nothing else running" not in f.summary


def test_memory_not_reported_is_not_zero_gib_in_use():
    f = found(machine_from("smi_text/dmon-h100-vm-load-590.48.01.txt"), "gpu.isolation")["gpu0"]  # 100% SM, no memory column
    # A dmon watches a running job: not judged as a neighbour, and never "0.0 GiB in use".
    assert f.status == "skip" and "watches a running job" in f.summary and "0.0 GiB" not in f.summary


def test_a_few_percent_on_an_idle_gpu_without_a_context_is_not_a_tenant__utilization_edited_in_the_test():
    m = machine_from("smi_text/q-l40s-vm-595.80-idle.txt")  # real: 0 MiB used, no process, persistence off, 100%
    m.gpus[0].utilization_pct = 6  # edited: a few percent
    f = found(m, "gpu.isolation")["gpu0"]
    assert f.status == "pass" and "nothing else running on it" in f.summary


def test_watch_does_not_call_the_driver_waking_an_idle_gpu_a_neighbour():
    from gpuvet.judge.diagnose import diagnose_gpu
    from gpuvet.telemetry import Sample

    # The real idle L40S report (0 MiB used, no process, persistence off, utilization 100%) read
    # once a second for a minute, as `gpuvet watch` would see it.
    gpu = machine_from("smi_text/q-l40s-vm-595.80-idle.txt").gpus[0]
    samples = [Sample(t=1_790_000_000.0 + i, power_w=gpu.power.draw_w, power_limit_w=gpu.power.enforced_limit_w,
                      sm_mhz=gpu.clocks.sm_mhz, temp_c=gpu.thermal.gpu_c, util_pct=gpu.utilization_pct,
                      mem_used_mib=gpu.memory_used_mib) for i in range(60)]
    d = diagnose_gpu(samples, gpu, processes=[])
    assert d.state != "neighbour", d


# -- security and Jupyter settings of seed 2, 6.4 --------------------------------------------------

def test_code_server_auth_none_quoted_is_read_as_none():
    from gpuvet.probe.audit import parse_code_server_auth

    assert parse_code_server_auth('bind-addr: 0.0.0.0:8080\nauth: "none"\ncert: false\n') == "none"  # YAML allows quotes
    assert parse_code_server_auth("auth: 'none'  # no login\n") == "none"
    assert parse_code_server_auth("auth: password\npassword: x\n") == "password"


def _home_with(tmp_path, files: dict[str, str]):
    for relative, text in files.items():
        path = tmp_path / "home" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path / "home"), str(tmp_path / "etc")


NBRESUSE = (FIXTURES / "jupyter/nbresuse-serverextension.json").read_text()  # real: the file nbresuse installs


def test_an_enabled_resource_monitor_extension_warns(tmp_path):
    from gpuvet.judge import env
    from gpuvet.probe.audit import collect_audit

    home, etc = _home_with(tmp_path, {".jupyter/jupyter_notebook_config.d/nbresuse.json": NBRESUSE})
    audit = collect_audit(home, etc, environ={})
    assert "nbresuse" in audit.jupyter["resource_monitors"]
    (f,) = [f for f in env.check_jupyter(audit) if "resource-monitor" in f.summary]
    assert f.status == "warn" and "jupyter server extension disable nbresuse" in f.remedy
    assert "resource-monitor extensions poll the GPU" in f.evidence.source


def test_the_seeds_empty_extension_dict_turns_the_monitor_off(tmp_path):
    from gpuvet.probe.audit import collect_audit

    home, etc = _home_with(tmp_path, {".jupyter/jupyter_notebook_config.d/nbresuse.json": NBRESUSE,
                                      ".jupyter/jupyter_notebook_config.py": "c.NotebookApp.nbserver_extensions = {}\n"
                                                                             "c.NotebookApp.autosave_interval = 0\n"})
    audit = collect_audit(home, etc, environ={})
    assert "resource_monitors" not in audit.jupyter
    assert audit.jupyter["autosave"].startswith("off")


def test_autosave_onto_a_network_notebook_directory_warns():
    from gpuvet.judge import env

    audit = Audit(jupyter={"running": "yes", "server": "jupyter-lab pid 42 on 0.0.0.0:8888",
                           "autosave": "on (JupyterLab's default: every 120 s)", "root_dir": "/mnt/nfs/notebooks",
                           "root_dir.at": "command line", "root_dir.kind": "network", "root_dir.fs_type": "nfs4"})
    found_ = [f for f in env.check_jupyter(audit) if "autosave" in f.summary]
    assert found_ and found_[0].status == "warn" and "autosave_interval = 0" in found_[0].remedy


# -- the checklist does not contradict the checks, and its per-GPU words read -----------------------

def _checklist_line(path: str, key: str):
    from gpuvet import runner
    from gpuvet.report.checklist import checklist

    record = runner.inspect([str(FIXTURES / path)])
    return next(line for line in checklist(record) if line.item.key == key), record


def test_one_gpu_of_a_four_gpu_report_is_not_nvlink_not_applicable():
    # Real: attached_gpus 4, one <gpu> element (the contributor trimmed the others).
    line, record = _checklist_line("smi_xml/a100-sxm4-80gb-mig-4x1g-535.54.03-v12.xml", "nvlink")
    assert "not applicable: one GPU" not in line.figure and line.state != "ticked"
    (f,) = [f for f in record.findings if f.check == "gpu.nvlink"]
    assert "NVLink only matters between GPUs" not in f.summary


def test_per_gpu_words_are_whole_phrases_not_fragments():
    k80, _ = _checklist_line("smi_xml/tesla-k80-x4-azure-ecc-retired-430.26-v10.xml", "whole_card")
    assert "gpu1: 58642)" not in k80.figure and k80.figure.count("(") == k80.figure.count(")")
    nvlink, _ = _checklist_line("smi_text/nvlink-status-8x-v100-sxm2-some-inactive.txt", "nvlink")
    assert "inactive:;" not in nvlink.figure and not nvlink.figure.endswith(":")
    view, _ = _checklist_line("smi_text/dmon-h100-vm-load-590.48.01.txt", "pcie_driver_view")
    assert view.figure == "PCIe link not reported: not in the capture"  # gpu.pcie_link's own words, said once


def test_gpuvet_health_warns_on_the_two_views_but_the_node_stays_healthy__driver_reading_added_in_the_test():
    # The same edited machine as above: the driver's x8 behind lspci's x16 is shown by `gpuvet health`
    # (as gpu.pcie_link showed it before the views had their own check), and a warning drains nothing.
    from gpuvet.judge import judge_health
    from gpuvet.judge.health import HEALTHY, outcome

    m = machine_from(ADA_LSPCI)
    m.gpus[0].pcie.readings.insert(0, PcieLink(current_gen=4, max_gen=4, current_width=8, max_width=8, source="nvidia-smi"))
    findings = judge_health(m)
    (view,) = [f for f in findings if f.check == "gpu.pcie_driver_view"]
    assert view.status == "warn" and "but the host shows Gen4 x16 (lspci LnkCap)" in view.summary
    assert outcome(m, findings) == HEALTHY
