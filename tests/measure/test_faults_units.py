"""The fault command's verdict: what counts as a failed recovery from a killed worker."""

import subprocess
import time

from measure.reliability.faults import GIVE_UP_S, RECOVERY_LIMIT_S, KillResult, problems, process_start_s, summary


def result(**changes) -> KillResult:
    fields = dict(clients=4, requests=137, failed=1, recovery_s=7.7, respawn_s=1.1, recovered=True, requests_after_recovery=40,
                  failed_after_recovery=0, killed_pid=11, pids_before=[11, 12], pids_after=[12, 13],
                  outcomes={"HTTP 200": 136, "ConnectionError": 1})
    return KillResult(**{**fields, **changes})


def test_a_recovery_that_lost_only_requests_in_flight_passes():
    assert problems(result()) == []
    text = summary(result())
    assert "1 of 137 requests failed" in text and "7.7 s after the kill" in text
    assert "replacement started after 1.1 s, then 6.6 s to start Python and load the model" in text
    assert "(outcomes: ConnectionError x1, HTTP 200 x136)" in text  # how the lost request was lost


def test_slow_recovery_more_failures_than_in_flight_and_later_failures_are_each_named():
    assert problems(result(recovery_s=RECOVERY_LIMIT_S + 1.8)) == [
        f"recovery took {RECOVERY_LIMIT_S + 1.8:.1f} s (limit {RECOVERY_LIMIT_S} s)"]
    assert problems(result(failed=5)) == ["5 requests failed, more than the 4 that could be in flight"]
    assert problems(result(failed_after_recovery=2)) == ["2 of 40 requests after recovery failed"]


def test_no_replacement_and_no_requests_after_it_are_failures():
    lost = result(recovered=False, recovery_s=GIVE_UP_S, respawn_s=None)
    assert problems(lost)[0] == f"worker 11 was not replaced within {GIVE_UP_S} s"
    assert f"no replacement worker within {GIVE_UP_S} s" in summary(lost)
    assert problems(result(requests_after_recovery=0)) == ["no request was answered after recovery"]


def test_process_start_time_is_on_the_boot_clock():
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    child = subprocess.Popen(["sleep", "5"])  # a process that started just now (pytest itself may be old)
    try:
        started = process_start_s(child.pid)
    finally:
        child.kill()
        child.wait()
    assert before - 1 <= started <= time.clock_gettime(time.CLOCK_BOOTTIME)
