"""The soak command's pure parts: reading hey's summary, memory growth, what counts as a problem; and which
archive a measurement command serves."""

import pytest

from measure.command import MeasureError, archive_name
from measure.loadgen import parse_hey
from measure.reliability.soak import MAX_RSS_GROWTH, Slice, problems, rss_growth, table

HEY = """
Summary:
  Total:\t10.0104 secs
  Requests/sec:\t24.6743

Latency distribution:
  10% in 0.5123 secs
  50% in 0.6220 secs
  99% in 0.7830 secs

Status code distribution:
  [200]\t240 responses
  [503]\t5 responses

Error distribution:
  [2]\tPost "http://127.0.0.1:8080/predictions/resnet": context deadline exceeded
"""


def test_parse_hey_counts_answers_failures_and_unanswered():
    load = parse_hey(HEY)
    assert load.requests == 247 and load.failed == 7
    assert load.req_per_s == 24.6743 and load.p50_ms == pytest.approx(622.0) and load.p99_ms == pytest.approx(783.0)


def slices(*rss_after_each):
    return [Slice(10.0 * i, 100, 10.0, 50.0, 90.0, 0, {"11": mb, "12": 500.0}) for i, mb in enumerate(rss_after_each)]


def test_growth_is_measured_from_the_end_of_warm_up():
    growth = rss_growth(slices(500.0, 505.0, 510.0))  # baseline: RSS read right after the warm-up slice
    assert abs(growth["11"] - 0.02) < 1e-9 and growth["12"] == 0.0
    assert rss_growth(slices(400.0)) == {}


def test_problems_name_failures_replaced_workers_and_leaks():
    clean = slices(500.0, 505.0, 510.0)
    assert problems(clean, rss_growth(clean)) == []
    leaking = slices(500.0, 560.0, 600.0)
    assert any(f"grew 20.0% after warm-up (limit {MAX_RSS_GROWTH:.0%})" in p for p in problems(leaking, rss_growth(leaking)))
    failing = slices(500.0, 500.0)
    failing[1].errors = 3
    assert problems(failing, {}) == ["3 of 200 requests failed or went unanswered"]
    replaced = slices(500.0, 500.0)
    replaced[1].rss_mb = {"13": 500.0, "12": 500.0}
    assert "workers were replaced" in problems(replaced, {})[0]


def test_table_has_a_row_per_slice():
    rows = [line for line in table(slices(500.0, 505.0)).splitlines() if line.startswith("| ")]
    assert len(rows) == 3  # the header and two slices


FEW_ANSWERS = """
Summary:
  Slowest:\t4.2500 secs
  Requests/sec:\t5.1000

Latency distribution:
  10% in 2.0000 secs
  50% in 2.9000 secs
  95% in 4.0000 secs

Status code distribution:
  [200]\t76 responses
"""


def test_with_fewer_than_100_answers_the_slowest_request_stands_in_for_p99():
    load = parse_hey(FEW_ANSWERS)  # hey prints no 99% line below 100 answers
    assert load.p99_ms is None and load.p99_or_slowest_ms() == pytest.approx(4250.0)
    assert load.p50_ms == pytest.approx(2900.0) and load.requests == 76 and load.failed == 0


def test_the_archive_measured_is_the_one_asked_for_or_the_stores_only_one(tmp_path):
    with pytest.raises(MeasureError, match="no archive.*python -m export"):
        archive_name(tmp_path, None)
    (tmp_path / "resnet18.mar").write_bytes(b"x")
    assert archive_name(tmp_path, None) == "resnet18"  # named after the model, found, not assumed
    (tmp_path / "resnet50.mar").write_bytes(b"x")
    with pytest.raises(MeasureError, match="resnet18.mar, resnet50.mar: pass --model NAME"):
        archive_name(tmp_path, None)
    assert archive_name(tmp_path, "resnet50") == "resnet50"
    with pytest.raises(MeasureError, match="resnet34.mar not found"):
        archive_name(tmp_path, "resnet34")
