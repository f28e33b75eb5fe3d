"""The commands that vet a machine: run, bench, inspect."""

from __future__ import annotations

import click

from .. import runner
from ..bench.plan import ALL as BENCHMARKS
from ..probe.errors import CaptureError
from .base import UsageProblem, check_out_path, cli, emit, output_options, progress_status, save, store_options


@cli.command()
@click.option("--quick", is_flag=True, help="Facts only, no load (seconds).")
@click.option("--soak", type=click.FloatRange(min=0.1), metavar="MINUTES", help="Hold the sustained load this long.")
@click.option("--force", is_flag=True, help="Benchmark GPUs even when other processes use them.")
@click.option("--preemptible/--on-demand", default=None,
              help="Say whether the instance can be reclaimed (spot/preemptible); the checklist ticks it.")
@output_options
@store_options
def run(quick: bool, soak: float | None, force: bool, preemptible: bool | None, expect: str | None, as_json: bool,
        out: str | None, verbose: bool, report_format: str, redact: bool, db: str | None, no_save: bool,
        label: str | None, price: float | None) -> None:
    """Vet this machine: read its facts, benchmark its GPUs (about two minutes), judge it all."""
    check_out_path(out)
    with progress_status(as_json) as progress:
        record = runner.run_live(quick=quick and not soak, expect=expect, soak_minutes=soak, force=force,
                                 preemptible=preemptible, progress=progress)
    save(record, db, no_save, label, price)
    emit(record, as_json, out, verbose, report_format, redact)


@cli.command(help=f"Run chosen benchmarks alone (NAME: {', '.join(BENCHMARKS)}), judged like in `gpuvet run`.")
@click.argument("names", nargs=-1, required=True, type=click.Choice(BENCHMARKS), metavar="NAME...")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="Run on the GPUs, or on the CPU (GEMM, memory copy, sustained and all-reduce measure it for real).")
@click.option("--force", is_flag=True, help="Benchmark GPUs even when other processes use them.")
@output_options
@store_options
def bench(names: tuple[str, ...], device: str, force: bool, expect: str | None, as_json: bool, out: str | None,
          verbose: bool, report_format: str, redact: bool, db: str | None, no_save: bool, label: str | None,
          price: float | None) -> None:
    check_out_path(out)
    with progress_status(as_json) as progress:
        record = runner.run_live(quick=True, expect=expect, benchmarks=list(dict.fromkeys(names)), device=device,
                                 force=force, progress=progress)
    save(record, db, no_save, label, price)
    emit(record, as_json, out, verbose, report_format, redact)


@cli.command()
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@output_options
def inspect(files: tuple[str, ...], expect: str | None, as_json: bool, out: str | None, verbose: bool,
            report_format: str, redact: bool) -> None:
    """Judge captures taken elsewhere: nvidia-smi -q -x / -q, topo -m, nvlink -s, lspci -vv,
    capture bundles (several files of one machine merge), or a stored gpuvet run record."""
    check_out_path(out)
    try:
        record = runner.inspect(list(files), expect=expect)
    except CaptureError as err:
        raise UsageProblem(str(err)) from None
    emit(record, as_json, out, verbose, report_format, redact)


