"""Key names: unchanged on one Redis; in cluster mode, hash tags put what one script touches in one slot."""
from __future__ import annotations

import pytest
from redis.crc import key_slot

from common.keys import Keys

PLAIN, CLUSTER = Keys("ovq"), Keys("ovq", cluster=True)


def slot(key: str) -> int:
    return key_slot(key.encode())


def test_single_redis_names_are_unchanged() -> None:
    assert PLAIN.jobs("m", "CPU") == "ovq:jobs:m:CPU"
    assert PLAIN.batch_jobs("m", "CPU") == "ovq:batchjobs:m:CPU"
    assert PLAIN.workers("m", "GPU") == "ovq:workers:m:GPU"
    assert PLAIN.awaiting("m", "CPU") == "ovq:awaiting:m:CPU"
    assert PLAIN.model("m") == "ovq:model:m"
    assert PLAIN.stats("m", "CPU", 60) == "ovq:stats:m:CPU:60"
    assert PLAIN.events("api1") == "ovq:ev:api1"
    assert PLAIN.job("j1") == PLAIN.job("j1", "m") == "ovq:job:j1"
    assert PLAIN.cancel("j1", "m") == "ovq:cancel:j1"
    assert PLAIN.blob("j1", "png", "m") == "ovq:blob:j1:png"
    assert PLAIN.generated("j1") == "ovq:gen:j1"
    assert PLAIN.journal("j1") == "ovq:journal:j1"
    assert PLAIN.reader("j1") == "ovq:reader:j1"
    assert PLAIN.model_cancel_channel("m") == PLAIN.cancel_channel == "ovq:cancel"
    assert PLAIN.rq_prefix == "ovq:rq"
    assert PLAIN.files == "ovq:files"
    assert PLAIN.batch("b1") == "ovq:batch:b1"
    assert PLAIN.batch_stats("m") == "ovq:batchstats:m"


def test_a_models_queue_keys_and_its_jobs_keys_share_one_slot() -> None:
    model = "OpenVINO/Qwen3-0.6B-int4-ov"
    keys = [CLUSTER.jobs(model, "CPU"), CLUSTER.batch_jobs(model, "GPU"), CLUSTER.workers(model, "CPU"),
            CLUSTER.awaiting(model, "NPU"), CLUSTER.model(model), CLUSTER.stats(model, "CPU", 60),
            CLUSTER.job("j1", model), CLUSTER.cancel("j1", model), CLUSTER.blob("j1", "png", model),
            CLUSTER.generated("j1", model), CLUSTER.journal("j1", model), CLUSTER.reader("j1", model),
            CLUSTER.fair_order(model, "CPU", "low"), CLUSTER.fair_clock(model, "CPU", "low"),
            CLUSTER.fair_bell(model, "CPU")]
    assert len(set(keys)) == len(keys)
    assert {slot(k) for k in keys} == {slot(CLUSTER.model_cancel_channel(model))}


def test_models_spread_over_slots() -> None:
    models = [f"model-{i}" for i in range(16)]
    assert len({slot(CLUSTER.jobs(m, "CPU")) for m in models}) == len(models)


def test_a_jobs_keys_need_its_model_in_cluster_mode() -> None:
    with pytest.raises(ValueError, match="model"):
        CLUSTER.job("j1")


def test_a_stored_response_and_its_background_record_share_a_slot() -> None:
    assert PLAIN.response("r1") == "ovq:response:r1" and PLAIN.background("r1") == "ovq:bg:r1"
    assert slot(CLUSTER.response("r1")) == slot(CLUSTER.background("r1")) != slot(CLUSTER.response("r2"))


def test_a_jobs_event_channel_lives_in_its_models_slot() -> None:
    """A worker's publish joins its step's other writes on its model's master; one Redis: one channel per API."""
    assert CLUSTER.events("api1", "m") == "ovq:ev:{m:m}:api1"
    assert slot(CLUSTER.events("api1", "m")) == slot(CLUSTER.job("j1", "m")) == slot(CLUSTER.jobs("m", "CPU"))
    assert CLUSTER.events("api1", "m") != CLUSTER.events("api2", "m")
    assert PLAIN.events("api1", "m") == PLAIN.events("api1") == "ovq:ev:api1"


def test_an_api_processs_own_channel_is_tagged_by_api() -> None:
    """Where workers from before per-model channels publish (the API still listens there)."""
    assert CLUSTER.events("api1") == "ovq:ev:{a:api1}"
    assert slot(CLUSTER.events("api1")) == slot("{a:api1}")


def test_the_batch_api_lives_in_one_slot() -> None:
    keys = [CLUSTER.rq_prefix + ":queue:x", CLUSTER.files, CLUSTER.file_data("f1"), CLUSTER.batch("b1"),
            CLUSTER.batches, CLUSTER.active_batches, CLUSTER.batch_done("b1"), CLUSTER.batch_lease("b1"),
            CLUSTER.batch_requeue("b1"), CLUSTER.batch_stats("m"), CLUSTER.batch_stats_models,
            # webhooks: a batch's end emits its event in its script; the deliverers' scripts touch all of these
            CLUSTER.webhooks, CLUSTER.webhook_retries, CLUSTER.webhook_sent("resp_1"), CLUSTER.webhook_log,
            CLUSTER.webhook_counts]
    assert len({slot(k) for k in keys}) == 1
    assert slot(CLUSTER.batch("b1")) != slot(Keys("other", cluster=True).batch("b1"))


def test_a_conversations_three_keys_share_a_slot() -> None:
    assert (PLAIN.conversation("c1"), PLAIN.conversation_items("c1"), PLAIN.conversation_order("c1")) == \
        ("ovq:conv:c1", "ovq:conv:c1:items", "ovq:conv:c1:order")
    keys = [CLUSTER.conversation("c1"), CLUSTER.conversation_items("c1"), CLUSTER.conversation_order("c1")]
    assert {slot(k) for k in keys} == {slot(CLUSTER.conversation("c1"))} != {slot(CLUSTER.conversation("c2"))}
