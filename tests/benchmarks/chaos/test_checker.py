"""benchmarks/chaos/checker.py on synthetic records: a clean run passes, and each thing it exists to catch (a lost
request or event, a duplicated outcome or event number, a text that is not what the server recorded or not its
greedy reference, an unclean error, a 5xx, a leaked key, busy KV cache) fails it."""
from __future__ import annotations

import pytest

from benchmarks.chaos.checker import check, pattern
from benchmarks.chaos.records import BACKGROUND, BATCH, CHAT, EMBEDDING, STREAM, Fault, RedisState, Request, Run

API_A, API_B = "http://127.0.0.1:1", "http://127.0.0.1:2"
TEXT = "The quick brown fox"


def _stream(key: str, sent: float, text: str = TEXT, reference: str | None = None) -> Request:
    request = Request(STREAM, key, sent, API_A, "q", job=f"job{key}", events=[1, 2, 3, 4],
                      terminals=["done:length"], statuses=[200], ended=sent + 3, server_text=text,
                      reference=reference)
    for n, word in enumerate(text.split(" ")):
        request.add_text(word if n == 0 else f" {word}", sent + 1 + n * 0.5)
    return request


def _clean_run() -> Run:
    """One request of each kind, then a greedy stream alone; a baseline and an after that match."""
    requests = [
        _stream("s1", 100.0),
        Request(CHAT, "c1", 100.0, API_B, "q", job="jobc1", text=TEXT, terminals=["done:stop"], statuses=[200],
                first=101.0, ended=101.0, server_text=TEXT),
        Request(BACKGROUND, "b1", 100.0, API_A, "q", job="resp_1", text=TEXT, events=[0, 1, 2, 3],
                terminals=["completed"], statuses=[200, 200], resumes=1, first=101.0, ended=104.0, server_text=TEXT),
        Request(BATCH, "l1", 100.0, "", "q", job="jobl1", text=TEXT, terminals=["done:length"], ended=110.0,
                server_text=TEXT),
        Request(EMBEDDING, "e1", 100.0, API_B, "q", terminals=["done"], statuses=[200], first=100.1, ended=100.1,
                vector=[1.0, 0.0], reference_vector=[1.0, 0.0]),
        _stream("alone", 200.0, reference=TEXT),
    ]
    state = RedisState({"ovq:jobs:m:CPU": -1, "ovq:worker:w1": 5}, 1_000_000, {"ovq:jobs:m:CPU": 0})
    after = RedisState({"ovq:jobs:m:CPU": -1, "ovq:worker:w1": 5, "ovq:job:abcdef0123456789": 3600}, 1_000_000,
                       {"ovq:jobs:m:CPU": 0})
    return Run(requests, [], baseline=state, after=after, kv_usage={"w1": 0.0, "w2": 0.0},
               apis={API_A: "api_1", API_B: "api-2_1"}, began=90.0, finished=300.0)


def _by_key(run: Run, key: str) -> Request:
    return next(r for r in run.requests if r.key == key)


def test_a_clean_run_passes_and_compares_the_stream_that_ran_alone() -> None:
    report = check(_clean_run())
    assert not report.failed, report
    assert report.greedy_compared == 1  # "s1" overlapped other requests: its greedy text proves nothing
    assert sum(report.requests.values()) == 6 and report.outcomes["done"] == 5


def test_a_batch_line_missing_from_the_files_is_lost() -> None:
    run = _clean_run()
    _by_key(run, "l1").terminals.clear()
    report = check(run)
    assert report.failed and len(report.lost) == 1 and "l1" in report.lost[0]


def test_a_missing_event_number_is_lost() -> None:
    run = _clean_run()
    _by_key(run, "s1").events = [1, 2, 4]
    report = check(run)
    assert report.failed and report.lost == ["stream s1: event numbers missing [3]"]


def test_a_stream_checks_its_numbers_against_its_journal() -> None:
    """After a takeover the new worker's `accepted` takes a number and makes no frame: no gap then; a journaled
    delta with text the client never got is one."""
    run = _clean_run()
    stream = _by_key(run, "s1")
    stream.events = [1, 2, 4, 5]
    stream.journal = [(1, True), (2, True), (3, False), (4, True), (5, True)]
    assert not check(run).failed
    stream.journal[2] = (3, True)
    assert check(run).lost == ["stream s1: event numbers missing [3]"]
    stream.events, stream.terminals = [1, 2], ["error:service_unavailable"]  # ended by a failover's clean error
    run.faults = [Fault("redis failover", "redis_1", 100.5, 110.0)]
    assert not check(run).failed, "the rest its job made after the error is not missing"
    stream.events, stream.terminals, run.faults = [1, 2, 4, 5], ["done:length"], []
    stream.events = [1, 2, 3, 4, 5, 6]
    assert check(run).mismatched == ["stream s1: event numbers the server never journaled [6]"]


def test_an_event_number_received_twice_is_duplicated() -> None:
    run = _clean_run()
    _by_key(run, "b1").events = [0, 1, 2, 2, 3]
    report = check(run)
    assert report.failed and report.duplicated == ["background b1: event numbers received twice [2]"]


def test_two_terminal_outcomes_are_duplicated() -> None:
    run = _clean_run()
    _by_key(run, "c1").terminals.append("done:stop")
    report = check(run)
    assert report.failed and len(report.duplicated) == 1


def test_text_that_is_not_what_the_server_recorded_is_mismatched() -> None:
    run = _clean_run()
    _by_key(run, "l1").server_text = TEXT + " jumps"
    report = check(run)
    assert report.failed and len(report.mismatched) == 1 and "l1" in report.mismatched[0]


def test_a_done_request_the_server_has_no_record_of_is_mismatched() -> None:
    run = _clean_run()
    _by_key(run, "c1").server_text = None
    assert check(run).mismatched == ["chat c1: the server has no record of its output (job jobc1)"]


def test_a_stream_alone_that_differs_from_its_reference_is_mismatched() -> None:
    run = _clean_run()
    _by_key(run, "alone").reference = "The quick brown cat"
    report = check(run)
    assert report.failed and len(report.mismatched) == 1 and "alone" in report.mismatched[0]


@pytest.mark.parametrize(("reference", "flips", "mismatches"),
                         [("The quick brown dog", 1, 0), ("The quack brown fox", 0, 1)])
def test_a_continued_stream_is_compared_up_to_the_takeover_point(reference: str, flips: int,
                                                                   mismatches: int) -> None:
    """Received "The" at 201, " quick" at 201.5, " brown" at 202, " fox" at 202.5; a worker killed at 202.2: "The
    quick brown" came before the takeover point. A reference that differs after it is a flip, one that differs
    before it a mismatch."""
    run = _clean_run()
    _by_key(run, "alone").reference = reference
    run.faults = [Fault("worker kill", "worker_1", 202.2, 207.0)]
    report = check(run)
    assert (report.continued, report.flipped, len(report.mismatched)) == (1, flips, mismatches)


def test_an_error_in_calm_is_unclean_and_the_same_during_a_fault_is_documented() -> None:
    run = _clean_run()
    stream = _by_key(run, "s1")
    stream.terminals = ["error:worker_died"]
    assert check(run).unclean == ["stream s1: error:worker_died"]
    run.faults = [Fault("worker kill", "worker_1", 101.0, 110.0)]
    assert not check(run).failed


def test_a_journal_that_lost_events_is_documented_during_a_redis_failover_only() -> None:
    run = _clean_run()
    stream = _by_key(run, "s1")
    stream.terminals = ["error:events_lost"]
    run.faults = [Fault("worker kill", "worker_1", 101.0, 110.0)]  # a worker fault loses no journal entry
    assert check(run).unclean == ["stream s1: error:events_lost"]
    run.faults = [Fault("redis failover", "redis_1", 101.0, 110.0)]
    assert not check(run).failed


def test_a_5xx_other_than_503_fails_the_run() -> None:
    run = _clean_run()
    _by_key(run, "c1").statuses = [500]
    _by_key(run, "c1").terminals = ["http:500:-"]
    run.faults = [Fault("api kill", "api_1", 99.0, 105.0)]
    report = check(run)
    assert report.failed and report.server_errors == ["chat c1: HTTP 500"]


def test_a_batch_line_answered_500_counts_as_a_5xx() -> None:
    run = _clean_run()
    _by_key(run, "l1").terminals = ["error:500:None"]
    run.faults = [Fault("redis failover", "redis_1", 99.0, 105.0)]
    report = check(run)
    assert report.server_errors == ["batch line l1: HTTP 500 in the batch files"]
    assert report.unclean == ["batch line l1: error:500:None"]


def test_a_connection_lost_with_its_api_is_documented_and_without_a_kill_is_lost() -> None:
    run = _clean_run()
    chat = _by_key(run, "c1")
    chat.terminals, chat.ended, chat.transport_errors = [], None, ["100.5 RemoteProtocolError"]
    assert check(run).lost and check(run).failed
    run.faults = [Fault("api kill", "api-2_1", 100.4, 104.0)]
    report = check(run)
    assert not report.failed and report.outcomes["connection lost with its API (documented)"] == 1


def test_a_request_with_no_outcome_and_no_error_is_hung() -> None:
    run = _clean_run()
    stream = _by_key(run, "s1")
    stream.terminals, stream.ended = [], None
    assert check(run).hung == ["stream s1: no terminal outcome by the end of the run"]


def test_a_key_without_ttl_left_behind_is_leaked_by_pattern() -> None:
    run = _clean_run()
    assert run.after is not None
    run.after.keys["ovq:gen:0123456789abcdef0123"] = -1
    run.after.keys["ovq:gen:fedcba98765432100123"] = -1
    report = check(run)
    assert report.failed and report.leaked_keys == {"ovq:gen:*": 2}


def test_entries_left_in_a_queue_stream_are_leaked() -> None:
    run = _clean_run()
    assert run.after is not None
    run.after.streams["ovq:jobs:m:CPU"] = 2
    run.after.streams["ovq:fairbell:m:CPU"] = 32  # capped: it fills to its cap by design
    assert check(run).leaked_keys == {"ovq:jobs:m:CPU (stream: 2 entries, 0 at the baseline)": 1}


def test_memory_that_does_not_return_to_its_baseline_fails_the_run() -> None:
    run = _clean_run()
    assert run.after is not None
    run.after.used_memory = 5_000_000
    assert check(run).memory_leaked and check(run).failed


def test_an_idle_worker_holding_kv_cache_fails_the_run() -> None:
    run = _clean_run()
    run.kv_usage["w2"] = 0.125
    assert check(run).kv_busy == {"w2": 0.125}


def test_an_embedding_that_is_not_its_texts_is_mismatched() -> None:
    run = _clean_run()
    _by_key(run, "e1").vector = [0.0, 1.0]
    assert check(run).mismatched == ["embedding e1: not the text's embedding"]


def test_ids_are_starred_in_key_patterns_and_model_names_kept() -> None:
    assert pattern("ovq:job:3f2a9b0c1d2e3f40", set()) == "ovq:job:*"
    assert pattern("ovq:jobs:smollm2-135m-instruct:CPU", {"smollm2-135m-instruct"}) == \
        "ovq:jobs:smollm2-135m-instruct:CPU"
