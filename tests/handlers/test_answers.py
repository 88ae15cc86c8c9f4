"""The one reply every engine makes (handlers/answers.py): an answer or a row's error becomes its body, status and
headers, and its latency and failure are recorded under the served model's labels; a failure nobody expected is a
500 that names the request's id and never the exception's text."""

from __future__ import annotations

import logging

from prometheus_client import REGISTRY

from contract.versions import VERSION_HEADER
from handlers.answers import failure, reply
from handlers.logs import SERVED_BY
from handlers.metrics import ServedModel
from handlers.request_error import RequestError

# a name no other test records under, so that counts before and after are this test's alone
SERVED = ServedModel("clf-answers", "v4", "onnx-dynamo")
ANSWER = {"predictions": [{"label": "tabby", "index": 281, "probability": 0.5}], "model": "clf-answers",
          "architecture": "resnet18", "artifact": "onnx-dynamo", "version": "v4"}


def counted(metric: str, code: int) -> float:
    return REGISTRY.get_sample_value(metric, {**SERVED.labels(), "code": str(code)}) or 0.0


def test_an_answer_is_sent_as_it_is_naming_its_version_and_its_latency_is_recorded():
    before = counted("vision_request_duration_seconds_count", 200)
    sent = reply(ANSWER, SERVED, "req-1", 0.02, id_header="X-Vision-Request-ID", served_by="worker 1 pid 7")
    assert sent.body is ANSWER and sent.code == 200
    assert sent.headers == {VERSION_HEADER: "v4", SERVED_BY: "worker 1 pid 7", "X-Vision-Request-ID": "req-1"}
    assert counted("vision_request_duration_seconds_count", 200) == before + 1
    assert counted("vision_request_failures_total", 200) == 0


def test_a_rows_error_is_its_json_body_with_the_id_its_status_and_a_failure_counted():
    before = counted("vision_request_failures_total", 415)
    sent = reply(RequestError(415, "body is not an image"), SERVED, "req-2", 0.01)
    assert sent.code == 415 and sent.body == {"code": 415, "error": "body is not an image", "request_id": "req-2"}
    assert sent.headers == {VERSION_HEADER: "v4"}  # an error names its version too; no id header unless named
    assert counted("vision_request_failures_total", 415) == before + 1


def test_without_seconds_nothing_is_recorded_and_without_a_model_no_version_is_named():
    before = counted("vision_request_duration_seconds_count", 400)
    assert reply(RequestError(400, "empty request"), SERVED, "req-3").code == 400
    assert counted("vision_request_duration_seconds_count", 400) == before  # recorded where it was timed
    assert reply(RequestError(404, "no such model"), None, "req-4").headers == {}


def test_a_failure_nobody_expected_is_a_500_naming_the_id_not_the_exception(caplog):
    before = counted("vision_request_failures_total", 500)
    try:
        raise KeyError("/srv/secret/path")
    except KeyError as error:
        with caplog.at_level(logging.ERROR, logger="handlers.answers"):
            sent = failure(error, SERVED, "req-5", 0.05, served_by="replica-a")
    assert sent.code == 500 and "secret" not in str(sent.body) and "request id req-5" in sent.body["error"]
    assert sent.body["request_id"] == "req-5" and sent.headers[SERVED_BY] == "replica-a"
    assert "request req-5 failed: KeyError" in caplog.text and "Traceback" in caplog.text  # the reason, logged
    assert counted("vision_request_failures_total", 500) == before + 1
