"""What every command shares: the group, output options, writing records, one-line errors."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import sys
from datetime import datetime, timezone

import click

from ..console import Console
from .. import __version__
from ..bench.leftovers import own_temp_dir
from ..private_file import write_private
from ..probe.bounded_read import end_command, process_age, start_command
from ..record import SCHEMA, RecordError, RunRecord, exit_code
from ..record.load import Loaded
from ..report import terminal
from ..store import Store, StoreError, check_price
from ..untrusted_text import one_line

EXIT_USAGE = 2


class UsageProblem(click.ClickException):
    exit_code = EXIT_USAGE


def open_store(db: str | None, create: bool = False, read_only: bool = False) -> Store:
    try:
        return Store(db, create=create, read_only=read_only)
    except StoreError as err:
        raise UsageProblem(str(err)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuvet")
def cli() -> None:
    """Find out what GPU machine you really rented: facts, measurements, verdicts with evidence."""


class PriceType(click.ParamType):
    """USD per hour: a positive finite number, checked before any work (a zero or infinite price
    makes every cost meaningless, and JSON cannot carry Infinity or NaN)."""

    name = "USD_PER_HOUR"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        try:
            return check_price(value.strip() if isinstance(value, str) else value)
        except ValueError as err:
            self.fail(str(err), param, ctx)


PRICE = PriceType()


class WindowType(click.ParamType):
    """A time window: "2h", "90m", "30s", "1d" (a bare number is seconds); "boot" (or 0): since
    boot. Converts to seconds, 0.0 for since boot."""

    name = "WINDOW"
    _UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        text = str(value).strip().lower()
        if text in ("boot", "0"):
            return 0.0
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?", text)
        if not m or float(m.group(1)) <= 0:
            self.fail(f"{value!r} is not a window: give e.g. 2h, 90m, 1d or boot", param, ctx)
        return float(m.group(1)) * self._UNITS[m.group(2) or "s"]


WINDOW = WindowType()


def xid_window_option(default: str | None, help_default: str):
    return click.option("--xid-window", "xid_window", type=WINDOW, default=default, metavar="WINDOW",
                        help="Judge kernel-log Xid/SXid/AER events this recent (2h, 90m, 1d, boot); older ones are "
                             f"shown as history, not failing (the log keeps them until reboot). Default: {help_default}.")


def output_options(fn):
    fn = _report_needs_out(fn)
    fn = click.option("--redact", is_flag=True, help="Remove hostnames, serials, UUIDs and IP/MAC addresses (to share publicly).")(fn)
    fn = click.option("--report", "report_format", type=click.Choice(["json", "md", "html"]), default="json",
                      show_default=True, help="What --out writes: the run record, Markdown, or a self-contained HTML page.")(fn)
    fn = click.option("-v", "--verbose", is_flag=True, help="List every finding, passes included.")(fn)
    fn = click.option("--out", metavar="FILE", help="Also write the run record (or --report FORMAT) to FILE.")(fn)
    fn = click.option("--json", "as_json", is_flag=True, help="Print the run record as JSON instead of the report.")(fn)
    fn = click.option("--expect", metavar="MODEL", help='The GPU model you paid for, e.g. "A100 80GB" or "RTX 4090".')(fn)
    return fn


def _report_needs_out(fn):
    """`--report md|html` says what --out writes: without --out nothing would be written, so refuse
    before any work rather than run for minutes and drop the report."""

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if kwargs.get("report_format", "json") != "json" and not kwargs.get("out"):
            fmt = kwargs["report_format"]
            raise UsageProblem(f"--report {fmt} writes a file: add --out FILE (e.g. --out report.{fmt})")
        check_expect(kwargs.get("expect"))
        return fn(*args, **kwargs)

    return checked


def check_expect(expect: str | None) -> None:
    """A mistyped --expect is refused before any work (a usage error, not a FAIL of the machine)."""
    from ..judge.gpu_identity import expect_typo

    guess = expect_typo(expect) if expect else None
    if guess:
        raise UsageProblem(f"--expect {expect!r} names no GPU model gpuvet knows: did you mean {guess!r}?")


@contextlib.contextmanager
def progress_status(quiet: bool):
    """What gpuvet is doing, on stderr while benchmarks run: one status line that updates itself on
    a terminal; elsewhere (`gpuvet run 2>&1 | tee log`, a batch job) one plain timestamped line per
    step, so a log shows where minutes went."""
    console = Console(stderr=True)
    if quiet:
        yield lambda message: None
        return
    if not console.is_terminal:
        def line(message: str) -> None:
            click.echo(f"gpuvet {datetime.now(timezone.utc):%H:%M:%S} UTC: {message}", err=True)

        yield line
        return
    with console.status("gpuvet: starting") as status:
        yield lambda message: status.update(f"gpuvet: {message}")



def store_options(fn):
    fn = click.option("--price", type=PRICE, metavar="USD_PER_HOUR", help="What this machine costs per hour (USD, more than 0).")(fn)
    fn = click.option("--label", metavar="TEXT", help='Where this run was taken, e.g. "provider A, region x".')(fn)
    fn = click.option("--no-save", is_flag=True, help="Do not keep this run in the local history.")(fn)
    fn = click.option("--db", metavar="PATH", help="The history database (default: $GPUVET_DB or ~/.local/share/gpuvet).")(fn)
    return fn


def save(record: RunRecord, db: str | None, no_save: bool, label: str | None, price: float | None) -> int | None:
    """Keep the run in the history and return its id (None: not kept); a store that cannot be written
    warns and never loses the report. The report says "saved as run N" under its verdict (emit)."""
    if label:
        record.options["label"] = label
    if price is not None:
        record.options["price"] = price
    if no_save:
        return None
    try:
        with Store(db) as store:
            return store.save(record, label=label, price_per_hour=price)
    except (StoreError, ValueError) as err:  # ValueError: a price the options check let through
        say(f"gpuvet: warning: run not saved: {err}")
        return None


def load_run_file(path: str) -> RunRecord:
    """A run record file (`gpuvet run --out`), or an export (`gpuvet export ID...`): one run is
    that run; of several, the first, with a line on stderr saying how to reach the others.
    RecordError (one line, exit 2) for anything else."""
    from ..record.load import EXPORT, RUN, load

    return first_run(load(path, (RUN, EXPORT)))


def first_run(loaded: Loaded) -> RunRecord:
    """The run of a loaded run record, or the first of an export (saying so on stderr)."""
    from ..record.load import EXPORT

    if loaded.kind == EXPORT and len(loaded.data) > 1:
        count, loaded.data = len(loaded.data), loaded.data[:1]
        run = loaded.runs()[0]  # checked first: a refusal stays the only line
        say(f"gpuvet: {loaded.where} holds {count} runs (a gpuvet export); this is the first. "
            f"For another: gpuvet import {loaded.where}, then gpuvet show ID")
        return run
    return loaded.runs()[0]


def rendered(record: RunRecord, fmt: str) -> str:
    """A record as a file's content: JSON, Markdown or HTML."""
    if fmt == "md":
        from ..report.markdown import render_markdown

        return render_markdown(record)
    if fmt == "html":
        from ..report.html import render_html

        return render_html(record)
    return record.to_json() + "\n"


def emit(record: RunRecord, as_json: bool, out: str | None, verbose: bool, report_format: str = "json",
         redact: bool = False, saved_as: int | None = None) -> None:
    """Print the report (or JSON), write --out, and exit with the verdict's code; `saved_as`: the
    history's id of the run, said under the verdict (on stderr with --json)."""
    if redact:
        from ..report.redact import redact as redact_record

        record = redact_record(record)
    if out:
        write_atomically(out, rendered(record, report_format), redacted=redact)
        if not as_json:  # said before the report (on stderr), so the verdict stays the last line
            what = {"json": "run record", "md": "Markdown report", "html": "HTML report"}[report_format]
            click.echo(f"gpuvet: {what} written to {out}", err=True)
    if as_json:
        click.echo(record.to_json())
        if saved_as is not None:
            click.echo(f"gpuvet: saved as run {saved_as} (gpuvet show {saved_as})", err=True)
    else:
        terminal.render(record, terminal.stdout_console(), verbose=verbose, saved_as=saved_as)
    sys.exit(exit_code(record.findings))


def show_record(record: RunRecord, fmt: str, out: str | None, redact: bool, verbose: bool) -> None:
    """A record in any report format (terminal, md, html, json), printed or written to --out."""
    if fmt == "terminal" and out:
        raise UsageProblem("--out needs --format md, html or json")
    if redact:
        from ..report.redact import redact as redact_record

        record = redact_record(record)
    if fmt == "terminal":
        terminal.render(record, terminal.stdout_console(), verbose=verbose)
        return
    text = rendered(record, fmt)
    if out:
        write_atomically(out, text, redacted=redact)
        click.echo(f"{fmt} report written to {out}")
    else:
        sys.stdout.write(text)


def check_out_path(out: str | None) -> None:
    """Refuse before any work: a missing folder, or a file that is not ours (a typo must not eat
    the user's `train.py`)."""
    if not out:
        return
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise UsageProblem(f"--out {out}: the folder {folder} does not exist")
    if os.path.isdir(out):
        raise UsageProblem(f"--out {out}: is a folder; give a file name")
    if os.path.exists(out) and not _written_by_gpuvet(out):
        raise UsageProblem(f"--out {out}: the file exists and is not a gpuvet record or report; choose another name")


def _written_by_gpuvet(path: str) -> bool:
    """An empty file, or a record / Markdown / HTML report gpuvet wrote: safe to replace."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return False
    text = head.lstrip()
    return not text or (text.startswith(b"{") and SCHEMA.encode() in head) or text.startswith(b"# gpuvet") \
        or b"<title>gpuvet" in head


def write_atomically(path: str, text: str, redacted: bool = False) -> None:
    """--out: private (0600) unless redacted for sharing; see private_file."""
    try:
        write_private(path, text, redacted)
    except OSError as err:
        raise UsageProblem(f"--out {path}: cannot write it ({err.strerror or err})") from None


def _check_replay_file() -> None:
    """GPUVET_NVML_REPLAY naming a file that is no `nvidia-smi -q -x` capture: one line, exit 2."""
    from ..probe.errors import CaptureError

    try:
        from ..probe import nvml_replay  # it stands in for nvidia-ml-py using that package's own errors
    except ImportError as err:
        click.echo(f"gpuvet: GPUVET_NVML_REPLAY needs nvidia-ml-py (`pip install nvidia-ml-py`): {err}", err=True)
        sys.exit(EXIT_USAGE)
    try:
        nvml_replay.load(nvml_replay.replay_file() or "")
    except CaptureError as err:
        say(f"gpuvet: {err}")
        sys.exit(EXIT_USAGE)


def say(message: str) -> None:
    """One line on stderr. Messages quote input (a file name, a line of a capture, a JSON value):
    untrusted_text.one_line takes out what would drive the terminal and cuts what is too long."""
    click.echo(one_line(message), err=True)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


# What the reports print beyond ASCII, as ASCII: a terminal or pipe that cannot encode them
# (PYTHONIOENCODING=ascii, LANG=C on old Pythons) gets these instead of a UnicodeEncodeError.
ASCII_FOR = {"✓": "+", "✗": "x", "·": "-", "…": "...", "°": " deg", "→": "->", "←": "<-", "≥": ">=", "≤": "<=",
             "×": "x", "–": "-", "—": "-", "µ": "u", "±": "+/-", "✅": "[ok]", "⚠": "[!]", "❌": "[x]",
             "▁": "_", "▂": "_", "▃": "-", "▄": "-", "▅": "=", "▆": "=", "▇": "#", "█": "#"}


def _to_ascii(err: UnicodeError):
    if not isinstance(err, UnicodeEncodeError):
        raise err
    return "".join(ASCII_FOR.get(c, "?") for c in err.object[err.start:err.end]), err.end


def readable_anywhere() -> None:
    """Streams that cannot encode gpuvet's symbols write an ASCII stand-in for each."""
    import codecs

    codecs.register_error("gpuvet-ascii", _to_ascii)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        encoding = getattr(stream, "encoding", None) or "ascii"
        try:
            "✓·…°→".encode(encoding)
        except (UnicodeEncodeError, LookupError):
            if reconfigure is not None:
                reconfigure(errors="gpuvet-ascii")


def main(argv: list[str] | None = None) -> None:
    """Entry point: click's errors become one line on stderr and exit 2, never a traceback."""
    # A kill or a dropped SSH session ends gpuvet like Ctrl-C does, so benchmarks clean up
    # (test files, worker processes) instead of leaving them behind.
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _interrupt)
    # Ctrl-C from here on is KeyboardInterrupt, ended below in one line (a quiet handler may have
    # covered the imports before this).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    readable_anywhere()
    # A capture must arrive within 60 s of the command's start; run as a program (argv None), its
    # start is the process's, before the imports.
    start_command(process_age() if argv is None else 0.0)
    if argv is None:  # a program of its own (not a test calling main): its temp files in one folder it owns
        with contextlib.suppress(OSError):
            own_temp_dir()
    try:
        _run(argv)
    finally:
        end_command()  # called in-process (tests, a library), later reads get their own window


def _run(argv: list[str] | None) -> None:
    if os.environ.get("GPUVET_NVML_REPLAY"):
        _check_replay_file()
    try:
        cli.main(args=argv, prog_name="gpuvet", standalone_mode=False)
    except click.exceptions.Exit as exit_:
        sys.exit(exit_.exit_code)
    except RecordError as err:  # a record file of the wrong kind or type, wherever it was read
        say(f"gpuvet: {err}")
        sys.exit(EXIT_USAGE)
    except click.ClickException as err:
        where = err.ctx.command_path if isinstance(err, click.UsageError) and err.ctx else "gpuvet"
        hint = f" (see {where} --help)" if isinstance(err, click.UsageError) else ""
        say(f"gpuvet: {err.format_message()}{hint}")
        sys.exit(EXIT_USAGE if err.exit_code in (1, 2) else err.exit_code)
    except click.Abort:
        click.echo("gpuvet: aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("gpuvet: interrupted", err=True)
        sys.exit(130)
