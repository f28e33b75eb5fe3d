"""Errors a probe raises for input it cannot use (a capture of the wrong kind, an error message)."""


class CaptureError(ValueError):
    """The input is not a capture we can read; the message says what was found and what was expected."""
