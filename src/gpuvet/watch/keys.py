"""Key presses from the terminal for the live view (q quits), and a stand-in stream for no terminal."""

from __future__ import annotations

import os
import select
import sys
import time
from typing import Any


class Keys:
    """Single key presses from the terminal (cbreak: no Enter needed; Ctrl-C still interrupts).
    Off a terminal it only waits. The terminal's settings are restored on exit, whatever happens."""

    def __init__(self, stream: Any = None):
        self.stream = stream if stream is not None else sys.stdin
        self.fd: int | None = None
        self._saved: Any = None

    def __enter__(self) -> "Keys":
        try:
            if self.stream is not None and self.stream.isatty():
                import termios
                import tty

                self.fd = self.stream.fileno()
                self._saved = termios.tcgetattr(self.fd)
                tty.setcbreak(self.fd)
        except (OSError, ValueError, ImportError):
            self.fd = None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None and self._saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def wait(self, timeout_s: float) -> str:
        """Keys pressed within `timeout_s` ("" when none)."""
        if self.fd is None:
            time.sleep(max(0.0, timeout_s))
            return ""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout_s))
        return os.read(self.fd, 64).decode(errors="ignore") if ready else ""


class NoStream:
    def isatty(self) -> bool:
        return False
