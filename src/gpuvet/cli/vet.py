"""The commands that vet a machine: run, bench, inspect."""

from __future__ import annotations

import json
import sys

import click

from .. import runner
from ..runner import ALL_BENCHMARKS as BENCHMARKS
from ..probe.capture import STDIN
from ..probe.errors import CaptureError
from .base import (UsageProblem, check_out_path, cli, emit, load_run_file, output_options,
                   progress_status, save, store_options, xid_window_option)


def _needs(dataset_gb: float | None, checkpoint_gb: float | None, multi_node: bool) -> dict:
    """What the user's training needs, for judging storage and network against it."""
    needs = {"dataset_gb": dataset_gb, "checkpoint_gb": checkpoint_gb, "multi_node": multi_node or None}
    return {k: v for k, v in needs.items() if v is not None}


def host_bench_options(fn):
    fn = click.option("--multi-node", is_flag=True, help="This machine is for multi-node training: judge RDMA and NICs for it.")(fn)
    fn = click.option("--checkpoint-gb", type=click.FloatRange(min=0.1), metavar="GB",
                      help="Checkpoint size to judge storage against (default 10).")(fn)
    fn = click.option("--dataset-gb", type=click.FloatRange(min=0.1), metavar="GB",
                      help="Dataset size read per epoch, to judge storage against (default 50).")(fn)
    fn = click.option("--engine", type=click.Choice(["auto", "fio", "iperf3", "builtin"]), default="auto", show_default=True,
                      help="Storage/network engine: fio and iperf3 when installed, gpuvet's own otherwise (--engine fio or iperf3: the external tools for both).")(fn)
    fn = click.option("--path", "paths", multiple=True, type=click.Path(file_okay=False, exists=True), metavar="DIR",
                      help="Test storage here too (repeatable): the shared or network path your data lives on.")(fn)
    return fn


@cli.command()
@click.option("--quick", is_flag=True, help="Facts only, no load (seconds).")
@click.option("--soak", type=click.FloatRange(min=0.1), metavar="MINUTES", help="Hold the sustained load this long.")
@click.option("--force", is_flag=True, help="Benchmark GPUs even when other processes use them.")
@click.option("--preemptible/--on-demand", default=None,
              help="Say whether the instance can be reclaimed (spot/preemptible); the checklist ticks it.")
@click.option("--workload-steps", type=click.IntRange(min=2), metavar="N", help="Train the reference workload this many steps.")
@click.option("--plan", "show_plan", is_flag=True, help="Print what the run would do here (steps, GPUs, budgets, total) and run nothing.")
@xid_window_option(None, "since boot")
@host_bench_options
@output_options
@store_options
def run(quick: bool, soak: float | None, force: bool, preemptible: bool | None, workload_steps: int | None,
        show_plan: bool, xid_window: float | None, paths: tuple[str, ...], engine: str, dataset_gb: float | None, checkpoint_gb: float | None,
        multi_node: bool, expect: str | None, as_json: bool, out: str | None, verbose: bool, report_format: str,
        redact: bool, db: str | None, no_save: bool, label: str | None, price: float | None) -> None:
    """Vet this machine: its facts, then benchmarks of host and GPUs (about two minutes), all judged."""
    if show_plan:
        emit_plan(runner.plan_live(quick=quick and not soak, soak_minutes=soak, force=force, paths=list(paths) or None,
                                   workload_steps=workload_steps), as_json)
        return
    check_out_path(out)
    with progress_status(as_json) as progress:
        record = runner.run_live(quick=quick and not soak, expect=expect, soak_minutes=soak, force=force,
                                 preemptible=preemptible, paths=list(paths) or None, engine=engine,
                                 workload_steps=workload_steps, progress=progress,
                                 needs=_needs(dataset_gb, checkpoint_gb, multi_node), xid_window_s=xid_window or None)
    saved_as = save(record, db, no_save, label, price)
    emit(record, as_json, out, verbose, report_format, redact, saved_as)


@cli.command(help=f"Run chosen benchmarks alone (NAME: {', '.join(BENCHMARKS)}), judged like in `gpuvet run`.")
@click.argument("names", nargs=-1, required=True, type=click.Choice(BENCHMARKS), metavar="NAME...")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="GPU benchmarks on the GPUs, or on the CPU (GEMM, memory copy, sustained, all-reduce and the "
                   "workload measure it for real).")
@click.option("--force", is_flag=True, help="Benchmark GPUs even when other processes use them.")
@click.option("--steps", type=click.IntRange(min=2), metavar="N", help="workload: train this many steps.")
@host_bench_options
@output_options
@store_options
def bench(names: tuple[str, ...], device: str, force: bool, steps: int | None, paths: tuple[str, ...], engine: str,
          dataset_gb: float | None, checkpoint_gb: float | None, multi_node: bool, expect: str | None, as_json: bool,
          out: str | None, verbose: bool, report_format: str, redact: bool, db: str | None, no_save: bool,
          label: str | None, price: float | None) -> None:
    check_out_path(out)
    with progress_status(as_json) as progress:
        record = runner.run_live(quick=True, expect=expect, benchmarks=list(dict.fromkeys(names)), device=device,
                                 force=force, paths=list(paths) or None, engine=engine, workload_steps=steps,
                                 progress=progress, needs=_needs(dataset_gb, checkpoint_gb, multi_node))
    saved_as = save(record, db, no_save, label, price)
    emit(record, as_json, out, verbose, report_format, redact, saved_as)


@cli.command()
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("--plan", "show_plan", is_flag=True, help="Print what the default `gpuvet run` would do on the machine in the captures.")
@xid_window_option(None, "since boot; a capture's window ends at its kernel log's last dated line")
@output_options
def inspect(files: tuple[str, ...], show_plan: bool, xid_window: float | None, expect: str | None, as_json: bool, out: str | None, verbose: bool,
            report_format: str, redact: bool) -> None:
    """Judge captures taken elsewhere: nvidia-smi -q -x / -q, topo -m, nvlink -s / -e, lspci -vv,
    capture bundles (several files of one machine merge), or a stored gpuvet run record.
    FILE "-" reads one capture from stdin: `ssh HOST nvidia-smi -q -x | gpuvet inspect -`."""
    check_out_path(out)
    _check_stdin(files)
    if show_plan:
        try:
            emit_plan(runner.plan_captures(list(files)), as_json)
        except CaptureError as err:
            raise UsageProblem(str(err)) from None
        return
    try:
        if len(files) == 1 and runner.saved_json_kind(files[0]) == "export":  # `gpuvet export` output: judged again like a run record
            record = runner.rejudge(load_run_file(files[0]), expect=expect, xid_window_s=xid_window)
        else:
            record = runner.inspect(list(files), expect=expect, xid_window_s=xid_window)
    except CaptureError as err:
        raise UsageProblem(str(err)) from None
    emit(record, as_json, out, verbose, report_format, redact)


def emit_plan(plan, as_json: bool) -> None:
    """A plan, as text or JSON; planning is not a verdict, so the exit code is 0."""
    if as_json:
        click.echo(json.dumps(plan.to_dict(), indent=2))
    else:
        from ..report import terminal
        from ..report.plan_view import render_plan

        terminal.print_columns(terminal.stdout_console(), render_plan(plan.to_dict()).splitlines())


def _check_stdin(files: tuple[str, ...]) -> None:
    """"-" is read once, and only from a pipe: a terminal would wait for input with no prompt."""
    if files.count(STDIN) > 1:
        raise UsageProblem("give \"-\" (stdin) once: it holds one capture")
    if STDIN in files and (sys.stdin is None or sys.stdin.isatty()):
        raise UsageProblem("\"-\" reads a capture from stdin, but stdin is a terminal; pipe one in, "
                           "e.g. `ssh HOST nvidia-smi -q -x | gpuvet inspect -`")


@cli.command()
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True)
@click.option("--path", "path", type=click.Path(file_okay=False, exists=True), metavar="DIR",
              help="Where to save the checkpoint (default: here): the shared or persistent path your job will use.")
@click.option("--steps", type=click.IntRange(min=2), metavar="N", help="Training steps (default: a short run).")
@output_options
@store_options
def workload(device: str, path: str | None, steps: int | None, expect: str | None, as_json: bool, out: str | None,
             verbose: bool, report_format: str, redact: bool, db: str | None, no_save: bool, label: str | None,
             price: float | None) -> None:
    """Train a small GPT end to end: tokens/s, MFU, then checkpoint, restore in a fresh process, resume."""
    check_out_path(out)
    with progress_status(as_json) as progress:
        record = runner.run_live(quick=True, expect=expect, benchmarks=["workload"], device=device,
                                 paths=[path] if path else None, workload_steps=steps, progress=progress)
    saved_as = save(record, db, no_save, label, price)
    emit(record, as_json, out, verbose, report_format, redact, saved_as)
