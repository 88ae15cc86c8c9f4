"""What `python -m serving batch` writes: parts in the stated Parquet schema, each complete or absent, the run's
record that keeps another run out of OUT; and what the Scorer makes of photos the endpoint refuses (an error row
with the endpoint's own status and message), run in-process on the shared resnet18 export."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pyarrow.parquet as pq
import pytest

from handlers.request_error import RequestError
from serving.batch.decoding import MAX_FILE_BYTES, decode_batch, read_body
from serving.batch.output import (
    RUN_RECORD,
    SCHEMA,
    BatchOutputError,
    RunRecord,
    part_path,
    prepare_out,
    read_rows,
    write_part,
)
from serving.batch.scoring import Scorer, first_label
from serving.settings import archive_config
from tests.conftest import CAT
from tests.e2e.test_bad_input import CASES

RECORD = RunRecord("abc", 2, 256, "resnet18", "photos/", "v1", "c" * 64)


def row(name: str, status: int = 200) -> dict:
    ok = status == 200
    return {
        "input": name,
        "status": status,
        "error": None if ok else "no",
        "answer": "{}" if ok else None,
        "label": "cat" if ok else None,
        "score": 0.5 if ok else None,
        "model": "m",
        "version": "v1",
        "artifact": "onnx-traced",
    }


def test_a_part_is_written_whole_in_the_schema_and_read_back(tmp_path):
    assert prepare_out(tmp_path, RECORD) == set()
    path = write_part(tmp_path, "k1", [row("a.jpg"), row("b.txt", 415)])
    assert path == part_path(tmp_path, "k1") and pq.read_schema(path).equals(SCHEMA, check_metadata=False)
    assert read_rows(tmp_path).to_pylist() == [row("a.jpg"), row("b.txt", 415)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_run.json", "part-k1.parquet"]  # no temporary left


def test_a_resumed_run_finds_its_parts_and_drops_a_killed_runs_temporary_files(tmp_path):
    prepare_out(tmp_path, RECORD)
    write_part(tmp_path, "k1", [row("a.jpg")])
    (tmp_path / ".part-k2.parquet.x1y2.tmp").write_bytes(b"half a part")
    assert prepare_out(tmp_path, RECORD) == {"k1"}
    assert not list(tmp_path.glob(".*.tmp"))


def test_out_holding_another_run_is_refused_and_left_as_it_is(tmp_path):
    prepare_out(tmp_path, RECORD)
    write_part(tmp_path, "k1", [row("a.jpg")])
    other = replace(RECORD, inputs_sha256="def", photos=3, source="other/")
    with pytest.raises(BatchOutputError, match="holds another run .*choose a new --out"):
        prepare_out(tmp_path, other)
    assert json.loads((tmp_path / "_run.json").read_text())["source"] == "photos/"


@pytest.mark.parametrize(
    "change, words",
    [
        ({"version": "v2"}, "resnet18 v2"),
        ({"content": "d" * 64}, "resnet18 v1 (content dddddddddddd)"),
        ({"model": "resnet50"}, "resnet50 v1"),
    ],
    ids=["another version", "other content", "another model"],
)
def test_out_scored_by_another_model_or_version_is_refused_and_left_as_it_is(tmp_path, change, words):
    prepare_out(tmp_path, RECORD)
    write_part(tmp_path, "k1", [row("a.jpg")])
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    with pytest.raises(BatchOutputError) as refused:
        prepare_out(tmp_path, replace(RECORD, **change))
    assert "holds rows scored by resnet18 v1 (content cccccccccccc)" in str(refused.value)
    assert f"this run scores with {words}" in str(refused.value) and "choose a new --out" in str(refused.value)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


def test_out_whose_record_names_no_version_is_refused(tmp_path):
    """An OUT begun before versions were recorded: its rows cannot be shown to be this version's."""
    old = {key: value for key, value in asdict(RECORD).items() if key not in ("version", "content")}
    (tmp_path / RUN_RECORD).write_text(json.dumps(old))
    with pytest.raises(BatchOutputError, match="its version not recorded .*choose a new --out"):
        prepare_out(tmp_path, RECORD)
    (tmp_path / RUN_RECORD).write_text("{half")
    with pytest.raises(BatchOutputError, match="cannot be read .*choose a new --out"):
        prepare_out(tmp_path, RECORD)


def test_a_file_that_cannot_be_read_is_an_error_row(tmp_path):
    missing = read_body(str(tmp_path / "gone.jpg"), None)
    assert isinstance(missing, RequestError) and missing.code == 404 and "cannot read" in missing.message
    huge = tmp_path / "huge.jpg"
    with open(huge, "wb") as handle:
        handle.truncate(MAX_FILE_BYTES + 1)  # sparse: nothing is written
    too_large = read_body(str(huge), None)
    assert isinstance(too_large, RequestError) and too_large.code == 413
    assert read_body("", b"abc") == b"abc"


def test_first_label_of_each_task():
    assert first_label({"predictions": [{"label": "cat", "probability": 0.9}]}) == ("cat", 0.9)
    assert first_label({"detections": [], "image": {}}) == (None, None)
    assert first_label({"classes": [{"label": "sky", "share": 0.4}]}) == ("sky", 0.4)


def test_bad_photos_are_rows_with_the_endpoints_status_and_message_decoded_apart_or_in_the_actor(
    resnet18_export, tmp_path
):
    names = ("truncated JPEG", "random bytes", "decompression bomb", "1x1 image", "empty body")
    files = []
    for index, name in enumerate(names):
        files.append(tmp_path / f"{index}.bin")
        files[-1].write_bytes(CASES[name][0])
    policy = {
        "workers": 1,
        "batch_size": 2,
        "max_batch_delay_ms": 5,
        "threads_per_worker": 1,
        "device": "cpu",
        "reason": "tests",
    }
    scorer = Scorer(str(resnet18_export["archive"]), policy)
    paths = [str(CAT), *map(str, files), str(tmp_path / "missing.jpg")]
    batch = {
        "input": paths,
        "shard": ["k"] * len(paths),
        "path": paths,
        "data": [b""] * len(paths),
        "inside": [""] * len(paths),
    }
    in_actor = scorer(batch)
    settings = json.dumps(archive_config(resnet18_export["archive"]).get("handler"))
    rows = scorer(decode_batch(batch, scorer.manifest.to_json(), settings))
    columns = ("input", "status", "error", "answer", "label", "score", "model", "version", "artifact")
    assert {c: rows[c] for c in columns} == {c: in_actor[c] for c in columns}  # the same rows either way
    assert all(ms > 0 for ms in rows["decode_ms"][:1]) and all(rows["decoder"])
    assert rows["status"][0] == 200 and rows["label"][0] == json.loads(rows["answer"][0])["predictions"][0]["label"]
    for index, name in enumerate(names, start=1):
        status, words = CASES[name][2]
        assert (rows["status"][index], rows["answer"][index]) == (status, None), (name, rows["error"][index])
        assert words in rows["error"][index], (name, rows["error"][index])
    assert rows["status"][-1] == 404
    assert set(rows["artifact"]) == {scorer.core.record.kind} and set(rows["shard"]) == {"k"}
    assert set(rows["version"]) == {scorer.core.version}  # an error row names the version the answers name
