"""``/openapi.json`` and ``/docs``, behind the same key as the API when keys are configured.

Request bodies are read by dependencies (see :mod:`.bodies`), so FastAPI does not see them:
their models are described here, through ``openapi_extra`` and the document's components.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse

from .access import api_key

_REF = "#/components/schemas/{model}"


def json_body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for an endpoint that takes ``model`` as its JSON body."""
    schema = {"$ref": _REF.format(model=model.__name__)}
    return {"requestBody": {"required": False, "content": {"application/json": {"schema": schema}}}}


def with_body_models(app: FastAPI, models: Sequence[type[BaseModel]]) -> Callable[[], dict[str, Any]]:
    """``app.openapi`` with ``models`` (and the models they nest) added to the components."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            components = document.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                schema = model.model_json_schema(ref_template=_REF)
                components.update(schema.pop("$defs", {}))
                components[model.__name__] = schema
            document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        return app.openapi_schema or {}

    return openapi


router = APIRouter(dependencies=[Depends(api_key)], include_in_schema=False)


@router.get("/openapi.json")
async def openapi_document(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    # the page's own requests carry no key: with keys on it works behind a proxy that adds one
    root = request.scope.get("root_path", "").rstrip("/")
    return get_swagger_ui_html(openapi_url=f"{root}/openapi.json", title=f"{request.app.title} API")
