"""Output a person can scan: wrapped to the terminal with a hanging indent, whole lines in a
file or pipe, a long reason said once, progress lines in a log, ASCII terminals without a
traceback, usage errors that name the subcommand's help."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from gpuvet import runner
from gpuvet.record import RunRecord
from gpuvet.report import terminal
from gpuvet.store import Store

ROOT = Path(__file__).parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
H100_VM = str(FIXTURES / "smi_text" / "q-8x-h100-sxm-vm-swpowercap-535.183.01.txt")
NO_DRIVER = "no NVIDIA driver: the NVML library (libnvidia-ml.so.1) is not installed or not mounted into this container"


def _on_terminal(record: RunRecord, width: int = 80) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=width, color_system=None, highlight=False, soft_wrap=True)
    terminal.render(record, console)
    return buffer.getvalue()


def _gpuvet(*argv: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **env}
    return subprocess.run([sys.executable, "-m", "gpuvet", *argv], capture_output=True, text=True, env=environment,
                          timeout=120)


def test_on_a_terminal_lines_wrap_at_words_under_the_text_they_continue():
    out = _on_terminal(runner.inspect([H100_VM]))
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    failed = next(f for f in runner.inspect([H100_VM]).findings if f.status == "fail")
    assert " ".join(failed.summary.split()) in " ".join(out.split())  # every word whole, in order
    # The checklist's figures continue in their own column, a problem's text under its badge.
    start = next(i for i, line in enumerate(lines) if "Whole GPU, not shared" in line)
    assert lines[start + 1].startswith(" " * 43) and not lines[start + 1][43].isspace()
    fail = next(i for i, line in enumerate(lines) if line.startswith("  FAIL  gpu.throttle"))
    assert lines[fail + 1].startswith(" " * 8) and not lines[fail + 1][8].isspace()


def test_in_a_file_lines_are_whole():
    buffer = io.StringIO()
    terminal.render(runner.inspect([H100_VM]), Console(file=buffer, width=100_000, highlight=False, soft_wrap=True))
    assert max(len(line) for line in buffer.getvalue().splitlines()) > 150


def test_a_reason_many_checks_share_is_said_once_whole():
    record = RunRecord.from_dict(json.loads((FIXTURES / "records" / "cpu-quick.json").read_text()))
    record.machine.gpu_error = NO_DRIVER
    for f in record.findings:  # as a machine without a driver reads: the NVML reason in every GPU check
        if f.check.startswith("gpu.") and f.status == "skip":
            f.summary = f"no GPU facts: {NO_DRIVER}"
    assert sum(NO_DRIVER in f.summary for f in record.findings) >= 3
    out = _on_terminal(record, width=400)
    assert out.count("libnvidia-ml.so.1") == 1 and "no NVIDIA driver (see GPUs above)" in out


def test_history_piped_to_a_file_is_not_cut_at_80_columns(tmp_path):
    db = str(tmp_path / "runs.sqlite3")
    label = "provider A, region eu-west, spot, second try after the driver update"
    with Store(db) as store:
        store.save(RunRecord.from_dict(json.loads((FIXTURES / "records" / "cpu-quick.json").read_text())), label=label)
    done = _gpuvet("history", "--db", db)
    assert done.returncode == 0, done.stderr
    assert label in done.stdout and max(len(line) for line in done.stdout.splitlines()) > 80


def test_an_ascii_terminal_gets_ascii_stand_ins_not_a_traceback():
    done = _gpuvet("inspect", H100_VM, PYTHONIOENCODING="ascii")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-600:]
    assert "  +  Power limit at the default" in done.stdout and " - capture, inspected " in done.stdout


def test_a_usage_error_points_to_the_subcommands_help():
    done = _gpuvet("inspect", "--bogus", H100_VM)
    assert done.returncode == 2 and done.stderr.strip().endswith("(see gpuvet inspect --help)"), done.stderr


def test_progress_is_a_timestamped_line_per_step_when_stderr_is_not_a_terminal(tmp_path):
    done = _gpuvet("bench", "disk", "--path", str(tmp_path), "--no-save")
    steps = [line for line in done.stderr.splitlines() if line.startswith("gpuvet ") and " UTC: " in line]
    assert steps, done.stderr[-800:]
    assert all(line[7:15].count(":") == 2 for line in steps)  # gpuvet HH:MM:SS UTC: what it does


def test_bench_reports_only_the_chosen_benchmarks_checks():
    done = _gpuvet("bench", "gemm", "--no-save", "--json")
    checks = {f["check"] for f in json.loads(done.stdout)["findings"]}
    assert checks and checks <= {"gpu.gemm", "gpu.correctness"}, checks  # no host or security audit
    text = _gpuvet("bench", "gemm", "--no-save").stdout
    assert "env." not in text and "host.cpu" not in text and "storage.workdir" not in text
    assert "gpu.gemm" in text and "nothing could be checked from this input" not in text


def test_a_mistyped_expect_is_a_usage_error_with_the_model_it_meant():
    done = _gpuvet("inspect", "--expect", "H10O 80GB", H100_VM)
    assert done.returncode == 2 and "did you mean 'H100 80GB'?" in done.stderr and not done.stdout
    assert _gpuvet("inspect", "--expect", "H100 80GB", H100_VM).returncode == 1  # a real model: judged (gpu2 fails)
    assert _gpuvet("inspect", "--expect", "Quantum 9000", H100_VM).returncode == 1  # nothing close: judged as told


def test_a_path_that_does_not_exist_is_refused_before_anything_runs(tmp_path):
    done = _gpuvet("run", "--path", str(tmp_path / "missing"), "--no-save")
    assert done.returncode == 2 and "does not exist" in done.stderr and "(see gpuvet run --help)" in done.stderr
    assert "reading the machine's facts" not in done.stderr and not done.stdout


def _commands(command, path=()):
    import click

    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield " ".join(path), command


def test_every_command_takes_json():
    from gpuvet.cli import cli

    for name, command in _commands(cli):
        if name in ("export", "schema"):  # their output is JSON already
            continue
        opts = {o for p in command.params for o in getattr(p, "opts", [])}
        formats = [getattr(p.type, "choices", ()) for p in command.params if "--format" in getattr(p, "opts", [])]
        assert "--json" in opts or any("json" in choices for choices in formats), name


def test_label_import_and_doctor_print_json(tmp_path):
    db = str(tmp_path / "runs.sqlite3")
    imported = _gpuvet("import", str(FIXTURES / "records" / "cpu-quick.json"), "--db", db, "--json")
    assert json.loads(imported.stdout) == [{"id": 1, "imported": True, "kept": []}], imported.stderr
    labelled = _gpuvet("label", "1", "--label", "spot box", "--price", "1.5", "--db", db, "--json")
    assert json.loads(labelled.stdout) == {"id": 1, "label": "spot box", "price": 1.5}
    symptoms = json.loads(_gpuvet("doctor", "--json").stdout)
    assert {"name": "slower-and-slower", "description": "Normal at first, then slower and slower"} in symptoms
    answer = json.loads(_gpuvet("doctor", "slower and slower", "--run", str(FIXTURES / "records" / "h100-8x-synthetic-sustained.json"),
                                "--json").stdout)
    assert answer["symptom"] == "slower-and-slower" and answer["run"]["verdict"] == "fail"
    assert {c["state"] for c in answer["causes"]} <= {"confirmed", "unknown", "ruled_out"} and answer["causes"]


def test_net_serve_prints_the_ports_it_serves_as_json_once_listening():
    from test_bench_net import free_port_pair

    port = free_port_pair()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    server = subprocess.Popen([sys.executable, "-m", "gpuvet", "net", "serve", "--port", str(port), "--engine", "builtin",
                               "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = server.stdout.readline()  # blocks until the server listens (or exits)
        assert json.loads(line) == {"serving": True, "port": port + 1, "iperf3_port": None}
    finally:
        server.terminate()
        server.wait(30)


def test_bench_without_torch_on_a_gpu_machine_is_one_skip_line_and_the_pip_line_for_its_driver_once():
    from gpuvet import judge
    from gpuvet.bench import plan
    from gpuvet.facts import Stack, Torch
    from gpuvet.probe import capture
    from gpuvet.record import Measurement

    machine = capture.merge(capture.read_captures(H100_VM))  # 8 x H100, driver 535 (CUDA 12.2)
    machine.stack = Stack(torch=Torch(installed=False))
    outcome = plan.run(machine, ["gemm"], device="cuda")
    measurements = [Measurement(**m) for m in outcome.measurements]
    options = {"profile": "bench", "benchmarks": ["gemm"], "device": "cuda"}
    findings = judge.of_benchmarks(judge.judge(machine, measurements, options), ["gemm"])
    record = RunRecord(machine=machine, started_at="2026-12-01T00:00:00", measurements=measurements, findings=findings,
                       options=options)
    out = _on_terminal(record, width=400)
    skips = [line for line in out.splitlines() if "SKIP " in line]
    assert len(skips) == 1 and "PyTorch is not installed (see PyTorch above)" in skips[0], out
    assert out.count("install torch==2.5.1 --index-url https://download.pytorch.org/whl/cu121`") == 1  # CUDA 12.2's newest
    assert "  PyTorch: not installed; to add one this machine runs: `" in out
