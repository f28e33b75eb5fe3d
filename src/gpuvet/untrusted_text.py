"""Text gpuvet did not write, made safe to show before any renderer sees it.

A GPU name, hostname or label in a capture, a record or the history store may hold terminal
escape sequences (clear the screen, retitle the terminal, fake a verdict line), other control
characters, Unicode bidi overrides that reorder what is shown, or lone surrogates a terminal
cannot encode. They are removed where such text enters gpuvet: capture parsing, record loading,
store reads. Tabs and newlines stay (captures are line-based); Markdown and HTML escape the rest.
"""

from __future__ import annotations

import re
from typing import Any

# Whole escape sequences first (CSI "ESC [ ... m", OSC/DCS "ESC ] ... BEL", "ESC c" reset), so no
# "[2J" is left behind; then any other C0/C1 control but tab and newline, DEL, bidi embeddings,
# overrides and isolates (U+202A..202E, U+2066..2069).
_ESCAPE_SEQUENCE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?|[ -/]*[0-~])"
                              r"|\x9b[0-?]*[ -/]*[@-~]")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_BARE_CR = re.compile("\r(?!\n)")


def clean(text: str) -> str:
    """`text` without escape sequences, control characters (but tab and newline) or bidi
    controls; a lone surrogate becomes U+FFFD. A carriage return goes too: a bare CR in a value
    would overwrite on the terminal what was printed before it."""
    return clean_document(text).replace("\r", "")


def clean_document(text: str) -> str:
    """clean(), keeping the CR of CRLF line ends (a Windows capture; its parsers split on them)."""
    if text.isprintable():
        return text
    return _SURROGATE.sub("\ufffd", _CONTROL.sub("", _BARE_CR.sub("", _ESCAPE_SEQUENCE.sub("", text))))


def clean_strings(data: Any) -> Any:
    """JSON-shaped `data` (a loaded record, a store row) with every string in it, keys too,
    passed through clean(). Iterative, so a deeply nested file cannot exhaust the stack here."""
    if isinstance(data, str):
        return clean(data)
    root = [data]
    stack: list[Any] = [root]
    while stack:
        container = stack.pop()
        if isinstance(container, dict):
            for key in list(container):
                value = container[key]
                if isinstance(key, str) and clean(key) != key:
                    del container[key]
                    key = clean(key)
                container[key] = clean(value) if isinstance(value, str) else value
                if isinstance(value, (dict, list)):
                    stack.append(value)
        elif isinstance(container, list):
            for i, value in enumerate(container):
                if isinstance(value, str):
                    container[i] = clean(value)
                elif isinstance(value, (dict, list)):
                    stack.append(value)
    return root[0]
