"""gpuvet's command line: thin commands over runner (probe -> bench -> judge), the store and the
reports. Exit codes: 0 nothing failed, 1 a check failed, 2 bad usage or unreadable input."""

import signal as _signal
import sys as _sys


def _interrupted_while_starting(signum: int, frame: object) -> None:
    _sys.stderr.write("gpuvet: interrupted\n")
    raise SystemExit(130)


# Ctrl-C while the commands' modules load (half a second or more on a loaded machine) ends gpuvet in
# one line instead of a KeyboardInterrupt traceback from inside an import; main() puts Ctrl-C back
# to a KeyboardInterrupt once the imports are done. A SIGINT ignored by whoever started gpuvet stays so.
if _signal.getsignal(_signal.SIGINT) is not _signal.SIG_IGN:
    _signal.signal(_signal.SIGINT, _interrupted_while_starting)

from . import fleet, history, monitor, network, reports, vet  # noqa: E402,F401  (registers the commands)
from .base import cli, main  # noqa: E402
from .cluster import command as _cluster_command  # noqa: E402

cli.add_command(_cluster_command, name="cluster")

__all__ = ["cli", "main"]
