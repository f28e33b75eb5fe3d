"""Node-to-node network tests: gpuvet net serve / gpuvet net test HOST."""

from __future__ import annotations

import click

from .base import cli


@cli.group()
def net() -> None:
    """TCP throughput and latency between two machines (iperf3 when installed, built-in otherwise)."""


@net.command()
@click.option("--port", type=click.IntRange(1, 65535), default=5201, show_default=True)
@click.option("--engine", type=click.Choice(["auto", "iperf3", "builtin"]), default="auto", show_default=True)
def serve(port: int, engine: str) -> None:
    """Wait for `gpuvet net test` from another machine (Ctrl-C to stop)."""
    from ..bench import net as net_bench

    net_bench.serve(port=port, engine=engine, ready=lambda message: click.echo(message, err=True))


@net.command("test")
@click.argument("host")
@click.option("--port", type=click.IntRange(1, 65535), default=5201, show_default=True)
@click.option("--engine", type=click.Choice(["auto", "iperf3", "builtin"]), default="auto", show_default=True)
@click.option("--seconds", type=click.FloatRange(min=1), default=10.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the measurements as JSON.")
def test_cmd(host: str, port: int, engine: str, seconds: float, as_json: bool) -> None:
    """Measure TCP throughput and latency to HOST, where `gpuvet net serve` runs."""
    import json

    from ..bench import net as net_bench

    measurements = net_bench.test(host, port=port, engine=engine, budget_s=seconds)
    if as_json:
        click.echo(json.dumps(measurements, indent=2))
        return
    for m in measurements:
        if m["value"] is None:
            click.echo(f"{m['name']}: {m['details'].get('outcome', 'not measured')}: {m['details'].get('reason', '')}")
        else:
            click.echo(f"{m['name']:<22} {m['value']:.4g} {m['unit']}  ({m['details'].get('engine', '')})")
