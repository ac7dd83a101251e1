"""One error type for bad input: it names the field and the rule that was broken.

The CLI prints ``str(error)`` on one line and exits with status 2; the library raises it from
every validation point, so callers never see a traceback for a mistake in what they wrote.
:class:`RunFailed` is the other kind: the input was fine but a real run meshplan started (verify's
workers) failed; the CLI prints what failed, the failing worker's own traceback after it, and
exits with status 1.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input: ``field`` names what the user wrote, ``rule`` says what it must satisfy."""

    def __init__(self, field: str, rule: str):
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}")


class InputErrors(InputError):
    """Several bad fields at once (a GPU file with three wrong keys): ``errors`` holds one
    :class:`InputError` each. ``str()`` stays one line (``; `` between them) for callers that print
    one; the CLI prints one ``error:`` line per field. ``field`` and ``rule`` are the first's."""

    def __init__(self, errors: list[InputError]):
        self.errors = list(errors)
        first = self.errors[0]
        super().__init__(first.field, first.rule)
        self.args = ("; ".join(str(e) for e in self.errors),)

    def __str__(self) -> str:
        return self.args[0]


class RunFailed(RuntimeError):
    """A real run that meshplan started did not finish: a worker's error (its traceback follows the
    first line), lost workers, or a timeout. The first line of ``str()`` says which."""
