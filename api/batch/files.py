"""/v1/files (and /v3/files): upload, list, retrieve, download and delete files for the Batch API."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

from fastapi import APIRouter, Query, Request
from starlette.datastructures import UploadFile
from starlette.responses import StreamingResponse

from api.batch.protocol import FileDeleted, FileList, FileObject
from api.http.auth import caller_of
from common.batch.files import CHUNK, FileStore, StoredFile
from common.errors import OvqError

router = APIRouter()
PURPOSES = ("batch",)
# Multipart framing around the file: a request larger than the file limit by more than this is refused unread.
FRAMING = 64 * 1024


def file_store(request: Request) -> FileStore:
    registry = request.app.state.registry
    return FileStore(registry.redis, registry.keys, registry.settings)


def no_such_file(file_id: str) -> OvqError:
    return OvqError(f"No such File object: {file_id}", 404, "invalid_request_error", param="file_id")


async def _chunks(upload: UploadFile) -> AsyncIterator[bytes]:
    while chunk := await upload.read(CHUNK):
        yield chunk


def _ttl(form: dict[str, object]) -> int | None:
    """OpenAI's `expires_after` (anchor `created_at`, 1 hour to 30 days), sent as form fields."""
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise OvqError("expires_after.anchor must be 'created_at'", param="expires_after.anchor")
    try:
        ttl = int(str(seconds))
    except ValueError:
        ttl = 0
    if not 3600 <= ttl <= 2_592_000:
        raise OvqError("expires_after.seconds must be between 3600 and 2592000", param="expires_after.seconds")
    return ttl


@router.post("/files")
async def create_file(request: Request) -> FileObject:
    store = file_store(request)
    limit = store.settings.files_max_bytes
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit + FRAMING:
        raise OvqError(f"The file is larger than the {limit} bytes a file may have", 413, param="file",
                       code="file_too_large")
    form = await request.form(max_files=1, max_fields=16)
    try:
        upload, purpose = form.get("file"), form.get("purpose")
        if not isinstance(upload, UploadFile):
            raise OvqError("Send the file as multipart/form-data field `file`", param="file")
        if purpose not in PURPOSES:
            raise OvqError(f"purpose must be one of {', '.join(PURPOSES)} (ovq keeps files for the Batch API)",
                           param="purpose")
        ttl = _ttl(dict(form))
        stored = await store.create(upload.filename or "upload.jsonl", str(purpose), _chunks(upload),
                                    caller_of(request).tenant, ttl_s=ttl)
    finally:
        await form.close()
    return FileObject.of(stored)


@router.get("/files")
async def list_files(request: Request, purpose: str | None = None, limit: int = Query(10_000, ge=1, le=10_000),
                     order: Literal["asc", "desc"] = "desc", after: str | None = None) -> FileList:
    files = await file_store(request).list(caller_of(request), purpose)
    if order == "desc":
        files.reverse()
    if after is not None:
        ids = [f.id for f in files]
        files = files[ids.index(after) + 1:] if after in ids else []
    page = [FileObject.of(f) for f in files[:limit]]
    return FileList(data=page, first_id=page[0].id if page else None, last_id=page[-1].id if page else None,
                    has_more=len(files) > limit)


async def _existing(request: Request, file_id: str) -> tuple[FileStore, StoredFile]:
    store = file_store(request)
    stored = await store.get(file_id, caller_of(request))
    if stored is None:
        raise no_such_file(file_id)
    return store, stored


@router.get("/files/{file_id}")
async def retrieve_file(request: Request, file_id: str) -> FileObject:
    _, stored = await _existing(request, file_id)
    return FileObject.of(stored)


@router.delete("/files/{file_id}")
async def delete_file(request: Request, file_id: str) -> FileDeleted:
    if not await file_store(request).delete(file_id, caller_of(request)):
        raise no_such_file(file_id)
    return FileDeleted(id=file_id)


@router.get("/files/{file_id}/content")
async def file_content(request: Request, file_id: str) -> StreamingResponse:
    store, stored = await _existing(request, file_id)
    name = "".join(c for c in stored.filename if c.isascii() and c.isprintable() and c not in '"\\') or "file"
    return StreamingResponse(store.read(stored), media_type="application/octet-stream",
                             headers={"Content-Disposition": f'attachment; filename="{name}"'})
