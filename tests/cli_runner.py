"""The command line run in the test's own process, as a user would type it."""

from __future__ import annotations

from gpuvet.cli import main


def gpuvet(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `gpuvet ARGV...`."""
    code = 0
    try:
        main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err
