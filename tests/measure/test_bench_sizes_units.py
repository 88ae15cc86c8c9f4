"""The per-size serving benchmark's pure parts: bodies and their Content-Types, the mix row, the pipeline ceiling
of a row, the per-size table and how each body's row compares with what bounds it."""

from __future__ import annotations

import pytest
from PIL import Image

from measure import loadgen
from measure.served import bench, comparisons, report
from measure.served import peer as bench_peer
from measure.served import rows as bench_rows
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


def _compared(rows, reference="cat.jpg"):
    return {c.name: c for c in comparisons.compare(rows, reference, None)}


def test_the_served_choice_is_compared_with_its_artifact_alone_on_the_reference_body():
    served = _row("default", "cat.jpg", 92.0, artifact="openvino-bf16", precision="bf16", inprocess_per_s=100.0,
                  vs_inprocess=0.92, inprocess_batch=8)
    alone = comparisons.versus_model_alone(served)
    assert alone.name == "default (openvino-bf16) on cat.jpg at c=8 / openvino-bf16 alone in-process at batch 8"
    assert (alone.value, alone.cleared) == (0.92, True) and alone.detail == "92.0 req/s vs 100.0 img/s"
    assert comparisons.versus_model_alone({**served, "vs_inprocess": 0.8}).cleared is False
    no_inprocess = comparisons.versus_model_alone({**served, "vs_inprocess": None})
    assert no_inprocess.cleared is None
    assert "not measured: the in-process benchmark (--inprocess run" in no_inprocess.detail
    no_row = comparisons.versus_model_alone(None)
    assert no_row.cleared is None and "--concurrency with 8" in no_row.detail
    big = _row("default", "12mp.jpg", 16.0, vs_inprocess=0.2, inprocess_per_s=80.0, inprocess_batch=8)
    assert [c for c in _compared([big, served]).values() if "alone" in c.name] == [alone]  # the reference body only


def test_each_body_is_compared_with_its_request_path_where_the_run_measured_it():
    rows = [_row("default", "cat.jpg", 19.0, vs_pipeline=0.95, pipeline_ceiling=20.0),
            _row("default", "12mp.jpg", 8.0, vs_pipeline=0.8, pipeline_ceiling=10.0),
            _row("default", "mix", 9.0, c=4, vs_pipeline=0.1, pipeline_ceiling=90.0)]  # not at c=8: left out
    found = comparisons.versus_request_path(comparisons.at_compared(rows, "default"))
    assert [(c.name, c.value, c.cleared) for c in found] == [
        ("default (onnx-dynamo) on cat.jpg at c=8 / its request path in one process", 0.95, True),
        ("default (onnx-dynamo) on 12mp.jpg at c=8 / its request path in one process", 0.8, False)]
    assert found[1].detail == "8.0 req/s vs 10.0 images/s"
    unmeasured = comparisons.versus_request_path(comparisons.at_compared([_row("default", "cat.jpg", 19.0)], "default"))
    assert len(unmeasured) == 1 and unmeasured[0].cleared is None and "--pipeline run" in unmeasured[0].detail


def test_each_body_is_compared_with_the_naive_baseline_and_the_peer_where_both_ran():
    rows = [_row("default", "12mp.jpg", 16.0), _row("default", "cat.jpg", 20.0), _row("default", "mix", 18.0),
            _row("litserve", "12mp.jpg", 15.0), _row("litserve", "cat.jpg", 22.0), _row("naive", "cat.jpg", 3.0)]
    served = comparisons.at_compared(rows, "default")
    peer = {c.name: c for c in comparisons.versus_other(served, rows, "litserve", comparisons.PEER)}
    assert set(peer) == {"default (onnx-dynamo) on 12mp.jpg at c=8 / litserve",
                         "default (onnx-dynamo) on cat.jpg at c=8 / litserve"}  # the peer did not run the mix
    assert peer["default (onnx-dynamo) on 12mp.jpg at c=8 / litserve"].cleared is True
    behind = peer["default (onnx-dynamo) on cat.jpg at c=8 / litserve"]
    assert (round(behind.value, 3), behind.cleared, behind.detail) == (0.909, False, "20.0 vs 22.0 req/s")
    naive = comparisons.versus_other(served, rows, "naive", comparisons.NAIVE_BASELINE)
    assert [(c.value, c.cleared) for c in naive] == [(20.0 / 3.0, True)]
    slower = comparisons.versus_other(served, rows + [_row("naive", "mix", 20.0)], "naive", comparisons.NAIVE_BASELINE)
    assert [c.cleared for c in slower] == [True, False]
    alone = comparisons.versus_other(served, rows[:3], "litserve", comparisons.PEER)
    assert len(alone) == 1 and alone[0].cleared is None
    assert "--configurations with default and litserve" in alone[0].detail


def test_the_tail_falls_back_on_the_slowest_request_only_where_that_proves_it():
    assert comparisons.tail(_row("default", "a.jpg", 5.0, 100, 190)).cleared is True
    assert comparisons.tail(_row("default", "a.jpg", 5.0, 100, 210)).cleared is False
    few = _row("default", "a.jpg", 5.0, 100, None, slowest_ms=180.0)
    assert comparisons.tail(few).cleared is True and "slowest 180 ms" in comparisons.tail(few).detail
    unproven = comparisons.tail({**few, "slowest_ms": 400.0})
    assert unproven.cleared is None and "a longer --duration" in unproven.detail
    assert comparisons.tails({})[0].cleared is None  # no default row at c=8


def test_the_choice_is_compared_with_the_fp32_onnx_served_and_a_speed_only_row_is_never_judged():
    served = _row("default", "cat.jpg", 97.0, artifact="openvino-bf16", precision="bf16")
    fp32 = _row("fp32-onnx", "cat.jpg", 50.0)
    fast = _row("openvino-int8", "cat.jpg", 120.0, artifact="openvino-int8", precision="int8",
                gate="speed only, accuracy gate failed: top-1")
    bought, speed_only = comparisons.versus_fp32_onnx([served, fp32, fast], served, "cat.jpg")
    assert bought.name == "default (openvino-bf16) on cat.jpg at c=8 / fp32-onnx (onnx-dynamo)"
    assert (bought.value, bought.cleared) == (1.94, True)
    assert speed_only.value == 2.4 and speed_only.cleared is None and "not servable" in speed_only.detail
    slower = comparisons.versus_fp32_onnx([served, {**fp32, "req_per_s": 100.0}], served, "cat.jpg")
    assert [c.cleared for c in slower] == [False]
    itself = _row("default", "cat.jpg", 50.0)  # the choice is the fp32 ONNX: the benchmark skipped the repeat
    same = comparisons.versus_fp32_onnx([itself], itself, "cat.jpg")[0]
    assert (same.value, same.cleared) == (1.0, True)
    missing = comparisons.versus_fp32_onnx([served], served, "cat.jpg")[0]
    assert missing.cleared is None and "add fp32-onnx to --configurations" in missing.detail
    assert comparisons.versus_fp32_onnx([fp32], None, "cat.jpg")[0].cleared is None


def test_a_whole_run_is_compared_once_per_comparison_and_body(tmp_path):
    rows = [_row("naive", "cat.jpg", 3.0, failed=4), _row("default", "cat.jpg", 20.0, vs_inprocess=0.95,
                                                         inprocess_per_s=21.0, inprocess_batch=8),
            _row("default", "12mp.jpg", 16.0, 400, 700), _row("litserve", "cat.jpg", 22.0)]
    names = [c.name for c in comparisons.compare(rows, "cat.jpg", 0.9)]
    assert len(names) == len(set(names)) == 9  # alone, request path, naive, peer, 2 tails, fp32 ONNX, errors, peak
    assert names[0].endswith("/ onnx-dynamo alone in-process at batch 8") and names[-1].startswith("best fp32")
    empty = comparisons.compare([], "cat.jpg", None)
    assert all(c.cleared is None and c.detail.startswith("not measured") for c in empty)
    detector = [c.name for c in comparisons.compare(rows[1:3], "cat.jpg", None, classifier=False)]
    assert len(detector) == 5 and not [n for n in detector if "naive" in n or "litserve" in n or "fp32-onnx" in n]
    files = [_image(tmp_path / "vga.jpg", (64, 48)), _image(tmp_path / "cat.jpg", (32, 32))]
    assert bench.reference_body(files) == "cat.jpg" and bench.reference_body(files[:1]) == "vga.jpg"


def test_a_served_row_is_held_to_its_own_artifact_alone_where_the_run_timed_it():
    rows = [_row("default", "cat.jpg", 90.0, artifact="openvino-bf16", precision="bf16"),
            _row("fp32-onnx", "cat.jpg", 45.0)]
    report.add_ratios(rows, {"fp32": {8: 60.0}, "bf16": {8: 120.0}}, None,
                      {"openvino-bf16": {8: 100.0}, "onnx-dynamo": {8: 50.0}})
    assert (rows[0]["inprocess_per_s"], rows[0]["vs_inprocess"]) == (100.0, 0.9)  # not bf16's best (120)
    assert (rows[1]["inprocess_per_s"], rows[1]["vs_inprocess"]) == (50.0, 0.9)  # not fp32's best (60)


def test_the_model_alone_ceiling_counts_the_policys_workers_where_they_beat_one_process():
    from contract.policy import ServingPolicy
    from measure.inprocess.records import Report, Row

    def timed(threads, batch, per_s, artifact="onnx-traced"):
        return Row("m", artifact, "onnx", "fp32", "cpu", threads, batch, 1000 * batch / per_s, per_s, 1.0, None, "X", [1.0])
    measured = Report({}, rows=[timed(1, 1, 10.0), timed(2, 1, 7.5), timed(1, 8, 30.0), timed(2, 8, 70.0)])
    two_workers = ServingPolicy(2, 1, 0, 1, "cpu", "test")
    best, alone = bench.model_alone(measured, "m", two_workers)
    assert alone["onnx-traced"] == {1: 20.0, 8: 70.0}  # batch 1: 2 workers x 10; batch 8: one process, 2 threads
    assert bench.model_alone(measured, "m")[1]["onnx-traced"] == {1: 10.0, 8: 70.0}  # no policy: one process
