"""Node-to-node network tests: gpuvet net serve / gpuvet net test HOST."""

from __future__ import annotations

import click

from .. import runner
from .base import UsageProblem, check_out_path, cli, emit, output_options, progress_status, save, store_options

# One --engine flag drives disk and net elsewhere; here "fio" means the external tool, iperf3.
NET_ENGINES = ["auto", "iperf3", "builtin", "fio"]
ENGINE_HELP = "iperf3 on both machines when installed, gpuvet's own stream otherwise (fio: same as iperf3)."


@cli.group()
def net() -> None:
    """TCP throughput and latency between two machines (iperf3 when installed, built-in otherwise)."""


@net.command()
@click.option("--port", type=click.IntRange(1, 65534), default=5201, show_default=True,
              help="iperf3's port; gpuvet's own server listens on PORT + 1.")
@click.option("--engine", type=click.Choice(NET_ENGINES), default="auto", show_default=True, help=ENGINE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Once listening, print one JSON line on stdout: the ports served.")
def serve(port: int, engine: str, as_json: bool) -> None:
    """Wait for `gpuvet net test` from another machine (Ctrl-C to stop)."""
    import json

    from ..bench import net as net_bench

    def listening(ports: dict) -> None:
        if as_json:
            click.echo(json.dumps({"serving": True, **ports}))

    try:
        net_bench.serve(port=port, engine=engine, ready=lambda message: click.echo(message, err=True), listening=listening)
    except (net_bench.NetError, OSError) as err:
        raise UsageProblem(f"net serve: {net_bench.error_words(err)}") from None


@net.command("test")
@click.argument("host")
@click.option("--port", type=click.IntRange(1, 65534), default=5201, show_default=True,
              help="The port given to `gpuvet net serve` on HOST.")
@click.option("--engine", type=click.Choice(NET_ENGINES), default="auto", show_default=True, help=ENGINE_HELP)
@click.option("--seconds", type=click.FloatRange(min=1), default=10.0, show_default=True,
              help="About how long the test takes (most of it the throughput stream).")
@click.option("--multi-node", is_flag=True, help="The two machines are for multi-node training: judge the link for it.")
@output_options
@store_options
def test_cmd(host: str, port: int, engine: str, seconds: float, multi_node: bool, expect: str | None, as_json: bool,
             out: str | None, verbose: bool, report_format: str, redact: bool, db: str | None, no_save: bool,
             label: str | None, price: float | None) -> None:
    """Measure TCP throughput and latency to HOST, where `gpuvet net serve` runs; judged against
    the link the traffic leaves through, saved like `gpuvet run`."""
    from ..bench import net as net_bench

    check_out_path(out)
    try:  # before minutes of work: no server there is a usage problem, said in one line
        net_bench.reach(host, port)
    except net_bench.NetError as err:
        raise UsageProblem(str(err)) from None
    with progress_status(as_json) as progress:
        record = runner.run_net_test(host, port, engine, seconds, progress, expect=expect, multi_node=multi_node)
    saved_as = save(record, db, no_save, label, price)
    emit(record, as_json, out, verbose, report_format, redact, saved_as)


test_cmd.__test__ = False  # type: ignore[attr-defined]  # a command, not a pytest test
