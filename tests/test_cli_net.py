"""`gpuvet net test HOST` as a user meets it: a judged run record (terminal, --json, --out),
saved to the history, and one line with exit code 2 when no server answers. The server is
`gpuvet net serve` on this machine's loopback, with iperf3 hidden (the built-in engine)."""

from __future__ import annotations

import json

import pytest

from gpuvet.bench import net
from cli_runner import gpuvet
from gpuvet.store import Store
from test_bench_net import Serving, free_port_pair

SECONDS = "2"


@pytest.fixture
def no_iperf3(empty_path):
    """gpuvet's own network engine at both ends."""


def test_net_test_prints_a_judged_report_with_the_verdict_last_and_saves_it(capsys, no_iperf3, tmp_path):
    db = str(tmp_path / "runs.sqlite3")
    with Serving("builtin") as server:
        code, out, err = gpuvet(capsys, "net", "test", "127.0.0.1", "--port", str(server.port), "--seconds", SECONDS,
                                "--db", db, "-v")
    lines = out.strip().splitlines()
    node = next(line for line in lines if "net.node_to_node" in line)
    # Both ends on this machine: no network link was measured, so it is not a PASS (issue 15).
    assert "MEAS" in node and "to 127.0.0.1: round trip" in node and "4 streams (builtin) through lo" in node
    assert "net.tcp_throughput" in out and "Gbit/s" in out  # the Measured section
    verdict, saved = lines[-2:]  # the verdict, then where the run is kept
    assert verdict.startswith(("PASS", "WARN", "FAIL")) and code == (1 if verdict.startswith("FAIL") else 0)
    assert saved.startswith("saved as run")
    with Store(db) as store:
        record = store.latest()
    assert record.options["profile"] == "net-test" and record.options["peer"] == "127.0.0.1"
    assert record.machine.host.nics  # the facts the link is judged against


def test_net_test_json_and_out_carry_the_finding_and_the_route(capsys, no_iperf3, tmp_path):
    out_file = tmp_path / "net.json"
    with Serving("builtin") as server:
        code, out, _ = gpuvet(capsys, "net", "test", "127.0.0.1", "--port", str(server.port), "--seconds", SECONDS,
                              "--json", "--no-save", "--out", str(out_file))
    record = json.loads(out)
    assert json.loads(out_file.read_text())["findings"] == record["findings"]
    (node,) = [f for f in record["findings"] if f["check"] == "net.node_to_node"]
    assert node["subject"] == "net:127.0.0.1" and node["evidence"]["expected"] and node["evidence"]["source"]
    throughput = next(m for m in record["measurements"] if m["name"] == "net.tcp_throughput")
    assert throughput["details"]["interface"] == "lo" and throughput["details"]["source_address"] == "127.0.0.1"
    assert code == (1 if record["verdict"] == "fail" else 0)


def test_no_server_is_one_line_and_exit_2(capsys):
    port = free_port_pair()
    code, out, err = gpuvet(capsys, "net", "test", "127.0.0.1", "--port", str(port), "--no-save")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "no gpuvet server answered at 127.0.0.1" in err
    assert f"gpuvet net serve --port {port}" in err


def test_an_unresolvable_host_is_one_line_and_exit_2(capsys):
    code, _, err = gpuvet(capsys, "net", "test", "no-such-host.invalid", "--no-save")
    assert code == 2 and err.startswith("gpuvet: cannot resolve 'no-such-host.invalid'") and err.count("\n") == 1


def test_fio_is_accepted_as_the_external_tool_and_a_server_without_iperf3_is_named(capsys, no_iperf3, monkeypatch):
    """--engine fio means iperf3 here (one flag for disk and net). With iperf3 present here but
    not behind the server (started with --engine builtin), the skip says so."""
    monkeypatch.setattr(net, "find_iperf3", lambda: "/usr/bin/iperf3")
    with Serving("builtin") as server:
        code, out, _ = gpuvet(capsys, "net", "test", "127.0.0.1", "--port", str(server.port), "--seconds", SECONDS,
                              "--engine", "fio", "--json", "--no-save")
    record = json.loads(out)
    (node,) = [f for f in record["findings"] if f["check"] == "net.node_to_node"]
    assert "the server at 127.0.0.1 runs without iperf3 (started with --engine builtin" in node["summary"]
    assert record["options"]["engine"] == "fio"
