"""The per-size serving benchmark's pure parts: bodies and their Content-Types, the mix row, the pipeline ceiling
of a row, the per-size table and the photo-size targets."""

from __future__ import annotations

import pytest
from PIL import Image

from measure import loadgen
from measure.served import bench, report
from measure.served import peer as bench_peer
from measure.served import rows as bench_rows
from measure.served import targets as bench_targets
from measure.served.ceiling import Ceilings


def _image(path, size, fmt="JPEG"):
    Image.new("RGB", size, (90, 120, 150)).save(path, fmt)
    return path


def test_each_body_is_sent_with_its_own_content_type():
    assert loadgen.content_type("shot.png") == "image/png" and loadgen.content_type("a.JPG") == "image/jpeg"
    assert loadgen.content_type("body.bin") == loadgen.CONTENT_TYPE  # unknown: the JPEG default
    command = loadgen.hey_command("http://h/p", "shot.png", 2, 60, duration_s=1)
    assert command[command.index("-T") + 1] == "image/png"
    command = loadgen.hey_command("http://h/p", "x.form", 2, 60, duration_s=1, mime="multipart/form-data; boundary=b")
    assert command[command.index("-T") + 1] == "multipart/form-data; boundary=b"


def test_images_take_files_and_folders_and_refuse_a_name_given_twice(tmp_path):
    folder = tmp_path / "bodies"
    folder.mkdir()
    _image(folder / "vga.jpg", (64, 48))
    _image(folder / "shot.png", (64, 48), "PNG")
    single = _image(tmp_path / "cat.jpg", (32, 32))
    assert [p.name for p in bench.image_files(f"{single},{folder}")] == ["cat.jpg", "shot.png", "vga.jpg"]
    with pytest.raises(bench.BenchError, match="vga.jpg more than once"):
        bench.image_files(f"{folder},{folder / 'vga.jpg'}")
    assert bench.parse_args(["--image", str(single)]).images == str(single)  # the old spelling still works


def test_the_peer_gets_the_same_bytes_as_the_multipart_form_curl_sends(tmp_path):
    image = _image(tmp_path / "shot.png", (40, 30), "PNG")
    form = bench_peer.form_body(image, tmp_path).read_bytes()
    head, rest = form.split(b"\r\n\r\n", 1)
    assert b'name="content"; filename="shot.png"' in head and b"Content-Type: image/png" in head
    assert rest == image.read_bytes() + f"\r\n--{bench_peer.BOUNDARY}--\r\n".encode()


def test_the_mix_splits_the_clients_and_adds_up_with_latency_upper_bounds():
    assert bench_rows.split(8, 4) == [2, 2, 2, 2] and bench_rows.split(8, 3) == [3, 3, 2]
    loads = {"a.jpg": loadgen.Load(100, 10.0, 50.0, 80.0, 120.0, 200.0, 0),
             "b.png": loadgen.Load(20, 2.0, 400.0, 500.0, None, 700.0, 1)}
    load, composition = bench_rows.merged(loads)
    assert (load.requests, load.req_per_s, load.failed) == (120, 12.0, 1)
    assert (load.p50_ms, load.p90_ms, load.p99_ms, load.slowest_ms) == (400.0, 500.0, 120.0, 700.0)
    assert composition == {"a.jpg": 100, "b.png": 20}


def test_a_mix_row_is_measured_only_with_several_bodies_a_client_for_each_and_a_duration():
    served = bench_rows.Served("default", "u", 60, {"a.jpg": None, "b.png": None, "c.jpg": None})
    timed = bench_rows.LoadPlan(20, None)
    assert bench_rows.bodies_at(served, 8, timed) == ["a.jpg", "b.png", "c.jpg", "mix"]
    assert bench_rows.bodies_at(served, 2, timed) == ["a.jpg", "b.png", "c.jpg"]
    assert bench_rows.bodies_at(served, 8, bench_rows.LoadPlan(None, 50)) == ["a.jpg", "b.png", "c.jpg"]
    one = bench_rows.Served("default", "u", 60, {"a.jpg": None})
    assert bench_rows.bodies_at(one, 8, timed) == ["a.jpg"]


def test_a_rows_pipeline_ceiling_is_its_bodys_or_its_mixs_composition():
    ceilings = Ceilings({"onnx-dynamo": {"a.jpg": {"pipeline_images_per_s": 30.0},
                                         "b.png": {"pipeline_images_per_s": 5.0}}}, workers=2)
    assert ceilings.of("onnx-dynamo", "a.jpg") == 60.0 and ceilings.of("onnx-int8", "a.jpg") is None
    assert ceilings.of_row({"artifact": "onnx-dynamo", "bodies": {"b.png": 7}}) == 10.0
    # 60 a's and 10 b's: 60/60 + 10/10 = 2 s of pipeline for 70 requests
    assert ceilings.of_row({"artifact": "onnx-dynamo", "bodies": {"a.jpg": 60, "b.png": 10}}) == pytest.approx(35.0)
    assert ceilings.of_row({"artifact": "onnx-dynamo", "bodies": {"a.jpg": 0, "b.png": 0}}) == pytest.approx(
        2 / (1 / 60 + 1 / 10))  # nothing answered: equal shares
    assert ceilings.of_row({"artifact": "onnx-dynamo", "bodies": {"c.jpg": 5}}) is None


def _row(name, body, rps, p50=100.0, p99=150.0, failed=0, precision="fp32", c=8, **extra):
    return {"configuration": name, "body": body, "concurrency": c, "req_per_s": rps, "p50_ms": p50, "p90_ms": p50,
            "p99_ms": p99, "failed": failed, "requests": 100, "precision": precision, "stages_ms": {},
            "artifact": "onnx-int8" if precision == "int8" else "onnx-dynamo", "bodies": {body: 100}, **extra}


def test_the_per_size_table_puts_each_served_row_beside_its_ceiling_and_the_model_alone():
    rows = [_row("naive", "12mp.jpg", 1.0), _row("default", "12mp.jpg", 4.0), _row("default", "mix", 9.0, 300, 900)]
    report.add_ratios(rows, {"fp32": {1: 10.0, 8: 20.0}}, lambda row: {"12mp.jpg": 5.0, "mix": 12.0}[row["body"]])
    default = rows[1]
    assert (default["vs_naive"], default["pipeline_ceiling"], default["vs_pipeline"]) == (4.0, 5.0, 0.8)
    assert (default["inprocess_per_s"], default["inprocess_batch"], default["vs_inprocess"]) == (20.0, 8, 0.2)
    assert rows[2]["vs_naive"] is None  # naive was not measured on the mix
    text = report.sizes_table(rows)
    assert "| 12mp.jpg | default | 8 | 4.0 | 100 | 150 | 0 | 5.0 | 20.0 (8) | 0.80 | 0.20 |" in text
    assert "| mix | default | 8 | 9.0 | ≤300 | ≤900 | 0 | 12.0 | 20.0 (8) | 0.75 | 0.45 |" in text


def test_photo_size_targets_from_the_rows_of_one_run(tmp_path):
    files = [_image(tmp_path / "cat.jpg", (64, 64)), _image(tmp_path / "12mp.jpg", (4032, 3024))]
    assert bench_targets.phone_photo(files) == "12mp.jpg" and bench_targets.phone_photo(files[:1]) is None
    rows = [_row("default", "12mp.jpg", 16.0, 400, 700), _row("int8", "cat.jpg", 30.0, 200, 500, precision="int8"),
            _row("litserve", "12mp.jpg", 15.0), _row("default", "cat.jpg", 20.0), _row("litserve", "cat.jpg", 22.0),
            _row("naive", "cat.jpg", 3.0, failed=4)]
    targets = {t.name: t for t in bench_targets.evaluate(rows, {"fp32": {8: 20.0}, "int8": {8: 40.0}}, files,
                                                         "cat.jpg")}
    fp32 = targets["fp32 served (default) at c=8 on 12mp.jpg / fp32 model alone at batch 8"]
    assert (fp32.value, fp32.met) == (0.8, True)
    assert targets["fp32 served (default) at c=8 on 12mp.jpg: p99 / p50"].met is True  # 1.75
    int8 = targets["int8 served (int8) at c=8 on cat.jpg / int8 model alone at batch 8"]
    assert (int8.value, int8.met) == (0.75, False)
    assert targets["int8 served (int8) at c=8 on cat.jpg: p99 / p50"].met is False  # 2.5
    assert targets["errors in our configurations' rows"].met is True  # the naive row's errors are not ours
    assert targets["ours (default) / LitServe peer at c=8 on 12mp.jpg"].met is True
    assert targets["ours (default) / LitServe peer at c=8 on cat.jpg"].met is False
    unmeasured = bench_targets.evaluate(rows[:1], {"fp32": {8: 20.0}}, files[:1], "cat.jpg")
    assert all(t.met is None for t in unmeasured if "served" in t.name or "LitServe" in t.name)
    assert "not measured: needs a 12 MP photo in --images" in unmeasured[0].detail
    no_c8 = bench_targets.evaluate([_row("default", "12mp.jpg", 4.0, c=4)], {"fp32": {8: 20.0}}, files, "cat.jpg")
    assert "needs an fp32 row (default or fp32-onnx) at concurrency 8" in no_c8[0].detail
    no_model = bench_targets.evaluate(rows, {}, files, "cat.jpg")
    assert "needs the in-process benchmark's fp32 batch 8" in no_model[0].detail


def test_the_tail_target_falls_back_on_the_slowest_request_only_where_that_proves_it():
    assert bench_targets.tail_target(_row("default", "a.jpg", 5.0, 100, 190), "t").met is True
    assert bench_targets.tail_target(_row("default", "a.jpg", 5.0, 100, 210), "t").met is False
    few = _row("default", "a.jpg", 5.0, 100, None, slowest_ms=180.0)
    assert bench_targets.tail_target(few, "t").met is True and "slowest 180 ms" in bench_targets.tail_target(few, "t").detail
    unproven = bench_targets.tail_target({**few, "slowest_ms": 400.0}, "t")
    assert unproven.met is None and "a longer --duration" in unproven.detail


def test_an_error_in_one_of_our_rows_fails_the_no_errors_target():
    target = bench_targets.no_errors([_row("default", "a.jpg", 5.0, failed=1), _row("litserve", "a.jpg", 5.0)])
    assert (target.value, target.met) == (1, False) and "1 of 100 requests" in target.detail


def test_a_served_row_is_held_to_its_own_artifact_alone_where_the_run_timed_it():
    rows = [_row("default", "cat.jpg", 90.0, artifact="openvino-bf16", precision="bf16"),
            _row("fp32-onnx", "cat.jpg", 45.0)]
    report.add_ratios(rows, {"fp32": {8: 60.0}, "bf16": {8: 120.0}}, None,
                      {"openvino-bf16": {8: 100.0}, "onnx-dynamo": {8: 50.0}})
    assert (rows[0]["inprocess_per_s"], rows[0]["vs_inprocess"]) == (100.0, 0.9)  # not bf16's best (120)
    assert (rows[1]["inprocess_per_s"], rows[1]["vs_inprocess"]) == (50.0, 0.9)  # not fp32's best (60)


def test_issue_31_targets_hold_the_default_to_its_artifact_alone_and_to_todays_row():
    served = _row("default", "cat.jpg", 97.0, artifact="openvino-bf16", precision="bf16", model="resnet50",
                  inprocess_per_s=100.0, vs_inprocess=0.97, inprocess_batch=8)
    today = _row("fp32-onnx", "cat.jpg", 50.0, model="resnet50")
    targets = {t.name: t for t in bench_targets.hardware_aware([served, today], "cat.jpg")}
    alone = targets["default served at c=8 on cat.jpg (openvino-bf16) / openvino-bf16 alone in-process at batch 8"]
    assert (alone.value, alone.met) == (0.97, True)
    versus = targets["default (openvino-bf16) at c=8 on cat.jpg / today's fp32-onnx (onnx-dynamo)"]
    assert (versus.value, versus.met) == (1.94, True)


def test_a_speed_only_row_is_measured_against_today_but_never_counts_as_met():
    served = _row("default", "cat.jpg", 50.0, model="resnet50", vs_inprocess=0.9, inprocess_per_s=55.6,
                  inprocess_batch=8)  # onnx-dynamo: nothing passed the gate, so fp32-onnx repeats it and is skipped
    fast = _row("openvino-int8", "cat.jpg", 120.0, model="resnet50", artifact="openvino-int8", precision="int8",
                gate="speed only, accuracy gate failed: top-1")
    targets = bench_targets.hardware_aware([served, fast], "cat.jpg")
    default, speed_only = targets[1], targets[2]
    assert (default.value, default.met) == (1.0, False)  # today's row is the default row itself
    assert speed_only.value == 2.4 and speed_only.met is None and "speed only" in speed_only.detail
    assert bench_targets.hardware_aware([], "cat.jpg")[0].met is None  # no default row: not measured
    lite = _row("default", "cat.jpg", 300.0, model="efficientnet-lite0", artifact="openvino-bf16", vs_inprocess=0.6,
                inprocess_per_s=500.0, inprocess_batch=8)
    assert "add int8 to --configurations" in bench_targets.hardware_aware([lite], "cat.jpg")[1].detail
    same = bench_targets.hardware_aware([{**lite, "artifact": "onnx-int8"}], "cat.jpg")[1]
    assert (same.value, same.met) == (1.0, False)  # the default serves today's int8: the same row, never 1.1x
