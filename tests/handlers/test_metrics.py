"""The one set of metrics (handlers/metrics.py) and the request id and line (handlers/signals.py): names and
labels as Prometheus' conventions say, values summed over processes in multiprocess mode, ids accepted or made."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

from prometheus_client.parser import text_string_to_metric_families

from handlers import metrics, signals
from handlers.metrics import LATENCY_BUCKETS, STAGE_BUCKETS, ServedModel
from handlers.request_error import RequestError

SERVED = ServedModel("resnet18", "3", "onnx-dynamo")


def samples(text: str) -> dict[str, list]:
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def test_names_follow_prometheus_conventions_and_no_label_is_unbounded():
    families = samples(metrics.exposition().decode())
    for name in ("vision_request_duration_seconds", "vision_stage_duration_seconds", "vision_batch_size",
                 "vision_requests_in_flight", "vision_request_failures"):
        assert name in families
    assert metrics.REQUEST_SECONDS._labelnames == ("model", "version", "form", "code")
    assert "request_id" not in metrics.FAILURES._labelnames + metrics.STAGE_SECONDS._labelnames


def test_buckets_rise_and_stay_narrow_where_cpu_classifiers_answer():
    assert list(LATENCY_BUCKETS) == sorted(set(LATENCY_BUCKETS)) and list(STAGE_BUCKETS) == sorted(STAGE_BUCKETS)
    for low, high in zip(LATENCY_BUCKETS, LATENCY_BUCKETS[1:]):
        if 0.01 <= low < 0.4:
            assert high / low <= 1.5, (low, high)


def test_a_request_and_a_batch_are_recorded_with_their_labels():
    metrics.observe_request(SERVED, 415, 0.031)
    metrics.observe_batch(SERVED, 2, {"decode": 4.0, "inference": 20.0})
    families = samples(metrics.exposition().decode())
    labels = {"model": "resnet18", "version": "3", "form": "onnx-dynamo"}
    count = next(s for s in families["vision_request_duration_seconds"]
                 if s.name.endswith("_count") and s.labels == {**labels, "code": "415"})
    assert count.value >= 1
    assert any(s.labels == {**labels, "code": "415"} and s.value >= 1 for s in families["vision_request_failures"])
    inference = [s for s in families["vision_stage_duration_seconds"]
                 if s.labels == {**labels, "stage": "inference", "le": "0.02"}]  # this model's, not another test's
    assert inference and inference[0].value >= 1  # 20 ms falls in the 20 ms bucket (le is inclusive)


def test_served_model_is_read_from_a_core_description():
    described = ServedModel.of({"model": "m", "version": "v2", "artifact": "onnx-int8", "backend": "..."})
    assert described == ServedModel("m", "v2", "onnx-int8")
    assert ServedModel.of({"model": "m", "artifact": "traced"}).version == metrics.UNVERSIONED


def test_several_processes_are_summed_from_the_multiprocess_folder(tmp_path):
    """Two processes observe; a third exposes both (what each engine's metrics address does)."""
    env = {**os.environ, metrics.MULTIPROC_ENV: str(tmp_path)}
    observe = textwrap.dedent("""
        from handlers import metrics
        metrics.observe_request(metrics.ServedModel("m", "1", "traced"), 200, 0.05)
    """)
    for _ in range(2):
        subprocess.run([sys.executable, "-c", observe], env=env, check=True, timeout=120)
    expose = "from handlers import metrics; import sys; sys.stdout.write(metrics.exposition().decode())"
    text = subprocess.run([sys.executable, "-c", expose], env=env, check=True, timeout=120, capture_output=True,
                          text=True).stdout
    count = next(s for s in samples(text)["vision_request_duration_seconds"] if s.name.endswith("_count"))
    assert count.value == 2


def test_switched_off_nothing_is_recorded(tmp_path):
    env = {**os.environ, metrics.MULTIPROC_ENV: str(tmp_path), metrics.SIGNALS_ENV: "off"}
    script = textwrap.dedent("""
        from handlers import metrics, signals
        metrics.observe_request(metrics.ServedModel("m"), 200, 0.05)
        assert signals.request_id(None) == "" and signals.request_id("given-1") == "given-1"
    """)
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    assert "vision_request_duration_seconds_count" not in metrics_text(env)


def metrics_text(env: dict) -> str:
    expose = "from handlers import metrics; import sys; sys.stdout.write(metrics.exposition().decode())"
    return subprocess.run([sys.executable, "-c", expose], env=env, check=True, timeout=120, capture_output=True,
                          text=True).stdout


def test_a_request_id_is_accepted_or_made():
    assert signals.request_id("abc-123") == "abc-123"
    made = signals.request_id(None)
    assert len(made) == 32 and made != signals.request_id(None)
    forged = "x\nrequest 1 code=200"
    assert signals.request_id(forged) != forged  # nothing that could forge a log line is taken
    assert signals.request_id("a" * 200) != "a" * 200


def test_error_bodies_carry_the_id():
    body = signals.with_request_id(RequestError(415, "not an image").as_response(), "id-7")
    assert body == {"code": 415, "error": "not an image", "request_id": "id-7"}


class Row:
    def __init__(self, request_id: str):
        self.request_id = request_id


def test_each_request_of_a_batch_is_logged_with_its_id_stage_times_version_and_form(caplog):
    with caplog.at_level(logging.INFO, logger="handlers.requests"):
        signals.log_batch(SERVED, [(Row("id-a"), {"predictions": []}), (Row("id-b"), RequestError(400, "bad"))],
                          {"decode": 1.5, "inference": 9.25})
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0] == ("request id-a model=resnet18 version=3 form=onnx-dynamo code=200 batch=2 decode_ms=1.5 "
                        "inference_ms=9.25")
    assert lines[1].startswith("request id-b ") and "code=400" in lines[1]


def test_json_lines_are_one_object_each(monkeypatch):
    monkeypatch.setattr(signals, "JSON_LINES", True)
    line = json.loads(signals.request_line("id-a", SERVED, 200, {"decode": 1.0}))
    assert line == {"event": "request", "request_id": "id-a", "model": "resnet18", "version": "3",
                    "form": "onnx-dynamo", "code": 200, "batch": 1, "decode_ms": 1.0}
