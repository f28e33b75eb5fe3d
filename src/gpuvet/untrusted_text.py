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
# U+2028/U+2029 (line and paragraph separators) go too: str.splitlines() ends a line there while
# a regular expression's "." and "$" do not, so a parser that finds a match, then the line holding
# it, found none (a StopIteration); on a terminal they are invisible.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_BARE_CR = re.compile("\r(?!\n)")


def clean(text: str) -> str:
    """`text` without escape sequences, control characters (but tab and newline) or bidi
    controls; a lone surrogate becomes U+FFFD. A carriage return goes too: a bare CR in a value
    would overwrite on the terminal what was printed before it."""
    return clean_document(text).replace("\r", "")


# _CONTROL as a str.translate table: 3 times faster than its substitution on a 14 MB capture.
_DELETE = dict.fromkeys([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), *range(0x7F, 0xA0), 0x2028, 0x2029,
                         *range(0x202A, 0x202F), *range(0x2066, 0x206A)])


def clean_document(text: str) -> str:
    """clean(), keeping the CR of CRLF line ends (a Windows capture; its parsers split on them).
    Each pass runs only where its characters occur (a 14 MB capture took 1.4 s, 0.2 s now)."""
    if text.isprintable():
        return text
    if "\x1b" in text or "\x9b" in text:
        text = _ESCAPE_SEQUENCE.sub("", text)
    if "\r" in text:
        text = _BARE_CR.sub("", text)
    text = text.translate(_DELETE)
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


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


# How much of someone else's text one of gpuvet's one-line messages quotes: enough to recognise
# the line, never the 200,000-character JSON value a damaged file may hold.
QUOTE_CHARACTERS = 120
# A one-line message (gpuvet: ...) longer than this is cut in the middle: it quotes pieces of input.
LINE_CHARACTERS = 1000


def quote(text: str, limit: int = QUOTE_CHARACTERS, quotes: bool = True) -> str:
    """A piece of input to put in a message: cleaned, on one line, cut to `limit` characters
    (saying how many more there were), in quotes as repr() writes them (or bare)."""
    piece = " ".join(clean(text[: limit * 4 + 64]).split())
    more = len(text) - limit * 4 - 64 if len(text) > limit * 4 + 64 else 0
    if len(piece) > limit:
        more += len(piece) - limit
        piece = piece[:limit]
    shown = repr(piece) if quotes else piece
    return f"{shown}... ({more} more characters)" if more else shown


def one_line(message: str, limit: int = LINE_CHARACTERS) -> str:
    """A message for the terminal built from pieces of input (a file name, a line of a capture):
    cleaned, on one line, at most about `limit` characters (the middle cut out)."""
    flat = " ".join(clean(message).split()) if not message.isprintable() or len(message) > limit else message
    if len(flat) <= limit:
        return flat
    head, tail = flat[: limit * 2 // 3], flat[-(limit // 3):]
    return f"{head} [... {len(flat) - len(head) - len(tail)} characters cut ...] {tail}"
