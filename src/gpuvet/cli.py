"""gpuvet's command line: thin commands over runner (probe -> judge) and report.

Exit codes: 0 nothing failed, 1 a check failed, 2 bad usage or unreadable input.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

import click
from rich.console import Console

from . import __version__, runner
from .bench.plan import ALL as BENCHMARKS
from .probe.errors import CaptureError
from .record import SCHEMA, RunRecord, exit_code
from .report import terminal

EXIT_USAGE = 2


class UsageProblem(click.ClickException):
    exit_code = EXIT_USAGE


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuvet")
def cli() -> None:
    """Find out what GPU machine you really rented: facts, measurements, verdicts with evidence."""


def _output_options(fn):
    fn = click.option("-v", "--verbose", is_flag=True, help="List every finding, passes included.")(fn)
    fn = click.option("--out", metavar="FILE", help="Also write the run record (JSON) to FILE.")(fn)
    fn = click.option("--json", "as_json", is_flag=True, help="Print the run record as JSON instead of the report.")(fn)
    fn = click.option("--expect", metavar="MODEL", help='The GPU model you paid for, e.g. "A100 80GB" or "RTX 4090".')(fn)
    return fn


@cli.command()
@click.option("--quick", is_flag=True, help="Facts only, no load (seconds).")
@click.option("--soak", type=click.FloatRange(min=0.1), metavar="MINUTES", help="Hold the sustained load this long.")
@click.option("--force", is_flag=True, help="Benchmark GPUs even when other processes use them.")
@_output_options
def run(quick: bool, soak: float | None, force: bool, expect: str | None, as_json: bool, out: str | None, verbose: bool) -> None:
    """Vet this machine: read its facts, benchmark its GPUs (about two minutes), judge it all."""
    _check_out_path(out)
    with _progress(as_json) as progress:
        record = runner.run_live(quick=quick and not soak, expect=expect, soak_minutes=soak, force=force, progress=progress)
    _emit(record, as_json, out, verbose)


@cli.command(help=f"Run chosen benchmarks alone (NAME: {', '.join(BENCHMARKS)}), judged like in `gpuvet run`.")
@click.argument("names", nargs=-1, required=True, type=click.Choice(BENCHMARKS), metavar="NAME...")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="Run on the GPUs, or on the CPU (GEMM, memory copy, sustained and all-reduce measure it for real).")
@click.option("--force", is_flag=True, help="Benchmark GPUs even when other processes use them.")
@_output_options
def bench(names: tuple[str, ...], device: str, force: bool, expect: str | None, as_json: bool, out: str | None,
          verbose: bool) -> None:
    _check_out_path(out)
    with _progress(as_json) as progress:
        record = runner.run_live(quick=True, expect=expect, benchmarks=list(dict.fromkeys(names)), device=device,
                                 force=force, progress=progress)
    _emit(record, as_json, out, verbose)


@contextlib.contextmanager
def _progress(quiet: bool):
    """A one-line status on stderr while benchmarks run (only on a terminal)."""
    console = Console(stderr=True)
    if quiet or not console.is_terminal:
        yield lambda message: None
        return
    with console.status("gpuvet: starting") as status:
        yield lambda message: status.update(f"gpuvet: {message}")


@cli.command()
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@_output_options
def inspect(files: tuple[str, ...], expect: str | None, as_json: bool, out: str | None, verbose: bool) -> None:
    """Judge captures taken elsewhere: nvidia-smi -q -x / -q, topo -m, nvlink -s, lspci -vv,
    capture bundles (several files of one machine merge), or a stored gpuvet run record."""
    _check_out_path(out)
    try:
        record = runner.inspect(list(files), expect=expect)
    except CaptureError as err:
        raise UsageProblem(str(err)) from None
    _emit(record, as_json, out, verbose)


def _emit(record: RunRecord, as_json: bool, out: str | None, verbose: bool) -> None:
    if out:
        _write_atomically(out, record.to_json() + "\n")
    if as_json:
        click.echo(record.to_json())
    else:
        terminal.render(record, Console(highlight=False, soft_wrap=True), verbose=verbose)
        if out:
            click.echo(f"run record written to {out}")
    sys.exit(exit_code(record.findings))


def _check_out_path(out: str | None) -> None:
    """Refuse before any work: a missing folder, or a file that is not ours (a typo must not eat
    the user's `train.py`)."""
    if not out:
        return
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise UsageProblem(f"--out {out}: the folder {folder} does not exist")
    if os.path.isdir(out):
        raise UsageProblem(f"--out {out}: is a folder; give a file name")
    if os.path.exists(out) and not _is_gpuvet_json(out):
        raise UsageProblem(f"--out {out}: the file exists and is not a gpuvet run record; choose another name")


def _is_gpuvet_json(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return False
    return not head.strip() or (head.lstrip().startswith(b"{") and SCHEMA.encode() in head)


def _write_atomically(path: str, text: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".gpuvet-", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as err:
        raise UsageProblem(f"--out {path}: cannot write it ({err.strerror or err})") from None


def main(argv: list[str] | None = None) -> None:
    """Entry point: click's errors become one line on stderr and exit 2, never a traceback."""
    try:
        cli.main(args=argv, prog_name="gpuvet", standalone_mode=False)
    except click.exceptions.Exit as exit_:
        sys.exit(exit_.exit_code)
    except click.ClickException as err:
        hint = " (see gpuvet --help)" if isinstance(err, click.UsageError) else ""
        click.echo(f"gpuvet: {err.format_message()}{hint}", err=True)
        sys.exit(EXIT_USAGE if err.exit_code in (1, 2) else err.exit_code)
    except click.Abort:
        click.echo("gpuvet: aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("gpuvet: interrupted", err=True)
        sys.exit(130)
