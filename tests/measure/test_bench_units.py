"""The serving benchmark's pure parts: hey's summary, the handler's stage lines, ratios, comparisons, tables."""

from __future__ import annotations

import pytest

from measure import loadgen
from measure.served import bench, comparisons, configurations, report
from tests.serving.manifests import manifest

HEY_OUTPUT = """
Summary:
  Total:\t20.0312 secs
  Slowest:\t1.2040 secs
  Fastest:\t0.0810 secs
  Average:\t0.4310 secs
  Requests/sec:\t18.4711

Latency distribution:
  10% in 0.2101 secs
  25% in 0.3302 secs
  50% in 0.4203 secs
  75% in 0.5004 secs
  90% in 0.6105 secs
  95% in 0.7006 secs
  99% in 0.9907 secs

Status code distribution:
  [200]\t368 responses
  [503]\t2 responses

Error distribution:
  [1]\tPost "http://127.0.0.1:8080/predictions/resnet": context deadline exceeded
"""

MODEL_LOG = """
2025-01-01T00:00:00,000 [INFO ] W-9000-resnet_1.0-stdout MODEL_LOG - serving onnx-dynamo (...)
2025-01-01T00:00:01,000 [INFO ] W-9000-resnet_1.0-stdout MODEL_LOG - batch of 1: decode=2.00ms preprocess=4.00ms inference=90.00ms encode=0.20ms
2025-01-01T00:00:02,000 [INFO ] W-9001-resnet_1.0-stdout MODEL_LOG - batch of 4: decode=8.00ms preprocess=16.00ms inference=400.00ms encode=0.80ms
2025-01-01T00:00:03,000 [INFO ] W-9001-resnet_1.0-stdout MODEL_LOG - batch of 2: decode=6.00ms preprocess=10.00ms inference=190.00ms encode=0.60ms
2025-01-01T00:00:03,000 [INFO ] W-9001-resnet_1.0-stdout MODEL_LOG - batch of 2: decode=garbled
"""


def test_hey_summary_gives_throughput_percentiles_and_every_failure():
    load = loadgen.parse_hey(HEY_OUTPUT)
    assert load.req_per_s == pytest.approx(18.4711)
    assert (load.p50_ms, load.p90_ms, load.p99_ms, load.slowest_ms) == pytest.approx((420.3, 610.5, 990.7, 1204.0))
    assert load.requests == 371 and load.failed == 3  # two 503s and one request that got no answer


def test_a_short_run_has_no_p99_rather_than_a_made_up_one():
    short = loadgen.parse_hey(HEY_OUTPUT.replace("  99% in 0.9907 secs\n", ""))
    assert short.p99_ms is None and short.p99_or_slowest_ms() == pytest.approx(1204.0)  # an upper bound, labelled


def test_hey_is_asked_for_a_duration_or_a_count_with_the_image_and_headers():
    command = loadgen.hey_command("http://h/p", "cat.jpg", 4, 60, duration_s=20, headers={"Authorization": "Bearer k"})
    assert command[:3] == ["hey", "-c", "4"] and ["-z", "20s"] == command[command.index("-z"):command.index("-z") + 2]
    assert "-H" in command and "Authorization: Bearer k" in command and command[-1] == "http://h/p"
    assert ["-n", "8"] == (c := loadgen.hey_command("u", "i", 1, 60, requests=8))[c.index("-n"):c.index("-n") + 2]
    with pytest.raises(ValueError):
        loadgen.hey_command("u", "i", 1, 60)


def test_stage_lines_are_parsed_and_medians_are_per_request():
    batches = report.parse_stage_lines(MODEL_LOG)
    assert [size for size, _ in batches] == [1, 4, 2]  # the garbled line is not counted
    medians = report.stage_medians(batches)
    assert medians["decode"] == pytest.approx(2.0)  # 2/1, 8/4, 6/2 -> median 2... of (2, 2, 3)
    assert medians["inference"] == pytest.approx(95.0)  # 90, 100, 95
    assert medians["batch"] == 2 and medians["batches"] == 3
    assert report.stage_medians([]) == {}


def test_ratios_to_naive_at_the_same_concurrency_and_to_in_process_at_the_largest_batch_that_fits():
    rows = [{"configuration": "naive", "concurrency": c, "req_per_s": r} for c, r in ((1, 5.0), (8, 4.0))]
    rows += [{"configuration": "default", "concurrency": c, "req_per_s": r} for c, r in ((1, 10.0), (4, 18.0), (8, 18.0))]
    report.add_ratios(rows, {"fp32": {1: 12.0, 8: 20.0, 32: 21.0}, "int8": {8: 40.0}})
    default = {r["concurrency"]: r for r in rows if r["configuration"] == "default"}
    assert default[1]["vs_naive"] == 2.0 and default[8]["vs_naive"] == 4.5 and default[4]["vs_naive"] is None
    assert default[4]["inprocess_batch"] == 1 and default[4]["vs_inprocess"] == 1.5
    assert default[8]["inprocess_batch"] == 8 and default[8]["vs_inprocess"] == 0.9
    assert report.inprocess_batch_for(16, [1, 8, 32]) == 8 and report.inprocess_batch_for(1, [8]) is None
    assert report.add_ratios([{"configuration": "default", "concurrency": 1, "req_per_s": 3.0}], {})[0]["vs_inprocess"] is None
    int8 = report.add_ratios([{"configuration": "int8", "precision": "int8", "concurrency": 8, "req_per_s": 20.0}],
                            {"fp32": {8: 20.0}, "int8": {8: 40.0}})[0]
    assert int8["vs_inprocess"] == 0.5  # held to int8's own ceiling, not fp32's


def test_a_comparison_is_cleared_missed_or_not_measured_and_the_table_says_which():
    at_least = comparisons.Bar("a / b", 0.9, "b costs at most 10 %")
    at_most = comparisons.Bar("p99 / p50", 2.0, "a short tail", at_most=True)
    found = [comparisons.Comparison("x", 0.925, at_least, "18.5 vs 20.0"),
             comparisons.Comparison("y", 0.74, at_least, "18.5 vs 25.0"),
             comparisons.not_measured("z", at_least, "add naive to --configurations"),
             comparisons.Comparison("w", 2.5, at_most, "p50 100 ms, p99 250 ms"),
             comparisons.Comparison("v", 0.5, at_least, "speed only", judged=False)]
    assert [c.cleared for c in found] == [True, False, None, False, None]
    table = comparisons.table(found)
    assert "| x | 0.93 | ≥ 0.9 | yes | 18.5 vs 20.0 |" in table and "| y | 0.74 | ≥ 0.9 | no |" in table
    assert "| z | — | ≥ 0.9 | — | not measured: add naive to --configurations |" in table
    assert "| w | 2.50 | ≤ 2 | no |" in table and "| v | 0.50 | ≥ 0.9 | not judged | speed only |" in table
    note = comparisons.bars_note(found)
    assert note.count("a / b `≥ 0.9`: b costs at most 10 %") == 1 and "p99 / p50 `≤ 2`: a short tail" in note
    assert found[1].record() == {"name": "y", "value": 0.74, "bar": "≥ 0.9", "bar_means": "b costs at most 10 %",
                                 "cleared": False, "detail": "18.5 vs 25.0"}
    assert comparisons.section(found).startswith("## How each row compares\n\n| comparison |")


def test_the_bars_name_what_they_mean_and_none_is_an_absolute_rate():
    bars = [b for b in vars(comparisons).values() if isinstance(b, comparisons.Bar)]
    assert len(bars) == 8 and len({b.compares for b in bars}) == 8
    assert all("/" in b.compares or "errors" in b.compares for b in bars)  # ratios (and a count), never req/s
    assert all(b.means and "issue" not in b.means for b in bars)


def test_errors_count_only_our_configurations_rows():
    ours, peer = _row("default", 5.0, 100.0, 150.0, requests=100), _row("litserve", 5.0, 100.0, 150.0, requests=100)
    failed = comparisons.errors([{**ours, "failed": 1}, peer, {**_row("naive", 1.0, 900.0, None), "failed": 4}])
    assert (failed.value, failed.cleared) == (1, False) and "1 of 100 requests" in failed.detail
    assert "| errors in our configurations' rows | 1 | ≤ 0 | no | 1 of 100 requests |" in comparisons.table([failed])
    clean = comparisons.errors([ours, {**peer, "failed": 3}])  # the peer's errors are not ours
    assert (clean.value, clean.cleared) == (0, True)
    unmeasured = comparisons.errors([peer])
    assert unmeasured.cleared is None and "not measured" in unmeasured.detail


def test_the_best_fp32_backend_is_compared_with_the_machines_gemm_peak():
    assert comparisons.versus_gemm_peak(0.95).cleared is True
    assert comparisons.versus_gemm_peak(0.4).cleared is False
    unmeasured = comparisons.versus_gemm_peak(None)
    assert unmeasured.cleared is None and "--inprocess run" in unmeasured.detail


def test_results_table_shows_ratios_and_stage_medians_and_dashes_where_there_are_none():
    rows = [{"configuration": "naive", "concurrency": 8, "req_per_s": 4.0, "p50_ms": 1900.0, "p90_ms": 2500.0,
             "p99_ms": None, "failed": 0, "stages_ms": {}},
            {"configuration": "default", "concurrency": 8, "req_per_s": 18.0, "p50_ms": 430.0, "p90_ms": 610.0,
             "p99_ms": 990.0, "failed": 1, "stages_ms": {"decode": 2.0, "preprocess": 4.0, "inference": 95.0,
                                                         "encode": 0.2, "batch": 1, "batches": 300}}]
    report.add_ratios(rows, {"fp32": {8: 20.0}})
    text = report.table(rows)
    assert "| — | naive | 8 | 4.0 | 1900 | 2500 | — | 0 | 1.00 | 0.20 (8) | — | — | — | — | — | — |" in text
    assert "| — | default | 8 | 18.0 | 430 | 610 | 990 | 1 | 4.50 | 0.90 (8) | 2.0 | 4.0 | 95.0 | 0.2 | 1 | — |" in text
    rows[1]["server_cpu_ms"] = 104.25
    assert "| 95.0 | 0.2 | 1 | 104.2 |" in report.table(rows)


def test_bad_options_are_errors_that_say_what_to_give(tmp_path):
    with pytest.raises(bench.BenchError, match="no manifest.json"):
        bench.check(bench.parse_args(["--export-dir", str(tmp_path)]))
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(bench.BenchError, match="unknown configuration"):
        bench.check(bench.parse_args(["--export-dir", str(tmp_path), "--configurations", "default,fastest"]))
    with pytest.raises(bench.BenchError, match="e.g. 1,4,8,16"):
        bench.check(bench.parse_args(["--export-dir", str(tmp_path), "--concurrency", "1,many"]))
    with pytest.raises(bench.BenchError, match="--warmup: give seconds, 0 or more"):
        bench.check(bench.parse_args(["--export-dir", str(tmp_path), "--warmup", "-1"]))


def test_an_optional_engine_not_installed_is_skipped_by_default_and_refused_when_asked_for(monkeypatch, capsys):
    monkeypatch.setitem(configurations.OPTIONAL_ENGINES, configurations.RAY, "no_such_engine_module")
    names = list(configurations.CONFIGURATIONS)
    assert configurations.RAY in names
    assert bench.with_installed_engines(names, explicit=False) == [n for n in names if n != configurations.RAY]
    assert "skipping ray: its engine is not installed (pip install -e '.[ray]')" in capsys.readouterr().out
    with pytest.raises(bench.BenchError, match=r"the ray configuration needs its engine: pip install -e '.\[ray\]'"):
        bench.with_installed_engines(["default", "ray"], explicit=True)
    monkeypatch.setitem(configurations.OPTIONAL_ENGINES, configurations.RAY, "json")  # an installed module
    assert bench.with_installed_engines(["default", "ray"], explicit=True) == ["default", "ray"]


def test_the_naive_baseline_is_torchserves_default_worker_count_without_batching():
    policy = configurations.naive_policy()
    assert policy.workers == configurations.CORES and policy.batch_size == 1
    assert policy.max_batch_delay_ms == configurations.TORCHSERVE_DEFAULT_BATCH_DELAY_MS
    assert configurations.CONFIGURATIONS[configurations.NAIVE].artifact == "traced"


def _row(name, rps, p50, p99, failed=0, **extra):
    return {"configuration": name, "concurrency": 8, "req_per_s": rps, "p50_ms": p50, "p90_ms": p50,
            "p99_ms": p99, "failed": failed, **extra}


def test_configurations_without_their_artifact_or_repeating_the_default_row_are_skipped(capsys):
    export = manifest("onnx-dynamo", ("traced", "scripted", "onnx-dynamo"))
    names = ["naive", "default", "int8", "fp32-onnx", "torchscript", "batched"]
    assert configurations.runnable(names, export) == ["naive", "default", "torchscript", "batched"]
    said = capsys.readouterr().out
    assert "skipping int8: this export has no onnx-int8" in said and "skipping fp32-onnx: the export serves" in said
    assert configurations.runnable(["fp32-onnx"], export) == ["fp32-onnx"]  # asked for alone, it runs


def test_each_row_serves_the_decided_artifact_unless_its_configuration_names_one(capsys):
    gated = manifest("onnx-dynamo", ("traced", "onnx-dynamo", "onnx-int8"),
                     candidates={"onnx-int8": "accuracy gate failed: top-1 agreement 94.5 % < 98 %"})
    assert configurations.served_kind("default", gated) == "onnx-dynamo"
    assert configurations.served_kind("int8", gated) == "onnx-int8"
    assert configurations.ungated_verdict("int8", gated) == "speed only, accuracy gate failed: top-1 agreement 94.5 % < 98 %"
    assert "SPEED ONLY, NOT SERVABLE: onnx-int8" in capsys.readouterr().out
    assert configurations.ungated_verdict("int8", manifest("onnx-int8", ("onnx-dynamo", "onnx-int8"))) is None


def burn_cpu(seconds: float) -> int:
    """Spin until this process has used `seconds` of CPU; the iterations it took."""
    import time
    start, spins = time.process_time(), 0
    while time.process_time() - start < seconds:
        spins += 1
    return spins


def test_the_server_trees_cpu_time_is_counted_per_row_and_a_gone_server_counts_nothing():
    import os
    import subprocess
    import sys

    from measure.served import rows as bench_rows
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        seconds = bench_rows.tree_cpu_s(os.getpid())
        assert os.getpid() in seconds and child.pid in seconds and all(s >= 0 for s in seconds.values())
        served = bench_rows.Served("x", "http://127.0.0.1:1", 1.0, {}, pid=os.getpid())
        result, cpu_s = bench_rows.cpu_window(served, lambda: burn_cpu(0.1))
        assert result > 0 and cpu_s >= 0.05  # /proc counts in 10 ms ticks: a fixed loop read 0.0 on a fast CPU
    finally:
        child.kill()
        child.wait()
    assert bench_rows.tree_cpu_s(child.pid) == {} and bench_rows.tree_cpu_s(None) == {}
    assert bench_rows.cpu_window(bench_rows.Served("x", "u", 1.0, {}), lambda: 1) == (1, None)


def test_a_detectors_bench_serves_each_servable_form_and_refuses_the_classifier_rows(tmp_path):
    import dataclasses
    detector = dataclasses.replace(manifest("onnx-traced", ("traced", "scripted", "onnx-traced"),
                                            name="fasterrcnn", candidates={"traced": "parity failed on blank"}),
                                   task="detection")
    assert configurations.default_names(detector) == ["default", "form:scripted", "kserve", "ray"]
    assert configurations.served_kind("form:scripted", detector) == "scripted"
    assert configurations.ceiling_of("form:scripted", detector) == ("scripted", "scripted", {})
    assert "naive" in configurations.default_names(manifest("onnx-dynamo", ("traced", "onnx-dynamo")))
    refused = configurations.task_refusals(["default", "naive", "litserve", "exact-decode"], detector)
    assert [line.split(":")[0] for line in refused] == ["naive", "litserve", "exact-decode"]
    (tmp_path / "manifest.json").write_text(detector.to_json())
    with pytest.raises(bench.BenchError, match="fasterrcnn is a detection model; naive: its handler is"):
        bench.check(bench.parse_args(["--export-dir", str(tmp_path), "--configurations", "default,naive"]))
    with pytest.raises(bench.BenchError, match="unknown configuration.*form:"):
        bench.check(bench.parse_args(["--export-dir", str(tmp_path), "--configurations", "form:"]))
