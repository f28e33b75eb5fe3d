"""Writing a record or a report gpuvet makes: whole or not at all, and private.

Records and reports hold hostnames, GPU serials and IP addresses, so a new one is created 0600
(an existing one keeps the mode its owner gave it); a `--redact`ed one is meant to be shared and
gets the mode a plain open() would give it (0666 less the umask). The
text goes through a temporary file in the same folder, removed if anything fails (a full disk,
Ctrl-C), so neither a half-written file nor a stray temporary one is left. A kill -9 mid-write
leaves the temporary file (named after the process and host, as bench.leftovers names scratch):
the next write to that folder removes it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

from .bench.leftovers import owned_prefix, sweep_stale

TEMP_PREFIX = ".gpuvet-out-"


def write_private(path: str, text: str, redacted: bool = False) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    sweep_stale(TEMP_PREFIX, folder)
    fd, tmp = tempfile.mkstemp(prefix=owned_prefix(TEMP_PREFIX), dir=folder)  # mkstemp: 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if redacted:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, os.stat(path).st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
