"""What `python -m serving batch` reads as its photos (a folder tree, a glob, a Parquet or CSV table of paths or
bytes) and how it cuts them into shards whose keys a resumed run finds again."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet as pq
import pytest

from serving.batch.inputs import BatchInputError, read_inputs, shards


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / ".cache").mkdir()
    for name in ("z.jpg", "a/one.jpg", "a/b/two.png", "a/notes.txt", ".hidden.jpg", ".cache/x.jpg"):
        (tmp_path / name).write_bytes(name.encode())
    return tmp_path


def test_a_folder_is_every_file_of_its_tree_in_order_hidden_ones_left_out(tree):
    photos = read_inputs(str(tree))
    assert [p.input for p in photos] == [str(tree / n) for n in ("a/b/two.png", "a/notes.txt", "a/one.jpg", "z.jpg")]
    assert all(p.path == p.input and p.data is None for p in photos)


def test_a_glob_matches_files_recursively(tree):
    photos = read_inputs(str(tree / "**" / "*.jpg"))
    assert [p.input for p in photos] == [str(tree / "a/one.jpg"), str(tree / "z.jpg")]


def test_a_parquet_table_of_relative_paths_with_an_id_column(tree):
    table = pa.table({"photo_id": ["p1", "p2"], "path": ["a/one.jpg", str(tree / "z.jpg")]})
    pq.write_table(table, tree / "photos.parquet")
    photos = read_inputs(str(tree / "photos.parquet"), id_column="photo_id")
    assert [(p.input, p.path) for p in photos] == [("p1", str(tree / "a/one.jpg")), ("p2", str(tree / "z.jpg"))]


def test_a_table_of_bytes_names_each_row_by_its_place(tree):
    pq.write_table(pa.table({"image": [b"\xff\xd8one", b"\xff\xd8two"]}), tree / "bytes.parquet")
    photos = read_inputs(str(tree / "bytes.parquet"))
    assert [(p.input, p.data, p.path) for p in photos] == [
        (f"{tree / 'bytes.parquet'}#0", b"\xff\xd8one", None),
        (f"{tree / 'bytes.parquet'}#1", b"\xff\xd8two", None),
    ]


def test_a_csv_table_with_a_named_column(tree):
    pyarrow.csv.write_csv(pa.table({"file": ["a/one.jpg"]}), tree / "photos.csv")
    assert [p.path for p in read_inputs(str(tree / "photos.csv"), column="file")] == [str(tree / "a/one.jpg")]


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda d: str(d / "nowhere"), "no such file or folder"),
        (lambda d: str(d / "*.webp"), "no photo there"),
        (lambda d: (pq.write_table(pa.table({"x": [1]}), d / "t.parquet"), str(d / "t.parquet"))[1], "--column"),
        (
            lambda d: (pq.write_table(pa.table({"path": ["a", "a"]}), d / "t.parquet"), str(d / "t.parquet"))[1],
            "--id-column",
        ),
        (lambda d: ((d / "t.parquet").write_bytes(b"not parquet"), str(d / "t.parquet"))[1], "not a readable"),
    ],
    ids=["missing", "empty glob", "no image column", "repeated names", "not a table"],
)
def test_inputs_that_cannot_be_scored_say_what_to_pass(tree, make, words):
    with pytest.raises(BatchInputError, match=words.replace("-", r"\-")):
        read_inputs(make(tree))


def test_shards_are_keyed_by_their_photos_names_the_same_on_every_run(tree):
    photos = read_inputs(str(tree))
    first, again = shards(photos, 3), shards(read_inputs(str(tree)), 3)
    assert [len(s.photos) for s in first] == [3, 1]
    assert [s.key for s in first] == [s.key for s in again] and len({s.key for s in first}) == 2
    (tree / "a" / "new.jpg").write_bytes(b"x")
    assert shards(read_inputs(str(tree)), 3)[0].key != first[0].key  # other photos, another part
