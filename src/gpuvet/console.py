"""rich's Console, Text and escape, or, where rich cannot be imported (a broken install: it is a
declared dependency), plain stand-ins with the part of their API the reports use. The reports
then come out as plain, unwrapped text instead of a traceback; `gpuvet watch`'s live view and
`compare`'s table still need rich and say so (`HAVE_RICH`)."""

from __future__ import annotations

import re
import sys
from typing import IO, Any

try:
    from rich.console import Console
    from rich.markup import escape
    from rich.text import Text

    HAVE_RICH = True
except ImportError:  # the plain stand-ins below take their names
    HAVE_RICH = False

RICH_MISSING = "rich, which cannot be imported (a broken install: pip install 'rich>=13')"

# rich's markup tag ("[bold]", "[/]", "[cyan]"), with the backslashes that may escape it.
_TAG = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")


def _plain_escape(markup: str) -> str:
    """rich.markup.escape: a backslash before each tag-like bracket, so it prints as written."""
    escaped = _TAG.sub(lambda m: f"{m.group(1)}{m.group(1)}\\{m.group(2)}", markup)
    return escaped + "\\" if escaped.endswith("\\") and not escaped.endswith("\\\\") else escaped


def _strip_markup(markup: str) -> str:
    def tag(m: re.Match[str]) -> str:
        backslashes, text = m.groups()
        return backslashes[: len(backslashes) // 2] + (text if len(backslashes) % 2 else "")

    return _TAG.sub(tag, markup)


class _PlainText:
    """A line of text without styles (rich.text.Text's from_markup, plain, cell_len)."""

    def __init__(self, text: str = "", style: str = ""):
        self.plain = text

    @classmethod
    def from_markup(cls, markup: str, style: str = "") -> _PlainText:
        return cls(_strip_markup(markup))

    @property
    def cell_len(self) -> int:
        return len(self.plain)

    def __str__(self) -> str:
        return self.plain


class _PlainConsole:
    """Writes whole lines, markup removed; never a terminal, so nothing is wrapped or styled."""

    is_terminal = False

    def __init__(self, *, stderr: bool = False, file: IO[str] | None = None, width: int | None = None,
                 **_options: Any):
        self._file = file
        self._stderr = stderr
        self.width = width or 100_000

    @property
    def file(self) -> IO[str]:
        return self._file or (sys.stderr if self._stderr else sys.stdout)

    def print(self, *objects: Any, end: str = "\n", markup: bool = True, **_options: Any) -> None:
        texts = [o.plain if isinstance(o, _PlainText) else _strip_markup(str(o)) if markup else str(o)
                 for o in objects]
        self.file.write(" ".join(texts) + end)


if not HAVE_RICH:
    Console = _PlainConsole  # type: ignore[assignment,misc]
    Text = _PlainText  # type: ignore[assignment,misc]
    escape = _plain_escape  # type: ignore[assignment]

__all__ = ["HAVE_RICH", "RICH_MISSING", "Console", "Text", "escape"]
