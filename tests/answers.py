"""A served answer compared with the same artifact run in-process on the same image.

`expected_answer` runs the artifact an export folder or a .mar serves through handlers.core's
ImageCore (the very class the TorchServe adapter wraps), so any difference between the two is the
serving path's (transport, batching, a different artifact), not a second implementation's.
"""

from __future__ import annotations

import tempfile
import zipfile
from pathlib import Path

import torch

from handlers.core import ImageCore

ANSWER_FIELDS = ("model", "artifact")


def expected_answer(folder_or_archive: str | Path, image_bytes: bytes, topk: int = 5) -> dict:
    """The answer the endpoint should give: the folder's (or the .mar's) served artifact, in this process."""
    source = Path(folder_or_archive)
    if source.is_dir():
        return _answer(source, image_bytes, topk)
    with tempfile.TemporaryDirectory(prefix="unpacked-mar-") as unpacked:
        with zipfile.ZipFile(source) as archive:  # a .mar is a zip of the folder the handler runs in
            archive.extractall(unpacked)
        return _answer(Path(unpacked), image_bytes, topk)


def cached_answers(folder_or_archive: str | Path):
    """image bytes (, topk) -> expected_answer of the folder or .mar, computed once per image and k."""
    answers = {}

    def answer(image: bytes, topk: int = 5) -> dict:
        if (image, topk) not in answers:
            answers[image, topk] = expected_answer(folder_or_archive, image, topk)
        return answers[image, topk]
    return answer


def _answer(folder: Path, image_bytes: bytes, topk: int) -> dict:
    # this process's own thread count: the core pins torch's pool, which must not change the test process
    core = ImageCore.from_folder(folder, device="cpu", threads=torch.get_num_threads())
    return core.answer(image_bytes, topk)


def assert_same_answer(served: dict, expected: dict, atol: float = 1e-4) -> None:
    """Same labels and indices in the same order, probabilities within atol, same model and artifact."""
    for name in ANSWER_FIELDS:
        assert served.get(name) == expected.get(name), \
            f"{name}: served {served.get(name)!r}, expected {expected.get(name)!r}"
    got, want = served.get("predictions"), expected.get("predictions")
    assert isinstance(got, list) and isinstance(want, list), f"no predictions list in {served!r} or {expected!r}"
    assert [(p["index"], p["label"]) for p in got] == [(p["index"], p["label"]) for p in want], \
        f"top-{len(want)} differs:\nserved   {_ranked(got)}\nexpected {_ranked(want)}"
    far = [(p["index"], p["probability"], q["probability"]) for p, q in zip(got, want)
           if abs(p["probability"] - q["probability"]) > atol]
    assert not far, f"probabilities differ by more than {atol} (index, served, expected): {far}"


def _ranked(predictions: list) -> str:
    return ", ".join(f"{p['index']}:{p['label']}={p['probability']:.6f}" for p in predictions)
