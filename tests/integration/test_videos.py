"""The Videos API through the queue, with the official openai SDK, on a tiny random-weight LTX-Video."""
from __future__ import annotations

import io
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import av
import httpx
import openai
import orjson
import pytest
from openai import OpenAI
from PIL import Image

from tests.conftest import MODELS, Tiers

# The SDK marks its videos methods deprecated (OpenAI is retiring Sora); the API shape is what ovq serves.
pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")
VIDEO = "tiny-ltx"
# Small and quick: 1 s at 8 fps is 9 frames (LTX-Video makes 8k+1), 96x64 pixels.
QUICK = {"frame_rate": 8, "num_inference_steps": 2}
# Long enough to catch it running (a step takes tens of ms on an idle machine here).
SLOW = {"frame_rate": 8, "num_inference_steps": 100}
SLOW_SIZE = "64x64"


@pytest.fixture(scope="module")
def tiers(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiers]:
    video = {"path": str(MODELS / "tiny-ltx"), "max_resolution": "512x512", "default_num_inference_steps": 2,
             "max_num_inference_steps": 100}
    made = Tiers(redis_url, tmp_path_factory.mktemp("videos"), {VIDEO: video})
    made.worker(VIDEO, name="video-1")
    made.api()
    made.wait_served(VIDEO)
    yield made
    made.stop()


@pytest.fixture(scope="module")
def client(tiers: Tiers) -> OpenAI:
    return OpenAI(base_url=tiers.base_url, api_key="unused", max_retries=0, timeout=60)


def decoded(mp4: bytes) -> tuple[int, int, int, float]:
    """Frames, width, height and duration (s) of an MP4, decoded back."""
    with av.open(io.BytesIO(mp4)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        frames = sum(1 for _ in container.decode(video=0))
        return frames, stream.width, stream.height, float(stream.frames / stream.average_rate)


def test_create_and_poll_then_download_decodes_back(client: OpenAI, tmp_path: Path) -> None:
    video = client.videos.create_and_poll(model=VIDEO, prompt="a red cat", seconds="1", size="96x64",  # type: ignore[arg-type]
                                          extra_body=QUICK, poll_interval_ms=100)
    assert (video.status, video.progress, video.size, video.seconds) == ("completed", 100, "96x64", "1")
    assert video.completed_at and video.expires_at and video.expires_at > video.created_at
    content = client.videos.download_content(video.id)
    frames, width, height, duration = decoded(content.read())
    assert (frames, width, height) == (9, 96, 64)
    assert duration == pytest.approx(9 / 8)
    thumbnail = Image.open(io.BytesIO(client.videos.download_content(video.id, variant="thumbnail").read()))
    assert (thumbnail.format, thumbnail.size) == ("WEBP", (96, 64))


def test_same_seed_same_video_and_remix_keeps_the_seed(client: OpenAI) -> None:
    def make(seed: int) -> bytes:
        video = client.videos.create_and_poll(model=VIDEO, prompt="a cat", seconds="1", size="64x64",  # type: ignore[arg-type]
                                              extra_body={**QUICK, "seed": seed}, poll_interval_ms=100)
        return client.videos.download_content(video.id).read()

    first = make(7)
    assert make(7) == first
    assert make(8) != first
    source = client.videos.list(limit=1).data[0]  # the seed-8 one
    remix = client.videos.remix(source.id, prompt="a cat")
    assert remix.remixed_from_video_id == source.id
    done = client.videos.poll(remix.id, poll_interval_ms=100)
    assert client.videos.download_content(done.id).read() == make(8)


def test_list_pages_newest_first_and_delete_removes_the_video_and_its_content(client: OpenAI, tiers: Tiers) -> None:
    made = [client.videos.create(model=VIDEO, prompt=f"a dog {i}", seconds="1", size="64x64",  # type: ignore[arg-type]
                                 extra_body=QUICK).id for i in range(3)]
    first = client.videos.list(limit=2)
    assert [v.id for v in first.data] == made[:0:-1] and first.has_more
    rest = client.videos.list(limit=2, after=made[1])
    assert rest.data[0].id == made[0]
    assert [v.id for v in client.videos.list(order="asc", limit=100).data][-3:] == made
    done = client.videos.poll(made[0], poll_interval_ms=100)
    job = done.id.removeprefix("video_")
    redis = tiers.redis()
    assert redis.exists(tiers.keys.video_content(job, "video", VIDEO))
    deleted = client.videos.delete(done.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (done.id, True, "video.deleted")
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(done.id)
    assert not redis.exists(tiers.keys.video_content(job, "video", VIDEO), tiers.keys.video(done.id))
    assert done.id not in [v.id for v in client.videos.list(limit=100).data]


def test_delete_of_a_running_video_cancels_its_job(client: OpenAI, tiers: Tiers) -> None:
    video = client.videos.create(model=VIDEO, prompt="a long one", seconds="1", size=SLOW_SIZE,  # type: ignore[arg-type]
                                 extra_body=SLOW)
    wait_until(lambda: client.videos.retrieve(video.id).progress > 0, "the video to make progress")
    client.videos.delete(video.id)
    job_key = tiers.keys.job(video.id.removeprefix("video_"), VIDEO)
    wait_until(lambda: tiers.redis().hget(job_key, "status") == b"cancelled", "its job to be cancelled")


@pytest.mark.parametrize(
    ("fields", "param", "text"),
    [
        ({"size": "100x64"}, "size", "multiples of 32"),
        ({"size": "1024x64"}, "size", "exceeds max_resolution 512x512"),
        ({"seconds": "21"}, "seconds", "exceeds this model's maximum (20)"),
        ({"num_inference_steps": 101}, "num_inference_steps", "exceeds max_num_inference_steps (100)"),
        ({"style": "vivid"}, "style", ""),
    ],
)
def test_bad_requests_get_a_400_naming_the_field(tiers: Tiers, fields: dict, param: str, text: str) -> None:
    form = {"model": VIDEO, "prompt": "x", "size": "64x64", **fields}
    response = httpx.post(f"{tiers.base_url}/videos", data=form, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and text in error["message"]


def test_image_to_video_and_unknown_videos_are_refused_clearly(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.videos.create(model=VIDEO, prompt="x", input_reference=("a.png", b"\x89PNG", "image/png"))
    assert refused.value.body["param"] == "input_reference"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.videos.create(model="sora-2", prompt="x")
    for call in (client.videos.retrieve, client.videos.download_content, client.videos.delete):
        with pytest.raises(openai.NotFoundError):
            call("video_nope")


def test_a_video_whose_worker_dies_runs_again_and_its_progress_never_goes_back(client: OpenAI,
                                                                             tiers: Tiers) -> None:
    tiers.worker(VIDEO, name="video-2")
    tiers.wait_served(VIDEO, workers=2)
    video = client.videos.create(model=VIDEO, prompt="through a crash", seconds="1", size=SLOW_SIZE,  # type: ignore[arg-type]
                                 extra_body=SLOW)
    seen = [0]
    wait_until(lambda: seen.append(client.videos.retrieve(video.id).progress) or seen[-1] >= 5, "progress")
    job_key = tiers.keys.job(video.id.removeprefix("video_"), VIDEO)
    running_on = tiers.redis().hget(job_key, "worker").decode()
    victim = next(p for p in tiers.procs if p.poll() is None and running_on in tiers.log(p))
    victim.send_signal(signal.SIGKILL)
    while (current := client.videos.retrieve(video.id)).status not in ("completed", "failed"):
        seen.append(current.progress)
        time.sleep(0.2)
    assert current.status == "completed", current.error
    assert seen == sorted(seen), seen  # never backwards, though the second run started from step 1
    assert decoded(client.videos.download_content(video.id).read())[:3] == (9, 64, 64)
    survivor = tiers.redis().hget(job_key, "worker").decode()
    assert survivor != running_on
    assert "re-running 1 jobs of dead workers" in next(tiers.log(p) for p in tiers.procs if survivor in tiers.log(p))


def wait_until(check, what: str, timeout: float = 120) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_events_stream_progress_in_order_then_the_end(tiers: Tiers, client: OpenAI) -> None:
    video = client.videos.create(model=VIDEO, prompt="watch it", seconds="1", size="64x64",  # type: ignore[arg-type]
                                 extra_body={**QUICK, "num_inference_steps": 8})
    seen: list[tuple[str, int]] = []
    with httpx.stream("GET", f"{tiers.base_url}/videos/{video.id}/events", timeout=120) as stream:
        event = None
        for line in stream.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: {"):
                body = orjson.loads(line.removeprefix("data: "))
                assert event == f"video.{body['status']}"
                seen.append((body["status"], body["progress"]))
            elif line == "data: [DONE]":
                break
    assert seen[-1] == ("completed", 100)
    assert seen == sorted(seen, key=lambda s: (("queued", "in_progress", "completed").index(s[0]), s[1]))
    assert len(seen) >= 3, seen  # the progress of steps along the way, not only the end
    again = httpx.get(f"{tiers.base_url}/videos/{video.id}/events", timeout=30).text  # ended: one event
    assert again.count("event: ") == 1 and again.endswith("data: [DONE]\n\n")


def test_a_batch_of_video_lines_answers_each_with_the_finished_video(client: OpenAI, tiers: Tiers) -> None:
    tiers.start("batch-worker", "--api-url", f"http://127.0.0.1:{tiers.port}", "--name", "bw", name="bw")
    lines = [{"custom_id": f"v{i}", "method": "POST", "url": "/v1/videos",
              "body": {"model": VIDEO, "prompt": f"a boat {i}", "seconds": "1", "size": "64x64", **QUICK}}
             for i in range(2)]
    lines.append({**lines[0], "custom_id": "bad", "body": {**lines[0]["body"], "size": "65x64"}})
    uploaded = client.files.create(file=("v.jsonl", io.BytesIO(b"\n".join(orjson.dumps(x) for x in lines))),
                                   purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/videos", completion_window="24h")  # type: ignore[arg-type]
    wait_until(lambda: client.batches.retrieve(batch.id).status in ("completed", "failed"), "the batch", 300)
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.output_file_id, done
    assert done.error_file_id, done  # the refused line, as OpenAI files it
    answers = {x["custom_id"]: x["response"] for file in (done.output_file_id, done.error_file_id)
               for x in map(orjson.loads, client.files.content(file).read().splitlines())}
    assert answers["bad"]["status_code"] == 400 and answers["bad"]["body"]["error"]["param"] == "size"
    for name in ("v0", "v1"):
        body = answers[name]["body"]
        assert (answers[name]["status_code"], body["status"], body["progress"]) == (200, "completed", 100)
        assert decoded(client.videos.download_content(body["id"]).read())[:3] == (9, 64, 64)
