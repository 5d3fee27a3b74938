"""What `/responses/compact` keeps as it was: the user messages, as output items with ids and parts."""
from __future__ import annotations

from api.openai.responses.compact import _is_user, _user


def test_user_messages_are_kept_as_output_items_and_the_rest_is_not() -> None:
    kept = _user({"type": "message", "role": "user", "id": "msg_1", "content": "Hi"})
    assert kept == {"type": "message", "role": "user", "id": "msg_1", "status": "completed",
                    "content": [{"type": "input_text", "text": "Hi"}]}
    parts = [{"type": "input_text", "text": "a"}]
    assert _user({"role": "user", "content": parts})["content"] == parts
    assert _user({"role": "user", "content": "x"})["id"].startswith("msg_")
    assert not _is_user({"type": "message", "role": "assistant", "content": "x"})
    assert not _is_user({"type": "function_call_output", "call_id": "c", "output": "x"})
