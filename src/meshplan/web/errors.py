"""Bad input over HTTP: status 422 and one line naming the field and the rule, as the CLI's
``error: <field>: <rule>`` (the same :class:`~meshplan.errors.InputError` underneath)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from meshplan.errors import InputError
from meshplan.specs.base import input_error_from


def error_body(err: InputError) -> dict[str, str]:
    """``{"field", "rule", "detail"}``; ``detail`` is the CLI's line without ``error: ``."""
    rule = " ".join(str(err.rule).replace("Value error, ", "").split())
    return {"field": err.field, "rule": rule, "detail": f"{err.field}: {rule}"}


def unprocessable(err: InputError) -> JSONResponse:
    return JSONResponse(error_body(err), status_code=422)


def from_request_error(exc: RequestValidationError) -> InputError:
    """FastAPI's parameter errors (``loc`` = ("query", "tp")) as meshplan's field and rule."""
    err = input_error_from(exc)  # type: ignore[arg-type]  # same errors() shape as pydantic's
    field = err.field
    for prefix in ("query.", "body.", "path."):
        if field.startswith(prefix):
            field = field[len(prefix):]
    if field in ("query", "body"):
        field = "input"
    return InputError(field, err.rule)


def known_query(request: Request) -> None:
    """Reject a query parameter the endpoint does not declare (``?p=0`` for ``pp``), as the CLI rejects
    an unknown option, instead of answering for the defaults: InputError naming it, with the names
    the endpoint takes. For a router's ``dependencies``."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    names, todo = [], [dependant]
    while todo:  # the endpoint's own parameters and those of its dependencies
        d = todo.pop()
        names += [p.alias for p in d.query_params]
        todo += d.dependencies
    unknown = sorted(set(request.query_params) - set(names))
    if unknown:
        raise InputError(unknown[0], f"unknown parameter (this endpoint takes: {', '.join(names) or 'none'})")


def install(app: FastAPI) -> None:
    """Map every kind of bad input to 422 with one line."""

    @app.exception_handler(InputError)
    async def _input(_: Request, exc: InputError) -> JSONResponse:
        return unprocessable(exc)

    @app.exception_handler(ValidationError)
    async def _pydantic(_: Request, exc: ValidationError) -> JSONResponse:
        return unprocessable(input_error_from(exc))

    @app.exception_handler(RequestValidationError)
    async def _request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return unprocessable(from_request_error(exc))
