"""The wire objects built from what the stores keep are OpenAI's, as its SDK reads them."""
from __future__ import annotations

import openai.types
import orjson

from api.batch.protocol import Batch, FileObject
from common.batch.files import StoredFile
from common.batch.models import LineError
from common.batch.store import BatchState


def test_a_stored_file_is_served_without_its_own_fields() -> None:
    stored = StoredFile(id="file-1", bytes=3, created_at=10, expires_at=20, filename="in.jsonl", purpose="batch",
                        backend="directory", created=10.5)
    wire = FileObject.of(stored).model_dump()
    assert "backend" not in wire and "created" not in wire
    assert openai.types.FileObject.model_validate(wire).model_dump() == {**wire, "status_details": None}


def test_a_batch_state_is_served_as_openai_s_batch() -> None:
    state = BatchState(id="batch_1", endpoint="/v1/chat/completions", input_file_id="file-1", completion_window="24h",
                       status="completed", created_at=10, expires_at=20, completed_at=15, metadata={"k": "v"},
                       errors=[LineError(code="invalid_json", message="bad", line=2)], total=3, completed=2, failed=1,
                       input_tokens=30, output_tokens=12, in_flight=0, rq_job="rq-1", output_ttl_s=3600)
    assert BatchState.from_hash({k.encode(): str(v).encode() for k, v in state.to_hash().items()}) == state
    wire = orjson.loads(Batch.of(state).model_dump_json())
    assert not {"total", "in_flight", "rq_job", "output_ttl_s", "input_tokens"} & wire.keys()
    batch = openai.types.Batch.model_validate(wire)
    assert (batch.status, batch.completed_at, batch.metadata) == ("completed", 15, {"k": "v"})
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (3, 2, 1)
    assert (batch.usage.input_tokens, batch.usage.output_tokens, batch.usage.total_tokens) == (30, 12, 42)
    assert batch.errors.data[0].line == 2
