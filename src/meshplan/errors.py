"""One error type for bad input: it names the field and the rule that was broken.

The CLI prints ``str(error)`` on one line and exits with status 2; the library raises it from
every validation point, so callers never see a traceback for a mistake in what they wrote.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input: ``field`` names what the user wrote, ``rule`` says what it must satisfy."""

    def __init__(self, field: str, rule: str):
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}")
