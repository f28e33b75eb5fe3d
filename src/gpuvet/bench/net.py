"""Network benchmark (B7): TCP latency and throughput on loopback and between two machines.

Loopback (`run_loopback`, subject "loopback"): the seed's `ping 127.0.0.1` done over TCP
(`net.loopback_latency`, microseconds: small request/response messages over one connection), and
`net.loopback_throughput` (Gbit/s, one stream). Node to node (`serve` on one machine, `test` on
the other, subject "net:<host>"): `net.tcp_latency` and `net.tcp_throughput` (4 streams), each
with the route in its details (`interface`, `source_address`, `peer_address`: the local interface
the traffic left through, so the judge compares with that link's speed).

Latency is always measured by gpuvet's own client and server (iperf3 has no latency test); it
includes Python's few microseconds each way, so it is a TCP round trip as an application sees
it. Throughput uses iperf3's client and server when iperf3 is installed (engine "auto" or
"iperf3"; its --json receiver figure), gpuvet's otherwise ("builtin"), which measures the way
iperf3 does at its defaults: one stream of 128 KiB writes (iperf3's default length) for the
same whole seconds, Nagle's algorithm left on (iperf3 sets TCP_NODELAY only with -N; with it,
the loopback stream read 3-8% more than iperf3 in paired runs), kernel-tuned socket buffers (no
-w), and the figure is the bytes the receiver got over the receiver's time (iperf3's
"sum_received"). `details.engine` and `details.method` say which and how. One --engine flag
drives disk and net, so "fio" is taken to mean iperf3 here.

gpuvet's server speaks a tiny protocol of its own, gpuvet-net/1, on PORT + 1 (iperf3 keeps its
usual PORT, 5201). The client opens a TCP connection and sends one line:
    "GPUVET-NET/1 HELLO\\n"  server: "GPUVET-NET/1 OK iperf3=<port or none>\\n", then closes
    "GPUVET-NET/1 ECHO\\n"   server: "GPUVET-NET/1 OK\\n", then sends back every byte it gets
    "GPUVET-NET/1 SINK\\n"   server: "GPUVET-NET/1 OK\\n", then reads and discards until the client
                            shuts down its sending side, and answers "<bytes> <seconds>\\n" (bytes
                            received, seconds from the first byte to the end of the stream)
Anything else gets "GPUVET-NET/1 ERROR <why>\\n". Every socket has a timeout, every child process
a deadline; what cannot be measured becomes a `bench.net` note instead of an exception.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Any, Callable

from ..samples import quantile
from .common import measurement
from .leftovers import die_with_parent

PROTOCOL = "GPUVET-NET/1"
DEFAULT_PORT = 5201  # iperf3's; gpuvet's own server listens on DEFAULT_PORT + 1
ENGINES = ("auto", "iperf3", "builtin")
BLOCK_BYTES = 128 * 1024  # iperf3's default TCP write length
PING_BYTES = 32
PING_WARMUP = 50
PING_MAX = 20_000
NODE_STREAMS = 4  # between machines one TCP stream rarely fills a 100 GbE link; loopback uses one
CONNECT_TIMEOUT_S = 5.0
IO_TIMEOUT_S = 10.0
START_TIMEOUT_S = 10.0  # a server process to listen


class NetError(Exception):
    """A network test could not run; the message says why and what to do."""


# -- gpuvet-net/1 server ----------------------------------------------------------------------

class Server:
    """gpuvet's own server: one thread per connection, until `close()`."""

    def __init__(self, host: str = "", port: int = 0, iperf3_port: int | None = None):
        self.iperf3_port = iperf3_port
        self.socket = _listen(host, port)
        self.port = self.socket.getsockname()[1]
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def serve_forever(self) -> None:
        self.socket.settimeout(0.2)  # wake up to notice close()
        while not self._closed.is_set():
            try:
                conn, _ = self.socket.accept()
            except (socket.timeout, BlockingIOError):
                continue
            except OSError:
                break
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def start(self) -> Server:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting and free the port (the accept loop is waited for, so a new server can bind)."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self.socket.close()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            _set_timeouts(conn, IO_TIMEOUT_S)
            try:
                request = read_line(conn)
                if request == f"{PROTOCOL} HELLO":
                    conn.sendall(f"{PROTOCOL} OK iperf3={self.iperf3_port or 'none'}\n".encode())
                elif request == f"{PROTOCOL} ECHO":
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small replies go at once
                    conn.sendall(f"{PROTOCOL} OK\n".encode())
                    _echo(conn)
                elif request == f"{PROTOCOL} SINK":
                    conn.sendall(f"{PROTOCOL} OK\n".encode())
                    received, seconds = _sink(conn)
                    conn.sendall(f"{received} {seconds:.6f}\n".encode())
                else:
                    conn.sendall(f"{PROTOCOL} ERROR unknown request {request[:40]!r}\n".encode())
            except OSError:
                pass  # the client went away or timed out: nothing to tell anyone


def _listen(host: str, port: int) -> socket.socket:
    if host == "" and socket.has_dualstack_ipv6():
        with contextlib.suppress(OSError):  # IPv6 disabled in the kernel: fall back to IPv4
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=16)
    return socket.create_server((host or "0.0.0.0", port), backlog=16)


def _set_timeouts(conn: socket.socket, seconds: float) -> None:
    """Time limits kept by the kernel (SO_RCVTIMEO/SO_SNDTIMEO): Python's own socket timeout
    polls before every send and receive, which halves a stream's throughput."""
    conn.settimeout(None)
    whole = int(seconds)
    timeval = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


def read_line(conn: socket.socket, limit: int = 256) -> str:
    """One protocol line, read a byte at a time so no payload is swallowed."""
    line = bytearray()
    while len(line) < limit:
        byte = conn.recv(1)
        if not byte or byte == b"\n":
            break
        line += byte
    return line.decode("ascii", "replace").strip()


def _echo(conn: socket.socket) -> None:
    buffer = bytearray(4096)
    while True:
        size = conn.recv_into(buffer)
        if not size:
            return
        conn.sendall(memoryview(buffer)[:size])


def _sink(conn: socket.socket) -> tuple[int, float]:
    buffer = memoryview(bytearray(BLOCK_BYTES))  # larger buffers fall out of the CPU cache: slower
    received, first = 0, None
    while True:
        size = conn.recv_into(buffer)
        if not size:
            break
        if first is None:
            first = time.perf_counter()
        received += size
    return received, (time.perf_counter() - first) if first else 0.0


# -- gpuvet-net/1 client ----------------------------------------------------------------------

def connect(host: str, port: int, request: str, nodelay: bool = False) -> tuple[socket.socket, str]:
    """A connection that made `request`. `nodelay`: TCP_NODELAY, for small request/response
    messages; a throughput stream leaves Nagle on, as iperf3 does without -N."""
    conn = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    try:
        _set_timeouts(conn, IO_TIMEOUT_S)
        if nodelay:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(f"{PROTOCOL} {request}\n".encode())
        answer = read_line(conn)
        if not answer.startswith(f"{PROTOCOL} OK"):
            raise NetError(f"{host}:{port} is not a gpuvet server (it answered {answer[:60]!r})")
        return conn, answer
    except BaseException:
        conn.close()
        raise


def hello(host: str, port: int) -> int | None:
    """Ask a gpuvet server (on `port`) where its iperf3 server listens; None: it has none."""
    return _hello(host, port)[0]


def _hello(host: str, port: int) -> tuple[int | None, str, str]:
    """(iperf3 port or None, this end's address, the server's address) of one HELLO."""
    conn, answer = connect(host, port, "HELLO")
    with conn:
        local, peer = conn.getsockname()[0], conn.getpeername()[0]
    value = answer.rpartition("iperf3=")[2]
    return (int(value) if value.isdigit() else None), local, peer


def reach(host: str, port: int = DEFAULT_PORT) -> dict[str, Any]:
    """Whether `gpuvet net serve --port PORT` answers at `host` (gpuvet's server on PORT + 1), and
    the route there: {"iperf3_port", "source_address", "peer_address", "interface"} (the local
    interface holding the source address the kernel chose, so the link it measured is known).
    Raises NetError saying what to run when no server answers."""
    try:
        iperf3_port, source, peer = _hello(host, port + 1)
    except socket.gaierror as err:
        raise NetError(f"cannot resolve {host!r}: {err.strerror or err}") from None
    except (OSError, NetError) as err:
        raise NetError(f"no gpuvet server answered at {host}:{port + 1} ({error_words(err)}): run "
                       f"`gpuvet net serve --port {port}` there and let TCP ports {port} and {port + 1} through") from None
    return {"iperf3_port": iperf3_port, "source_address": source, "peer_address": peer,
            "interface": interface_with_address(source)}


def interface_with_address(address: str) -> str | None:
    """The network interface that holds `address` (the source address of a connection: the one
    its packets leave through); None when no interface lists it."""
    try:
        import psutil

        interfaces = psutil.net_if_addrs()
    except Exception:  # noqa: BLE001 - no psutil support here: the route stays unknown
        return None
    wanted = address.split("%")[0]
    for name, addresses in interfaces.items():
        if any((a.address or "").split("%")[0] == wanted for a in addresses):
            return name
    return None


def ping(host: str, port: int, seconds: float) -> list[int]:
    """Round-trip times (ns) of PING_BYTES messages echoed on one connection, for `seconds`."""
    conn, _ = connect(host, port, "ECHO", nodelay=True)
    with conn:
        message, reply = b"p" * PING_BYTES, bytearray(PING_BYTES)
        for _ in range(PING_WARMUP):  # wake both ends up, grow windows
            _round_trip(conn, message, reply)
        times: list[int] = []  # ns
        end = time.perf_counter() + seconds
        while time.perf_counter() < end and len(times) < PING_MAX:
            start = time.perf_counter_ns()
            _round_trip(conn, message, reply)
            times.append(time.perf_counter_ns() - start)
        return times


def _round_trip(conn: socket.socket, message: bytes, reply: bytearray) -> None:
    conn.sendall(message)
    view, got = memoryview(reply), 0
    while got < len(reply):
        size = conn.recv_into(view[got:])
        if not size:
            raise NetError("the server closed the connection")
        got += size


def stream(host: str, port: int, seconds: float) -> tuple[int, float]:
    """Send 128 KiB writes for `seconds` on one connection (Nagle on, default socket buffers:
    iperf3's defaults); (bytes, seconds) as the receiver counted them, from its first byte to
    the end of the stream."""
    conn, _ = connect(host, port, "SINK")
    with conn:
        block = memoryview(os.urandom(BLOCK_BYTES))
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            conn.sendall(block)
        conn.shutdown(socket.SHUT_WR)
        _set_timeouts(conn, IO_TIMEOUT_S + seconds)
        received, _, elapsed = read_line(conn).partition(" ")
    if not received.isdigit() or not elapsed:
        raise NetError("the server did not report what it received")
    return int(received), float(elapsed)


# -- iperf3 -----------------------------------------------------------------------------------

def find_iperf3() -> str | None:
    """iperf3 on PATH (tests hide it by changing PATH)."""
    return shutil.which("iperf3")


def iperf3_client(binary: str, host: str, port: int, seconds: int, streams: int = 1) -> dict[str, Any]:
    """iperf3 for `seconds` with `streams` parallel streams; the receiver's figures from --json."""
    command = [binary, "-c", host, "-p", str(port), "-t", str(seconds), "-P", str(streams), "--json",
               "--connect-timeout", str(int(CONNECT_TIMEOUT_S * 1000))]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 2 * IO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise NetError(f"iperf3 did not finish within {seconds + 2 * IO_TIMEOUT_S:.0f} s") from None
    return parse_iperf3_json(done.stdout)


def parse_iperf3_json(text: str) -> dict[str, Any]:
    """iperf3 --json -> {"bits_per_second", "bytes", "seconds", "retransmits"} (receiver side)."""
    try:
        report = json.loads(text)
    except ValueError:
        raise NetError(f"iperf3 printed no JSON: {text.strip()[:120]!r}") from None
    if report.get("error"):
        raise NetError(f"iperf3: {report['error']}")
    end = report.get("end") or {}
    received, sent = end.get("sum_received") or {}, end.get("sum_sent") or {}
    if not received.get("bits_per_second"):
        raise NetError("iperf3 reported no received data")
    return {"bits_per_second": float(received["bits_per_second"]), "bytes": int(received.get("bytes") or 0),
            "seconds": float(received.get("seconds") or 0.0), "retransmits": sent.get("retransmits")}


class _Iperf3Server:
    """`iperf3 -s` on a port, until closed, and never longer than gpuvet lives (kill -9 of
    gpuvet included: Linux sends it SIGTERM then). `one_off`: it exits after its one client."""

    def __init__(self, binary: str, port: int, bind: str | None = None, one_off: bool = False):
        command = [binary, "-s", "-p", str(port)] + (["-B", bind] if bind else []) + (["-1"] if one_off else [])
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, preexec_fn=die_with_parent())
        assert self.process.stderr is not None  # opened as PIPE
        self.errors: IO[bytes] = self.process.stderr
        self.port = port

    def wait_listening(self, timeout: float = START_TIMEOUT_S) -> None:
        """Poll the kernel's socket table: a trial connection would be taken for a client."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise NetError(f"iperf3 -s exited: {self.errors.read().decode(errors='replace').strip()[:160]}")
            listening = _is_listening(self.port)
            if listening is None:  # no /proc/net/tcp (not Linux): give it a moment
                time.sleep(0.5)
                return
            if listening:
                return
            time.sleep(0.01)
        raise NetError(f"iperf3 -s did not listen on port {self.port} within {timeout:.0f} s")

    def close(self) -> None:
        _stop(self.process)


def _is_listening(port: int) -> bool | None:
    """Whether a socket on this machine listens on TCP `port`; None: the table is unreadable."""
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):  # Linux
        try:
            with open(table) as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        readable = True
        if any(row[3] == "0A" and int(row[1].rpartition(":")[2], 16) == port for row in rows):  # 0A: LISTEN
            return True
    return False if readable else None


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=3)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- loopback ---------------------------------------------------------------------------------

_CHILD = """
import sys
from gpuvet.bench.net import Server
server = Server("127.0.0.1", 0).start()
print(server.port, flush=True)
sys.stdin.read()  # until the parent closes the pipe (or dies)
server.close()
"""


class _ChildServer:
    """gpuvet's server in another process on 127.0.0.1, so the two ends do not share one GIL."""

    def __init__(self) -> None:
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
        self.process = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=env)
        process = self.process
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None  # opened as PIPEs
        self.to_child: IO[bytes] = process.stdin
        ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
        line = process.stdout.readline().strip() if ready else b""
        if not line.isdigit():
            self.close()
            raise NetError(f"the loopback server did not start: {process.stderr.read().decode(errors='replace')[-200:]}")
        self.port = int(line)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.to_child.close()
        try:
            self.process.wait(timeout=3)
        except subprocess.TimeoutExpired:
            _stop(self.process)


def run_loopback(engine: str = "auto", budget_s: float = 5.0, progress: Callable[[str], None] = lambda m: None) -> list[dict]:
    """TCP latency and throughput over 127.0.0.1, in about `budget_s` seconds."""
    engine = _engine(engine)
    results: list[dict] = []
    try:
        server = _ChildServer()
    except (NetError, OSError) as err:
        return [note("loopback", "failed", str(err))]
    try:
        progress("net loopback: TCP round trips")
        results.append(_latency("net.loopback_latency", "loopback", ping("127.0.0.1", server.port, min(1.0, 0.25 * budget_s))))
        progress("net loopback: TCP throughput")
        seconds = max(1, int(0.5 * budget_s))
        results.append(_loopback_throughput(engine, server.port, seconds))
    except (NetError, OSError) as err:
        results.append(note("loopback", "failed", error_words(err)))
    finally:
        server.close()
    return results


def _loopback_throughput(engine: str, builtin_port: int, seconds: int) -> dict:
    binary = find_iperf3() if engine in ("auto", "iperf3") else None
    if engine == "iperf3" and binary is None:
        return note("loopback", "skipped", "iperf3 is not installed (`apt-get install iperf3`); or use --engine builtin")
    if binary:
        server = _Iperf3Server(binary, free_port(), bind="127.0.0.1", one_off=True)
        try:
            server.wait_listening()
            result = iperf3_client(binary, "127.0.0.1", server.port, seconds)
        finally:
            server.close()
        return _throughput("net.loopback_throughput", "loopback", "iperf3", result)
    received, elapsed = stream("127.0.0.1", builtin_port, seconds)
    return _throughput("net.loopback_throughput", "loopback", "builtin",
                       {"bits_per_second": 8 * received / elapsed, "bytes": received, "seconds": elapsed})


# -- node to node -----------------------------------------------------------------------------

def serve(port: int = DEFAULT_PORT, engine: str = "auto", ready: Callable[[str], None] = lambda m: None,
          stop: threading.Event | None = None, listening: Callable[[dict], None] = lambda ports: None) -> None:
    """Serve `gpuvet net test` clients until Ctrl-C (or `stop` is set): gpuvet-net/1 on
    `port + 1`, and `iperf3 -s` on `port` when iperf3 is installed and the engine allows it.
    `ready` gets the sentence for a person, `listening` the ports ({"port", "iperf3_port"})."""
    engine = _engine(engine)
    binary = find_iperf3() if engine in ("auto", "iperf3") else None
    if engine == "iperf3" and binary is None:
        raise NetError("iperf3 is not installed (`apt-get install iperf3`); or use --engine builtin")
    iperf3 = _Iperf3Server(binary, port) if binary else None
    server = None
    try:
        if iperf3:
            iperf3.wait_listening()
        server = Server("", port + 1, iperf3_port=port if iperf3 else None).start()
        ready(f"gpuvet net server on TCP port {port + 1}" + (f", iperf3 server on port {port}" if iperf3 else
                                                             " (throughput: gpuvet's own stream)")
              + f"; on the other machine run `gpuvet net test <this host> --port {port}`")
        listening({"port": port + 1, "iperf3_port": port if iperf3 else None})
        while not (stop and stop.is_set()):
            if iperf3 and iperf3.process.poll() is not None:
                raise NetError(f"iperf3 -s stopped (exit status {iperf3.process.returncode})")
            time.sleep(0.2)
    finally:
        if server:
            server.close()
        if iperf3:
            iperf3.close()


def test(host: str, port: int = DEFAULT_PORT, engine: str = "auto", budget_s: float = 10.0,
         progress: Callable[[str], None] = lambda m: None) -> list[dict]:
    """TCP latency and throughput to a machine running `gpuvet net serve` (subject net:<host>).
    Both measurements carry the route (`interface`, `source_address`, `peer_address`)."""
    engine = _engine(engine)
    subject = f"net:{host}"
    try:
        route = reach(host, port)
    except NetError as err:
        return [note(subject, "failed", str(err))]
    path = {k: v for k, v in route.items() if k != "iperf3_port" and v is not None}
    results: list[dict] = []
    try:
        progress(f"net {host}: TCP round trips")
        latency = _latency("net.tcp_latency", subject, ping(host, port + 1, min(2.0, 0.2 * budget_s)))
        latency["details"].update(path)
        results.append(latency)
        progress(f"net {host}: TCP throughput")
        throughput = _remote_throughput(engine, host, port, route["iperf3_port"], max(1, int(0.6 * budget_s)))
        if throughput["value"] is not None:
            throughput["details"].update(path)
        results.append(throughput)
    except (OSError, NetError) as err:
        results.append(note(subject, "failed", error_words(err)))
    return results


test.__test__ = False  # type: ignore[attr-defined]  # `gpuvet net test`, not a pytest test


def _remote_throughput(engine: str, host: str, port: int, remote_iperf3: int | None, seconds: int) -> dict:
    subject = f"net:{host}"
    binary = find_iperf3() if engine in ("auto", "iperf3") else None
    if engine == "iperf3" and binary is None:
        return note(subject, "skipped", "iperf3 is not installed here (`apt-get install iperf3`); or use --engine builtin")
    if engine == "iperf3" and remote_iperf3 is None:
        return note(subject, "skipped", f"the server at {host} runs without iperf3 (started with --engine builtin, or "
                                        f"iperf3 missing there: `apt-get install iperf3` and restart `gpuvet net serve`); "
                                        "or use --engine builtin")
    if binary and remote_iperf3:
        result = iperf3_client(binary, host, remote_iperf3, seconds, NODE_STREAMS)
        return _throughput("net.tcp_throughput", subject, "iperf3", result, NODE_STREAMS)
    return _throughput("net.tcp_throughput", subject, "builtin", parallel_streams(host, port + 1, seconds, NODE_STREAMS),
                       NODE_STREAMS)


def parallel_streams(host: str, port: int, seconds: float, streams: int) -> dict[str, Any]:
    """`streams` connections sending at once (threads: the sends run in the kernel, outside the
    GIL); all bytes received over the longest receiver's time."""
    results: list[tuple[int, float]] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            results.append(stream(host, port, seconds))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    received, elapsed = sum(r[0] for r in results), max(r[1] for r in results)
    return {"bits_per_second": 8 * received / elapsed, "bytes": received, "seconds": elapsed}


# -- measurements -----------------------------------------------------------------------------

THROUGHPUT_METHOD = {
    "iperf3": "iperf3 -c -t <seconds> -P {streams} --json at its defaults; its sum_received: bytes received / "
              "receiver's seconds",
    "builtin": "{streams} TCP stream{s} of 128 KiB writes for the test's seconds, Nagle on, kernel-tuned socket buffers "
               "(iperf3's defaults); bytes received / receiver's seconds (first byte to end of stream)",
}


def note(subject: str, outcome: str, reason: str) -> dict:
    """A `bench.net` entry: what was not measured and why."""
    return measurement("bench.net", None, "", subject, outcome=outcome, reason=reason)


def error_words(err: BaseException) -> str:
    if isinstance(err, NetError):
        return str(err)
    if isinstance(err, (socket.timeout, BlockingIOError)) or getattr(err, "errno", None) in (errno.EAGAIN, errno.EWOULDBLOCK):
        return "timed out waiting for the other end"
    return f"{type(err).__name__}: {err}"


def _engine(engine: str) -> str:
    """One --engine flag drives disk and net: "fio" (the disk's external tool) means iperf3 here."""
    engine = "iperf3" if engine == "fio" else engine
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    return engine


def _latency(name: str, subject: str, times_ns: list[int]) -> dict:
    if not times_ns:
        raise NetError("no round trip completed")
    ordered = sorted(times_ns)

    def at(pct: float) -> float:
        return round(quantile(ordered, pct / 100) / 1e3, 1)

    return measurement(name, at(50), "us", subject, engine="builtin", p99_us=at(99), min_us=round(ordered[0] / 1e3, 1),
                       round_trips=len(ordered), message_bytes=PING_BYTES,
                       method=f"TCP request/response of {PING_BYTES} bytes on one connection, TCP_NODELAY, median")


def _throughput(name: str, subject: str, engine: str, result: dict[str, Any], streams: int = 1) -> dict:
    details = {"engine": engine, "streams": streams, "bytes": result["bytes"], "seconds": round(result["seconds"], 3),
               "method": THROUGHPUT_METHOD[engine].format(streams=streams, s="" if streams == 1 else "s")}
    if engine == "builtin":
        details["block_bytes"] = BLOCK_BYTES
    if result.get("retransmits") is not None:
        details["retransmits"] = result["retransmits"]
    return measurement(name, round(result["bits_per_second"] / 1e9, 2), "Gbit/s", subject, **details)
