"""benchmarks/bare_server.py: the HTTP server's floor streams what an ovq stream shows its client, so that
`scale.py --floor` compares like with like."""
from __future__ import annotations

from benchmarks import bare_server

BODY = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Tell me about the number 7"}],
        "stream": True, "stream_options": {"include_usage": True}}


def test_the_bare_server_streams_each_requests_frames_as_ovq_does() -> None:
    """The role chunk, then one content event per frame, the usage chunk's tokens, `[DONE]`: the load client reads
    every stream to its end and counts them as it counts ovq's."""
    measured = bare_server.measure([BODY], streams=4, rate=200.0, frames=3, duration=1.0)
    assert measured["failed"] == 0
    assert measured["events_per_request"] == 3 and measured["tokens_per_request"] == 3
    assert measured["us_per_request"] > 0
