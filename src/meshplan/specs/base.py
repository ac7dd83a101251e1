"""Shared base for specs: frozen pydantic models whose validation errors become one-line
:class:`~meshplan.errors.InputError` messages naming the field and the rule."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from meshplan.errors import InputError


class Spec(BaseModel):
    """Immutable, validated once; unknown fields are refused (they are usually typos)."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    @classmethod
    def build(cls, where: str = "", **fields: Any):
        """Construct and turn the first pydantic error into an :class:`InputError`."""
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise input_error_from(exc, where) from None


def input_error_from(exc: ValidationError, where: str = "") -> InputError:
    """The first error of a pydantic ``ValidationError`` as an ``InputError`` (field, rule)."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__")
    field = ".".join(x for x in (where, loc) if x) or "input"
    msg = err.get("msg", "invalid value")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if err.get("type") == "extra_forbidden":
        msg = "unknown field"
    if err.get("type") == "missing":
        msg = "is required"
    return InputError(field, msg)
