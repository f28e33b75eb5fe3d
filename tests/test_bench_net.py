"""The network benchmark over this machine's loopback: both engines, gpuvet's own server and
protocol, node-to-node through `serve`/`test` on 127.0.0.1, and notes instead of exceptions."""

from __future__ import annotations

import shutil
import socket
import threading

import pytest

from gpuvet.bench import net

BUDGET_S = 2.0
needs_iperf3 = pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 is not installed (apt-get install iperf3)")


@pytest.fixture
def no_iperf3(empty_path):
    assert net.find_iperf3() is None


def by_name(results: list[dict]) -> dict[str, dict]:
    return {m["name"]: m for m in results}


def check_latency(m: dict, subject: str) -> None:
    assert m["subject"] == subject and m["unit"] == "us" and m["details"]["engine"] == "builtin"
    assert 0 < m["details"]["min_us"] <= m["value"] <= m["details"]["p99_us"]
    assert m["details"]["round_trips"] >= 100


def check_throughput(m: dict, subject: str, engine: str) -> None:
    assert m["subject"] == subject and m["unit"] == "Gbit/s" and m["details"]["engine"] == engine
    assert m["value"] > 0.1 and m["details"]["bytes"] > 0
    assert ("iperf3 -c" if engine == "iperf3" else "Nagle on") in m["details"]["method"]


# -- loopback ---------------------------------------------------------------------------------

def test_loopback_builtin_when_iperf3_is_hidden(no_iperf3):
    found = by_name(net.run_loopback(budget_s=BUDGET_S))
    assert set(found) == {"net.loopback_latency", "net.loopback_throughput"}
    check_latency(found["net.loopback_latency"], "loopback")
    check_throughput(found["net.loopback_throughput"], "loopback", "builtin")
    assert found["net.loopback_throughput"]["details"]["block_bytes"] == net.BLOCK_BYTES


@needs_iperf3
def test_loopback_with_iperf3():
    found = by_name(net.run_loopback(engine="iperf3", budget_s=BUDGET_S))
    check_latency(found["net.loopback_latency"], "loopback")
    check_throughput(found["net.loopback_throughput"], "loopback", "iperf3")


def test_iperf3_requested_but_missing_still_measures_latency(no_iperf3):
    found = by_name(net.run_loopback(engine="iperf3", budget_s=BUDGET_S))
    check_latency(found["net.loopback_latency"], "loopback")
    note = found["bench.net"]
    assert note["subject"] == "loopback" and note["details"]["outcome"] == "skipped"
    assert "iperf3 is not installed" in note["details"]["reason"]


def test_unknown_engine_is_refused_and_fio_means_the_external_tool(no_iperf3):
    with pytest.raises(ValueError, match="engine"):
        net.run_loopback(engine="netperf")
    # `--engine fio` drives disk and net alike: here it asks for iperf3, which is hidden
    (note,) = [m for m in net.run_loopback(engine="fio", budget_s=1.0) if m["name"] == "bench.net"]
    assert "iperf3 is not installed" in note["details"]["reason"]


# -- node to node: serve and test on 127.0.0.1 ------------------------------------------------

def free_port_pair() -> int:
    """A port p with p and p + 1 both free (the iperf3 port and gpuvet's)."""
    for _ in range(50):
        port = net.free_port()
        if port < 65535:
            with socket.socket() as probe:
                try:
                    probe.bind(("", port + 1))
                    return port
                except OSError:
                    continue
    raise RuntimeError("no free port pair")


class Serving:
    """`net.serve` in a thread, stopped on exit; `messages` holds what it announced."""

    def __init__(self, engine: str):
        self.port, self.stop, self.messages, self.errors = free_port_pair(), threading.Event(), [], []
        self.ready = threading.Event()

        def announce(message: str) -> None:
            self.messages.append(message)
            self.ready.set()

        def serve() -> None:
            try:
                net.serve(self.port, engine, ready=announce, stop=self.stop)
            except Exception as err:  # noqa: BLE001 - reported by the test
                self.errors.append(err)
                self.ready.set()

        self.thread = threading.Thread(target=serve, daemon=True)

    def __enter__(self) -> Serving:
        self.thread.start()
        assert self.ready.wait(10) and not self.errors, self.errors
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(5)
        assert not self.thread.is_alive()


def test_serve_and_test_with_gpuvets_own_protocol(no_iperf3):
    with Serving("builtin") as server:
        assert f"port {server.port + 1}" in server.messages[0]
        assert net.hello("127.0.0.1", server.port + 1) is None  # no iperf3 behind it
        found = by_name(net.test("127.0.0.1", server.port, budget_s=BUDGET_S))
    subject = "net:127.0.0.1"
    check_latency(found["net.tcp_latency"], subject)
    check_throughput(found["net.tcp_throughput"], subject, "builtin")
    assert found["net.tcp_throughput"]["details"]["streams"] == net.NODE_STREAMS
    for name in ("net.tcp_latency", "net.tcp_throughput"):  # the route, for judging against the right link
        details = found[name]["details"]
        assert details["source_address"] == details["peer_address"] == "127.0.0.1"
        assert details["interface"] == net.interface_with_address("127.0.0.1") is not None
    # The port is free again: a second server can start at once.
    with Serving("builtin"):
        pass


@needs_iperf3
def test_serve_and_test_with_iperf3():
    with Serving("auto") as server:
        assert net.hello("127.0.0.1", server.port + 1) == server.port
        found = by_name(net.test("127.0.0.1", server.port, budget_s=BUDGET_S))
    check_latency(found["net.tcp_latency"], "net:127.0.0.1")
    check_throughput(found["net.tcp_throughput"], "net:127.0.0.1", "iperf3")


def test_no_server_is_a_note_that_says_what_to_run():
    port = free_port_pair()
    (note,) = net.test("127.0.0.1", port)
    assert note["name"] == "bench.net" and note["subject"] == "net:127.0.0.1"
    assert note["details"]["outcome"] == "failed"
    assert "gpuvet net serve" in note["details"]["reason"] and f"{port} and {port + 1}" in note["details"]["reason"]


def test_reach_says_where_the_traffic_leaves_or_why_no_server_answered():
    with Serving("builtin") as server:
        route = net.reach("127.0.0.1", server.port)
    assert route["iperf3_port"] is None and route["source_address"] == "127.0.0.1"
    assert route["interface"] == net.interface_with_address("127.0.0.1")
    port = free_port_pair()
    with pytest.raises(net.NetError, match=f"gpuvet net serve --port {port}"):
        net.reach("127.0.0.1", port)
    assert net.interface_with_address("192.0.2.77") is None  # TEST-NET-1: on no interface here


def test_a_silent_server_times_out_into_a_note(monkeypatch):
    monkeypatch.setattr(net, "IO_TIMEOUT_S", 0.3)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (backlog), never answers
        port = silent.getsockname()[1] - 1
        (note,) = net.test("127.0.0.1", port)
    assert note["details"]["outcome"] == "failed" and "timed out" in note["details"]["reason"]


def test_the_protocol_refuses_unknown_requests():
    server = net.Server("127.0.0.1", 0).start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
            conn.sendall(b"GET / HTTP/1.0\n")
            assert net.read_line(conn).startswith("GPUVET-NET/1 ERROR")
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
            conn.sendall(b"GPUVET-NET/1 HELLO\n")
            assert net.read_line(conn) == "GPUVET-NET/1 OK iperf3=none"
    finally:
        server.close()


def test_throughput_stream_leaves_nagle_on_as_iperf3_does_and_round_trips_turn_it_off():
    """iperf3 sets TCP_NODELAY only with -N; the built-in stream must not either (with it, the
    loopback stream read several percent more than iperf3). Round trips of 32 bytes need it."""
    server = net.Server("127.0.0.1", 0).start()
    try:
        for request, nodelay in (("SINK", False), ("ECHO", True)):
            conn, _ = net.connect("127.0.0.1", server.port, request, nodelay=nodelay)
            with conn:
                assert bool(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)) is nodelay
    finally:
        server.close()


def test_sink_counts_what_arrives():
    server = net.Server("127.0.0.1", 0).start()
    try:
        received, seconds = net.stream("127.0.0.1", server.port, 0.2)
    finally:
        server.close()
    assert received > 0 and 0 < seconds < 5


# -- iperf3 output ----------------------------------------------------------------------------

def test_iperf3_json_receiver_figures_and_errors():
    report = ('{"start": {}, "end": {"sum_sent": {"bytes": 2000, "bits_per_second": 9.5e9, "retransmits": 3},'
              ' "sum_received": {"seconds": 2.0, "bytes": 1999, "bits_per_second": 9.4e9}}}')
    assert net.parse_iperf3_json(report) == {"bits_per_second": 9.4e9, "bytes": 1999, "seconds": 2.0, "retransmits": 3}
    with pytest.raises(net.NetError, match="unable to connect"):
        net.parse_iperf3_json('{"start": {}, "end": {}, "error": "unable to connect to server: Connection refused"}')
    with pytest.raises(net.NetError, match="no JSON"):
        net.parse_iperf3_json("iperf3: error - the server is busy running a test. try again later")
