"""Bad input over HTTP: status 422 and one line naming the field and the rule, as the CLI's
``error: <field>: <rule>`` (the same :class:`~meshplan.errors.InputError` underneath)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError

from meshplan.errors import InputError
from meshplan.specs.base import input_error_from
from meshplan.web.heavy import Unavailable


class ErrorBody(BaseModel):
    """The body of every refusal (422 bad input, 404, 429 and 503 alike)."""

    field: str = Field(description="The input that breaks a rule (a query parameter, a body field, or server).")
    rule: str = Field(description="The rule it breaks, on one line.")
    detail: str = Field(description="field: rule, as the CLI prints it after 'error: '.")


#: Paths whose requests run in a heavy slot (meshplan.web.heavy), hence may be answered 503.
HEAVY_PATHS = ("/api/calc/{name}", "/api/explain", "/api/view/plan", "/api/pipeline", "/api/view/pipeline")


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


def document_errors(app: FastAPI) -> None:
    """Make the OpenAPI document say what refusals look like: every operation that takes input
    answers 422 with :class:`ErrorBody` (FastAPI's own validation schema is never sent), and the
    404, 429 and 503 answers carry the same body."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas["ErrorBody"] = ErrorBody.model_json_schema()
        body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
        for path, ops in schema.get("paths", {}).items():
            for op in ops.values():
                answers = op.setdefault("responses", {})
                if op.get("parameters") or op.get("requestBody") or "422" in answers:
                    answers["422"] = {"description": "Bad input: the field and the rule it breaks, on one line", "content": body}
                if path == "/api/search/{job_id}":
                    answers["404"] = {"description": "No such search (finished searches are kept for a while)"}
                if path in HEAVY_PATHS:
                    answers["503"] = {"description": "Every slot for heavy requests stayed busy, or the work passed its time limit "
                                                     "or lost its worker process: try again shortly"}
                for code in ("404", "429", "503"):
                    if code in answers:
                        answers[code]["content"] = body
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def install(app: FastAPI) -> None:
    """Map every kind of bad input to 422 with one line (and a heavy request the server could not
    finish to 503 with the same body); document those bodies in the OpenAPI schema."""
    document_errors(app)

    @app.exception_handler(InputError)
    async def _input(_: Request, exc: InputError) -> JSONResponse:
        return unprocessable(exc)

    @app.exception_handler(ValidationError)
    async def _pydantic(_: Request, exc: ValidationError) -> JSONResponse:
        return unprocessable(input_error_from(exc))

    @app.exception_handler(Unavailable)
    async def _unavailable(_: Request, exc: Unavailable) -> JSONResponse:
        return JSONResponse(error_body(exc.err), status_code=503)

    @app.exception_handler(RequestValidationError)
    async def _request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return unprocessable(from_request_error(exc))
