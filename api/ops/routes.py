"""Routes of the ops page. Everything shown is read from Redis on each request (never this process's memory), so
any API process answers the same; the buttons act on Redis through `common.ops.control`, as `ovq` does.

The page is rendered on the server; `static/ops.js` re-fetches the panel fragment every few seconds and sends
the buttons' POSTs without leaving the page (without JavaScript the forms still work, and a `<noscript>` meta
refresh keeps the page fresh).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.templating import Jinja2Templates

from api.ops import view
from common.errors import OvqError
from common.ops import cluster, control, owned
from common.webhooks import log as webhook_log

HERE = Path(__file__).parent
STATIC = {p.name: p for p in (HERE / "static").iterdir() if p.is_file()}
REFRESH_MS = 2000
# Nothing from elsewhere, no inline script or style: what the page runs is what ships in static/.
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
          "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")

templates = Jinja2Templates(directory=HERE / "templates")
templates.env.filters.update(view.FILTERS)
templates.env.globals["chart"] = view.chart
templates.env.globals["windows"] = view.WINDOWS

router = APIRouter(prefix="/ops", include_in_schema=False)


def _redis(request: Request) -> tuple[Any, Any, Any]:
    registry = request.app.state.registry  # the API's own Redis client, keys and settings
    return registry.redis, registry.keys, registry.settings


def _base(request: Request) -> str:
    return request.scope.get("root_path", "") + router.prefix


async def _context(request: Request) -> dict[str, Any]:
    redis, keys, settings = _redis(request)
    overview = await cluster.overview(redis, keys, settings)
    return {"o": overview, "backgrounds": await control.background_responses(redis, keys),
            "batches": await owned.batches(redis, keys, settings, limit=20),
            "files": await owned.files(redis, keys, settings, limit=20),
            "webhooks": await webhook_log.summary(redis, keys, limit=20),
            "base": _base(request), "refresh_ms": REFRESH_MS,
            "card_minutes": round(settings.model_card_ttl_s / 60)}


@router.get("")
async def page(request: Request) -> Response:
    return templates.TemplateResponse(request, "ops.html", await _context(request),
                                      headers={"Content-Security-Policy": POLICY, "Cache-Control": "no-store"})


@router.get("/panel")
async def panel(request: Request) -> Response:
    return templates.TemplateResponse(request, "panel.html", await _context(request),
                                      headers={"Cache-Control": "no-store"})


@router.get("/data")
async def data(request: Request) -> JSONResponse:
    redis, keys, settings = _redis(request)
    overview = await cluster.overview(redis, keys, settings)
    return JSONResponse(overview.model_dump(mode="json"), headers={"Cache-Control": "no-store"})


@router.get("/static/{name}")
async def static(name: str) -> FileResponse:
    if name not in STATIC:
        raise OvqError(f"no static file {name!r}", 404, "not_found_error")
    return FileResponse(STATIC[name], headers={"Cache-Control": "max-age=300"})


def _done(request: Request, message: str) -> Response:
    """The script asks for JSON; a plain form post goes back to the page."""
    if "application/json" in request.headers.get("accept", ""):
        return JSONResponse({"ok": True, "message": message})
    return RedirectResponse(_base(request), status_code=303)


async def _act(request: Request, action: Any) -> str:
    try:
        return await action
    except control.NotFound as exc:
        raise OvqError(str(exc), 404, "not_found_error") from None
    except control.Refused as exc:
        raise OvqError(str(exc), 409, "invalid_request_error") from None


@router.post("/workers/{worker_id}/drain")
async def drain(request: Request, worker_id: str) -> Response:
    redis, keys, _ = _redis(request)

    async def act() -> str:
        await control.drain(redis, keys, worker_id)
        return f"worker {worker_id} drains: no new jobs, running ones finish, then it exits"

    return _done(request, await _act(request, act()))


@router.post("/workers/{worker_id}/{command}")
async def steer(request: Request, worker_id: str, command: str) -> Response:
    """`sleep` or `wake` (common/ops/control.py `steer`)."""
    redis, keys, _ = _redis(request)

    async def act() -> str:
        if command not in control.COMMANDS:
            raise control.NotFound(f"no worker action {command!r}")
        await control.steer(redis, keys, worker_id, command)
        return f"worker {worker_id}: {command} requested (at its next heartbeat)"

    return _done(request, await _act(request, act()))


@router.post("/dead/{entry_id}/retry")
async def retry(request: Request, entry_id: str) -> Response:
    redis, keys, settings = _redis(request)

    async def act() -> str:
        job = await control.retry(redis, keys, settings, entry_id)
        return f"job {job.id} queued again on {job.model} {job.device}"

    return _done(request, await _act(request, act()))


@router.post("/dead/purge")
async def purge(request: Request) -> Response:
    redis, keys, _ = _redis(request)
    count = await control.purge(redis, keys)
    return _done(request, f"purged {count} dead letters")


@router.post("/responses/{response_id}/cancel")
async def cancel_background(request: Request, response_id: str) -> Response:
    redis, keys, settings = _redis(request)

    async def act() -> str:
        job = await control.cancel_background(redis, keys, settings, response_id)
        return f"background response {response_id} cancelled (job {job})"

    return _done(request, await _act(request, act()))
