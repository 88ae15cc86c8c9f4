"""handlers.core.ImageCore without any serving engine, on the archive the export command built
(unpacked, as TorchServe unpacks it): rows keep their own errors, the manifest's decision is what is
served, a changed artifact or an unknown handler setting is refused by name."""

from __future__ import annotations

import io
import logging
import shutil
from dataclasses import replace

import pytest
import torch
from PIL import Image

import models
from contract.policy import Machine, PolicyChoices, resolve_policy
from contract.records import MANIFEST_NAME, ContractError, Manifest
from export.package.selection import redecide
from handlers.core import HandlerSetupError, ImageCore, ImageRequest
from handlers.request_error import RequestError
from runtime import IntegrityError, open_artifact
from runtime.images import decode_upright, preprocess
from runtime.onnxruntime import OnnxRuntimeBackend
from runtime.torchscript import TorchScriptBackend
from tests.answers import assert_same_answer
from tests.conftest import ROOT

pytestmark = pytest.mark.slow
CAT = ROOT / "examples" / "cat.jpg"


def image(fmt="PNG", color=(30, 160, 90), size=(300, 200)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, fmt)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def unpacked(resnet18_unpacked):
    return resnet18_unpacked


@pytest.fixture(scope="module")
def core(unpacked):
    return ImageCore.from_folder(unpacked, threads=torch.get_num_threads())


@pytest.fixture
def editable(unpacked, resnet18_export, tmp_path):
    """A copy of the unpacked archive with every artifact of the export beside it, to rewrite its manifest."""
    folder = tmp_path / "model"
    shutil.copytree(unpacked, folder)
    manifest = Manifest.read(resnet18_export["out"])
    for record in manifest.artifacts.values():
        if not (folder / record.path).exists():
            shutil.copy2(resnet18_export["out"] / record.path, folder / record.path)
    return folder


def rewrite_manifest(folder, change) -> None:
    (folder / MANIFEST_NAME).write_text(change(Manifest.read(folder)).to_json())


def test_a_bad_row_stays_an_error_of_that_row_while_the_others_answer(core):
    rows = [ImageRequest(CAT.read_bytes()), ImageRequest(b"not an image at all"),
            ImageRequest.of_image(image(), topk=2), ImageRequest.of_image(image("JPEG"), topk=0)]
    answers = core.run_batch(rows).answers
    assert isinstance(answers[1], RequestError) and answers[1].code == 415 and "JPEG" in answers[1].message
    assert isinstance(answers[3], RequestError) and answers[3].code == 400 and "topk" in answers[3].message
    assert len(answers[0]["predictions"]) == 5 and len(answers[2]["predictions"]) == 2
    # batching changes nothing: each answered row is what the image alone gets
    assert_same_answer(answers[0], core.answer(CAT.read_bytes()))
    assert_same_answer(answers[2], core.answer(image(), topk=2))


def test_the_answer_is_the_served_artifact_and_matches_eager(core, unpacked):
    answer = core.answer(CAT.read_bytes())
    manifest = Manifest.read(unpacked)
    record = manifest.served_record()
    assert answer["model"] == answer["architecture"] == "resnet18"  # opened without an engine: no served name
    assert answer["artifact"] == record.kind == manifest.decision().served
    row = preprocess(decode_upright(CAT.read_bytes()), manifest.input.image_contract())[None]
    with torch.inference_mode():
        eager = torch.softmax(models.get("resnet18").build("random").module.eval()(row), dim=1)[0]
        served = torch.softmax(open_artifact(record.format, unpacked / record.path)(row), dim=1)[0]
    for probabilities in (eager, served):
        values, indices = probabilities.topk(5)
        assert [p["index"] for p in answer["predictions"]] == indices.tolist()
        assert [p["probability"] for p in answer["predictions"]] == pytest.approx(values.tolist(), abs=1e-4)
    assert answer["predictions"][0]["label"] == core.labels[int(indices[0])]


def test_an_artifact_whose_sha256_differs_from_the_manifest_is_refused(editable):
    record = Manifest.read(editable).served_record()
    path = editable / record.path
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(IntegrityError, match=f"{record.path}: sha256 [0-9a-f]{{64}} but the manifest records "
                                             f"{record.sha256}"):
        ImageCore.from_folder(editable, threads=torch.get_num_threads())


def test_handler_config_with_an_unknown_key_is_refused_with_the_key_named(unpacked):
    with pytest.raises(ContractError, match="model-config.yaml handler: unknown artifact"):
        ImageCore.from_folder(unpacked, settings={"artifact": "scripted", "topk": 3})
    with pytest.raises(ContractError, match="handler.topk must be from 1 to 100"):
        ImageCore.from_folder(unpacked, settings={"topk": 0})


def test_the_manifests_decision_is_what_is_served(editable, core):
    # the decision names scripted as the one candidate (redecide, as --serve does): that is what is opened
    rewrite_manifest(editable, lambda m: replace(m, serving=redecide(m.decision(), "scripted")))
    scripted = ImageCore.from_folder(editable, threads=torch.get_num_threads())
    assert type(scripted.backend) is TorchScriptBackend and type(core.backend) is OnnxRuntimeBackend
    answer = scripted.answer(CAT.read_bytes())
    assert answer["artifact"] == "scripted"
    assert_same_answer({**answer, "artifact": core.record.kind}, core.answer(CAT.read_bytes()))


def test_a_named_form_serves_only_when_the_export_gated_it_for_this_machine(unpacked, core):
    """`form=` re-runs the form a server named in its answer (tests/answers.py): a gated candidate opens, with the
    caller named as the reason; a form the gates kept out (servable but after the list's end, or diverging) is
    refused with the forms that may serve."""
    gated = [candidate["kind"] for candidate in Manifest.read(unpacked).decision().gated]
    named = ImageCore.from_folder(unpacked, threads=torch.get_num_threads(), form=gated[0])
    assert named.record.kind == gated[0] and "named by the caller" in named.describe()["why"]
    assert_same_answer(named.answer(CAT.read_bytes()), core.answer(CAT.read_bytes()), atol=0)
    for kept_out in ("scripted", "traced"):
        with pytest.raises(ContractError, match=f"'{kept_out}' is not among the forms this archive may serve on "
                                                f".* \\(.*{gated[0]}"):
            ImageCore.from_folder(unpacked, threads=torch.get_num_threads(), form=kept_out)


def test_a_runtime_failure_answers_500_with_the_reason_for_each_row_of_the_batch(editable, caplog):
    # the traced ONNX takes 224x224 only; a contract cropping 200x200 makes ONNX Runtime refuse the batch
    def traced_with_a_200_crop(m):
        crop = replace(m.input.image_contract(), crop=(200, 200))
        return replace(m, input=replace(m.input, preprocessing=crop),
                       serving=redecide(m.decision(), "onnx-traced"))
    rewrite_manifest(editable, traced_with_a_200_crop)
    core = ImageCore.from_folder(editable, threads=torch.get_num_threads())
    with caplog.at_level(logging.ERROR, logger="handlers.core"):
        answers = core.run_batch([ImageRequest(image()), ImageRequest(b"junk"), ImageRequest(image("JPEG"))]).answers
    assert [a.code for a in answers] == [500, 415, 500]
    assert "inference failed: onnx-traced failed on input (2, 3, 200, 200)" in answers[0].message
    assert "Traceback" in caplog.text  # the runtime's own error is logged with its traceback


def test_settings_threads_and_labels(unpacked, editable):
    before = torch.get_num_threads()
    try:
        assert ImageCore.from_folder(unpacked, settings={"threads": 1}, threads=2).threads == 1
        assert ImageCore.from_folder(unpacked, threads=2).threads == 2
        given = resolve_policy(Machine(0, 4), flags=PolicyChoices(workers=2))  # an engine's, read from its run config
        core = ImageCore.from_folder(unpacked, settings={"threads": 1}, threads=3, policy=given)
        assert core.threads == 2 and core.describe()["policy"] == given.describe()  # taken as it is
    finally:
        torch.set_num_threads(before)
    labels = Manifest.read(editable).output.labels
    (editable / labels).unlink()
    with pytest.raises(HandlerSetupError, match=f"names labels file {labels} but"):
        ImageCore.from_folder(editable, threads=before)


def test_fp16_on_a_cpu_worker_is_said_and_runs_fp32(unpacked, caplog):
    with caplog.at_level(logging.WARNING, logger="handlers.core"):
        core = ImageCore.from_folder(unpacked, settings={"fp16": True}, threads=torch.get_num_threads())
    assert core.backend.options.precision == "fp32" and "handler.fp16 is set but this worker runs on cpu" in caplog.text


def test_a_model_folder_without_a_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(ContractError, match="manifest.json not found"):
        ImageCore.from_folder(tmp_path)


def test_every_classs_rle_from_one_pass_equals_each_masks_own():
    """A segmenter's answer: rle_per_class reads the class map once and gives what rle gives per class."""
    from handlers.tasks import rle, rle_per_class
    generator = torch.Generator().manual_seed(0)
    for class_map in (torch.randint(0, 5, (7, 9), generator=generator, dtype=torch.uint8),
                      torch.zeros(4, 6, dtype=torch.uint8), torch.full((3, 3), 2, dtype=torch.uint8),
                      torch.randint(0, 2, (1, 1), generator=generator, dtype=torch.uint8),
                      torch.randint(0, 21, (48, 64), generator=generator, dtype=torch.uint8).repeat_interleave(5, 1)):
        found = rle_per_class(class_map)
        assert set(found) == set(class_map.unique().tolist())
        for index, mask in found.items():
            assert mask == rle(class_map == index), (class_map.shape, index)
