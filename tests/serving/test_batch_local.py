"""The run on this machine alone (serving/batch/local.py) hands its pool every pending photo once, in INPUT's
order, a call's rows at a time, and turns each call's columns back into rows."""

from __future__ import annotations

from serving.batch.inputs import Photo, shards
from serving.batch.local import as_rows, calls


def test_every_photo_once_in_order_with_its_shard_and_no_call_over_the_size():
    photos = [Photo(f"p{index}", path=f"/photos/{index}.jpg") for index in range(5)] + [Photo("t#0", data=b"\xff")]
    pending = shards(photos, 4)
    batches = list(calls(pending, 3))
    assert [len(batch["input"]) for batch in batches] == [3, 3]
    assert sum((batch["input"] for batch in batches), []) == [photo.input for photo in photos]
    assert sum((batch["shard"] for batch in batches), []) == [pending[0].key] * 4 + [pending[1].key] * 2
    assert batches[1]["path"][-1] == "" and batches[1]["data"][-1] == b"\xff"  # a table's bytes, no path
    assert batches[0]["data"][0] == b"" and batches[0]["path"][0] == "/photos/0.jpg"
    assert sum((batch["inside"] for batch in batches), []) == [""] * 6  # no table: read anywhere


def test_a_calls_columns_come_back_as_its_rows():
    assert as_rows({"input": ["a", "b"], "status": [200, 415]}) == [
        {"input": "a", "status": 200},
        {"input": "b", "status": 415},
    ]
