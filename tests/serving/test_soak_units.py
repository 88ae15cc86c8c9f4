"""The soak command's pure parts: reading hey's summary, memory growth, what counts as a problem."""

from serving.soak import MAX_RSS_GROWTH, Slice, parse_hey, problems, rss_growth, table

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
    numbers = parse_hey(HEY)
    assert numbers["requests"] == 247 and numbers["errors"] == 7
    assert numbers["req_per_s"] == 24.6743 and numbers["p50_ms"] == 622.0 and numbers["p99_ms"] == 783.0


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
    numbers = parse_hey(FEW_ANSWERS)  # hey prints no 99% line below 100 answers
    assert numbers["p99_ms"] == 4250.0 and numbers["p50_ms"] == 2900.0
    assert numbers["requests"] == 76 and numbers["errors"] == 0
