"""examples.validation_folder: a labelled ImageFolder from real photographs that the accuracy report reads."""

import hashlib

import pytest

import models
from examples.validation_folder import PHOTOS, build_folder, main
from export.precision.calibration import load_folder
from export.precision.gate import label_targets

CROPS = 2


def digests(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """One folder of CROPS crops per photograph, seed 5, read (never changed) by the tests below."""
    root = tmp_path_factory.mktemp("validation")
    build_folder(root, crops=CROPS, seed=5)
    return root


def test_one_class_folder_per_label_holding_the_photo_and_its_crops(folder):
    assert sorted(p.name for p in folder.iterdir()) == sorted(PHOTOS.values())
    for name, label in PHOTOS.items():
        files = sorted(p.name for p in (folder / label).iterdir())
        assert [f.rsplit(".", 1)[0] for f in files] == [f"{name}-{n:03d}" for n in range(CROPS + 1)]
    assert not [p for p in folder.rglob(".*")]  # no temporary file left behind


def test_the_same_seed_writes_the_same_bytes_and_another_seed_other_crops(folder, tmp_path):
    build_folder(tmp_path / "again", crops=CROPS, seed=5)
    build_folder(tmp_path / "other", crops=CROPS, seed=6)
    first, again, other = digests(folder), digests(tmp_path / "again"), digests(tmp_path / "other")
    assert first == again
    crops = [path for path in first if not path.endswith("-000.png")]
    assert all(first[path] != other.get(path) for path in crops)


def test_a_rerun_with_fewer_crops_leaves_no_stale_file(tmp_path):
    main([str(tmp_path), "--crops", "3"])
    main([str(tmp_path), "--crops", "1"])
    files = digests(tmp_path)
    assert {path.rsplit(".", 1)[0] for path in files} == {f"{label}/{name}-{n:03d}" for name, label in PHOTOS.items()
                                                          for n in range(2)}
    assert len(files) == 2 * len(PHOTOS)


def test_the_classes_map_onto_efficientnet_lite0s_labels(folder):
    entry = models.get("efficientnet-lite0")
    labels = entry.build("auto").labels
    images = load_folder(folder, entry.input_spec.preprocessing, count=100, workers=0)
    targets, how = label_targets(images.classes, images.labels, labels, len(labels))
    assert how == "class folders named after the model's labels"
    assert sorted(labels[t] for t in set(targets.tolist())) == sorted(PHOTOS.values())
    # every image is labelled with its own folder's class
    assert all(labels[t] == source.split("/")[-2] for t, source in zip(targets.tolist(), images.sources))
