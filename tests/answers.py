"""A served answer compared with the same artifact run in-process on the same image.

Every answer names the form that computed it (`artifact`). A server chooses that form at load, measuring its
gated candidates on this machine (runtime/form_choice.py), so the in-process answer is computed by the form the
served answer names, opened through handlers.core's ImageCore (the very class every engine wraps) with `form=`:
a form the export's gates kept out, or one this machine may not serve, is refused there. Any difference between
the two is then the serving path's (transport, batching, a different artifact), not a second implementation's or
a second measurement's.

    assert_same_answer(served, expected_answer(archive, image))   # computed by served["artifact"]
"""

from __future__ import annotations

import tempfile
import zipfile
from pathlib import Path

import torch

from handlers.core import ImageCore
from handlers.tasks import open_core

# What a served answer shares with the in-process one: the name it is served under is the server's (an in-process
# core names its architecture), so the architecture and the form are compared.
ANSWER_FIELDS = ("architecture", "artifact")


class ExpectedAnswer:
    """The answer a folder or .mar gives in-process for one image and k, by whichever of its gated forms a
    served answer names (each form run once)."""

    def __init__(self, source: str | Path, image_bytes: bytes, topk: int = 5):
        self.source, self.image_bytes, self.topk = Path(source), image_bytes, topk
        self.by_form: dict[str, dict] = {}

    def by(self, form: str) -> dict:
        """The answer of `form` (one of the source's gated forms this machine may serve) in this process."""
        if form not in self.by_form:
            self.by_form[form] = self._computed(form)
        return self.by_form[form]

    def _computed(self, form: str) -> dict:
        if self.source.is_dir():
            return _answer(self.source, form, self.image_bytes, self.topk)
        with tempfile.TemporaryDirectory(prefix="unpacked-mar-") as unpacked:
            with zipfile.ZipFile(self.source) as archive:  # a .mar is a zip of the folder the handler runs in
                archive.extractall(unpacked)
            return _answer(Path(unpacked), form, self.image_bytes, self.topk)

    def for_served(self, served: dict) -> dict:
        form = served.get("artifact")
        assert isinstance(form, str), f"the served answer names no form (artifact): {served!r}"
        return self.by(form)


def expected_answer(folder_or_archive: str | Path, image_bytes: bytes, topk: int = 5) -> ExpectedAnswer:
    """The answer the endpoint should give for this image: the folder's (or the .mar's) form that served it."""
    return ExpectedAnswer(folder_or_archive, image_bytes, topk)


def cached_answers(folder_or_archive: str | Path):
    """image bytes (, topk) -> expected_answer of the folder or .mar, each form computed once per image and k."""
    answers: dict = {}

    def answer(image: bytes, topk: int = 5) -> ExpectedAnswer:
        if (image, topk) not in answers:
            answers[image, topk] = expected_answer(folder_or_archive, image, topk)
        return answers[image, topk]
    return answer


def _answer(folder: Path, form: str, image_bytes: bytes, topk: int) -> dict:
    # this process's own thread count: the core pins torch's pool, which must not change the test process
    core = ImageCore.from_folder(folder, device="cpu", threads=torch.get_num_threads(), form=form)
    return core.answer(image_bytes, topk)


class ServedForms:
    """Each archive's cores in this process, one per form, for answers compared whole (a detector's or a
    segmenter's), each served under its name here as its server serves it (NAME.mar: NAME):
    `answer(name, served, body)` is what the form `served` names gives for the same body here;
    `forms[name]` is the archive's first gated form this machine meets, for tests without a server."""

    def __init__(self, folders: dict[str, Path], threads: int = 1):
        self.folders, self.threads = folders, threads
        self.cores: dict[tuple[str, str | None], ImageCore] = {}

    def core(self, name: str, form: str | None = None) -> ImageCore:
        if (name, form) not in self.cores:
            self.cores[name, form] = open_core(self.folders[name], threads=self.threads, measure=False, form=form,
                                               served_name=name)
        return self.cores[name, form]

    def __getitem__(self, name: str) -> ImageCore:
        return self.core(name)

    def answer(self, name: str, served: dict, body: bytes, **options) -> dict:
        form = served.get("artifact")
        assert isinstance(form, str), f"the served answer names no form (artifact): {served!r}"
        return self.core(name, form).answer(body, **options)


def assert_same_answer(served: dict, expected: dict | ExpectedAnswer, atol: float = 1e-4) -> None:
    """Same labels and indices in the same order, probabilities within atol, same architecture and artifact.
    `expected`: another served answer, or an ExpectedAnswer, computed by the form `served` names."""
    if isinstance(expected, ExpectedAnswer):
        expected = expected.for_served(served)
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
