"""What a batch run reads where a row names a path (serving/batch/decoding.py read_body): a regular file only, a
device, a FIFO, a socket or a folder an error row saying so without reading it (a FIFO without a writer must not
block the worker, /dev/zero must not fill its memory); a table's paths only inside the table's folder, links
resolved, unless --allow-outside-paths; and a resume into an OUT that another model version wrote refused before
any work. Real files, a real FIFO and socket, /dev/zero, real links, the shared resnet18 export."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.csv
import pytest

from handlers.request_error import RequestError
from serving.batch.decoding import read_bodies, read_body
from serving.batch.inputs import photo_items, read_inputs, shards
from serving.batch.output import RUN_RECORD, prepare_out
from serving.batch.run import main, parse, read_manifest, run_record
from tests.conftest import CAT

READ_WAIT_S = 10  # far beyond a refusal's time; a read that blocks or fills memory would take it all


def read_within_time(path: str, inside: str = "") -> bytes | RequestError:
    """read_body in a thread, failing the test if it does not come back in time (a blocked open of a FIFO)."""
    found: list = []
    reader = threading.Thread(target=lambda: found.append(read_body(path, None, inside)), daemon=True)
    reader.start()
    reader.join(READ_WAIT_S)
    assert found, f"reading {path} did not come back within {READ_WAIT_S} s"
    return found[0]


def refused(body, status: int, words: str) -> str:
    assert isinstance(body, RequestError), f"read, not refused: {body[:40]!r}"
    assert (body.code, words in body.message) == (status, True), body.message
    return body.message


def test_a_regular_file_is_read(tmp_path):
    photo = tmp_path / "cat.jpg"
    photo.write_bytes(CAT.read_bytes())
    assert read_within_time(str(photo)) == CAT.read_bytes()


def test_dev_zero_is_refused_unread():
    message = refused(read_within_time("/dev/zero"), 400, "a character device, not a regular file")
    assert "/dev/zero" in message and "name the photo's file" in message


def test_a_fifo_without_a_writer_is_refused_at_once(tmp_path):
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    refused(read_within_time(str(fifo)), 400, "a FIFO (named pipe), not a regular file")


def test_a_socket_and_a_folder_are_refused(tmp_path):
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "s.jpg"))
        refused(read_within_time(str(tmp_path / "s.jpg")), 400, "a socket, not a regular file")
    (tmp_path / "folder.jpg").mkdir()
    refused(read_within_time(str(tmp_path / "folder.jpg")), 400, "a folder, not a regular file")


def test_a_link_to_a_device_is_refused_as_the_device(tmp_path):
    (tmp_path / "zero.jpg").symlink_to("/dev/zero")
    refused(read_within_time(str(tmp_path / "zero.jpg")), 400, "a character device")


def test_a_folder_lists_its_fifo_as_a_row_that_says_why_it_was_not_read(tmp_path):
    (tmp_path / "a.jpg").write_bytes(CAT.read_bytes())
    os.mkfifo(tmp_path / "b.jpg")
    photos = read_inputs(str(tmp_path))
    assert [photo.input for photo in photos] == [str(tmp_path / "a.jpg"), str(tmp_path / "b.jpg")]
    bodies = read_bodies(columns_of(photos))
    assert bodies[0] == CAT.read_bytes()
    refused(bodies[1], 400, "a FIFO")


def columns_of(photos) -> dict:
    items = photo_items(shards(photos))
    return {name: [item[name] for item in items] for name in items[0]}


@pytest.fixture
def table(tmp_path) -> Path:
    """photos/table.csv naming a photo inside its folder, one by '..', one by an absolute path, a link inside to a
    file outside, and a link inside to a file inside."""
    folder, outside = tmp_path / "photos", tmp_path / "elsewhere"
    folder.mkdir()
    outside.mkdir()
    for place in (folder / "in.jpg", outside / "out.jpg"):
        place.write_bytes(CAT.read_bytes())
    (folder / "escape.jpg").symlink_to(outside / "out.jpg")
    (folder / "alias.jpg").symlink_to(folder / "in.jpg")
    paths = ["in.jpg", "../elsewhere/out.jpg", str(outside / "out.jpg"), "escape.jpg", "alias.jpg"]
    pyarrow.csv.write_csv(pa.table({"path": paths}), folder / "table.csv")
    return folder / "table.csv"


def test_a_tables_paths_outside_its_folder_are_error_rows(table):
    bodies = read_bodies(columns_of(read_inputs(str(table))))
    assert bodies[0] == bodies[4] == CAT.read_bytes()  # inside, directly and through a link
    for body in bodies[1:4]:
        message = refused(body, 403, "is outside the table's folder")
        assert "--allow-outside-paths" in message and str(table.parent.parent / "elsewhere" / "out.jpg") in message


def test_allow_outside_paths_reads_them(table):
    bodies = read_bodies(columns_of(read_inputs(str(table), allow_outside=True)))
    assert bodies == [CAT.read_bytes()] * 5


def test_the_flag_is_on_the_command_line():
    assert parse(["m", "t.csv", "--out", "o", "--allow-outside-paths"]).allow_outside_paths
    assert not parse(["m", "t.csv", "--out", "o"]).allow_outside_paths


def test_a_resume_with_another_version_of_the_model_is_refused_before_any_work(resnet18_export, tmp_path, capsys):
    """The export folder is resnet18 unversioned, its archive resnet18 v1: OUT begun with one refuses the other
    (exit 1, the reason), and is left as it was."""
    photos, out = tmp_path / "photos", tmp_path / "scores"
    photos.mkdir()
    (photos / "cat.jpg").write_bytes(CAT.read_bytes())
    folder, archive = resnet18_export["out"], resnet18_export["archive"]
    begun = run_record(read_manifest(folder), read_inputs(str(photos)), parse([str(folder), str(photos), "--out", "o"]))
    prepare_out(out, begun)
    before = (out / RUN_RECORD).read_text()
    assert main([str(archive), str(photos), "--out", str(out)]) == 1
    error = capsys.readouterr().err
    assert "holds rows scored by resnet18 unversioned" in error and "this run scores with resnet18 v1" in error, error
    assert "choose a new --out" in error
    assert (out / RUN_RECORD).read_text() == before and sorted(p.name for p in out.iterdir()) == [RUN_RECORD]
    assert json.loads(before)["content"] == read_manifest(archive).model_version.content  # the same content
