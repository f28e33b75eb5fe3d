"""The command line run in the test's own process, as a user would type it; and Ctrl-C made to
work in the tests however the suite was started."""

from __future__ import annotations

import signal

from gpuvet.cli import main


def restore_ctrl_c() -> None:
    """Python keeps SIGINT ignored when it starts with it ignored, as a shell's background job does
    (`nohup ./scripts/test &`): the tests' own Ctrl-C (os.kill of SIGINT) then never arrives, and
    every child inherits the ignoring. Python's handler here gives each child the default again
    (exec resets a handled signal, not an ignored one)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


restore_ctrl_c()  # at collection: before any test sends a Ctrl-C or starts a child that receives one


def gpuvet(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `gpuvet ARGV...`."""
    code = 0
    try:
        main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err
