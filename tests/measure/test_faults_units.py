"""The fault command's verdict: what counts as a failed recovery from a killed worker, and what is a missed target."""

import subprocess
import time

import pytest

from measure.reliability.faults import (
    ENGINES,
    GIVE_UP_S,
    RECOVERY_TARGET_S,
    KillResult,
    missed_target,
    problems,
    process_start_s,
    same_answer,
    summary,
)


def result(**changes) -> KillResult:
    fields = dict(clients=4, requests=137, failed=1, recovery_s=4.2, respawn_s=1.1, recovered=True,
                  requests_after_recovery=40, failed_after_recovery=0, killed_pid=11, pids_before=[11, 12],
                  pids_after=[12, 13], outcomes={"HTTP 200": 136, "ConnectionError": 1}, engine="kserve",
                  phases={"process_and_imports": 1.5, "archive": 0.1, "form_opened": 0.4, "first_answer": 0.02},
                  load_average=[1.5, 1.25, 1.0])
    return KillResult(**{**fields, **changes})


def test_a_recovery_that_lost_only_requests_in_flight_passes_and_says_where_the_seconds_went():
    assert problems(result()) == [] and missed_target(result()) == []
    text = summary(result())
    assert text.startswith("kserve worker kill: 1 of 137 requests failed, 0 answered wrongly")
    assert "the replacement answered 4.2 s after the kill (target 5 s)" in text
    assert ("its process started 1.1 s after the kill; process and imports 1.50 s, archive 0.10 s, form opened "
            "0.40 s, first answer 0.02 s") in text
    assert "load average 1.50/1.25/1.00" in text
    assert "(outcomes: ConnectionError x1, HTTP 200 x136)" in text  # how the lost request was lost


def test_a_spare_that_started_before_the_kill_is_said_to_have_taken_the_place():
    text = summary(result(respawn_s=-42.5, phases={"process_and_imports": 44.0, "form_opened": 0.4}))
    assert ("a spare process started 42.5 s before the kill took its place (its process and imports phase is its "
            "age); process and imports 44.00 s, form opened 0.40 s") in text


@pytest.mark.parametrize("engine", ENGINES)
def test_a_slow_replacement_misses_its_engines_target_but_is_no_misbehaviour(engine):
    slow = result(engine=engine, recovery_s=RECOVERY_TARGET_S[engine] + 1.8)
    assert problems(slow) == []
    assert missed_target(slow) == [f"the replacement answered {RECOVERY_TARGET_S[engine] + 1.8:.1f} s after the "
                                   f"kill (target {RECOVERY_TARGET_S[engine]} s)"]
    assert missed_target(result(engine=engine, recovery_s=RECOVERY_TARGET_S[engine])) == []


def test_more_failures_than_in_flight_wrong_answers_and_later_failures_are_each_named():
    assert problems(result(failed=5)) == ["5 requests failed, more than the 4 that could be in flight"]
    assert problems(result(wrong=2)) == ["2 requests were answered wrongly"]
    assert problems(result(failed_after_recovery=2)) == ["2 of 40 requests after recovery failed"]


def test_no_replacement_and_no_requests_after_it_are_failures():
    lost = result(recovered=False, recovery_s=GIVE_UP_S, respawn_s=None, phases={})
    assert problems(lost)[0] == f"worker 11 was not replaced by one that answered within {GIVE_UP_S} s"
    assert missed_target(lost) == []  # said once, as the failure it is
    assert f"no replacement worker answered within {GIVE_UP_S} s" in summary(lost)
    assert problems(result(requests_after_recovery=0)) == ["no request was answered after recovery"]


def test_an_answer_is_wrong_when_its_classes_or_probabilities_differ_from_its_forms_reference():
    reference = {"predictions": [{"index": 7, "probability": 0.5}, {"index": 3, "probability": 0.2}]}
    assert same_answer({"predictions": [{"index": 7, "probability": 0.50005}, {"index": 3, "probability": 0.2}]},
                       reference)
    assert not same_answer({"predictions": [{"index": 3, "probability": 0.2}, {"index": 7, "probability": 0.5}]},
                           reference)
    assert not same_answer({"predictions": [{"index": 7, "probability": 0.51}, {"index": 3, "probability": 0.2}]},
                           reference)
    assert not same_answer({"predictions": reference["predictions"][:1]}, reference)


def test_process_start_time_is_on_the_boot_clock():
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    child = subprocess.Popen(["sleep", "5"])  # a process that started just now (pytest itself may be old)
    try:
        started = process_start_s(child.pid)
    finally:
        child.kill()
        child.wait()
    assert before - 1 <= started <= time.clock_gettime(time.CLOCK_BOOTTIME)
