"""A video's state folded from its job's events: progress that never goes back through a rerun, and the end."""
from __future__ import annotations

from api.openai.videos.store import Fold, VideoRecord
from common.jobs import VideoParams

PARAMS = VideoParams(width=64, height=64, num_frames=9, frame_rate=8, num_inference_steps=4, rng_seed=1, ttl_s=60)


def record() -> VideoRecord:
    return VideoRecord("video_j", "j", "tiny-ltx", "a cat", 1, PARAMS, 1000, "tenant")


def progress(seq: int, step: int, total: int = 4) -> dict:
    return {"type": "progress", "job": "j", "seq": seq, "step": step, "total": total}


def test_queued_then_in_progress_with_the_steps_done() -> None:
    fold = Fold(record(), ttl_s=60)
    assert (fold.video.status, fold.video.progress, fold.video.expires_at) == ("queued", 0, 1060)
    fold.feed([{"type": "accepted", "job": "j", "seq": 1}, progress(2, 1), progress(3, 2)], now=1001)
    assert (fold.video.status, fold.video.progress) == ("in_progress", 50)


def test_a_rerun_holds_progress_until_it_passes_it() -> None:
    fold = Fold(record(), ttl_s=60)
    fold.feed([{"type": "accepted", "job": "j", "seq": 1}, progress(2, 1), progress(3, 3)], now=1001)
    seen = [fold.video.progress]
    for seq, step in ((5, 1), (6, 2), (7, 3), (8, 4)):  # another worker, from its start (seq 4: its `accepted`)
        fold.feed([progress(seq, step)], now=1002)
        seen.append(fold.video.progress)
    assert seen == [75, 75, 75, 75, 99]  # 99 until the video is stored: 100 means its content can be fetched


def test_done_completes_with_its_content_and_an_error_fails_with_a_code() -> None:
    done = Fold(record(), ttl_s=60)
    done.feed([{"type": "done", "job": "j", "seq": 2, "video": "k:v", "thumbnail": "k:t"}], now=1005)
    assert (done.video.status, done.video.progress, done.video.completed_at) == ("completed", 100, 1005)
    assert done.content == {"video": "k:v", "thumbnail": "k:t"}
    again = Fold(record(), ttl_s=60)
    again._ended({k: str(v).encode() for k, v in done.ended_fields().items()})
    assert again.video == done.video and again.content == done.content
    failed = Fold(record(), ttl_s=60)
    failed.feed([{"type": "error", "job": "j", "seq": 2, "status": 400, "error": {"message": "too big"}}], now=1005)
    assert failed.video.status == "failed" and failed.video.error is not None
    assert (failed.video.error.message, failed.video.error.code) == ("too big", "video_generation_failed")
