"""export/checks/decode.py: what draft decoding changes, measured with the served artifact, gated, recorded in
the manifest, and what the handler then does with it."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
import torch
from PIL import Image

import models
from contract.handler_config import HandlerConfig
from contract.records import ContractError
from export.checks.decode import DECODE_TOLERANCE, DRAFT_SCALES, check_images, check_tensors, judge
from handlers.core import ImageCore
from runtime.images import decode_image, decode_upright, draft_floor, preprocess

RESNET18 = replace(models.get("resnet18").input_spec.record().image_contract(), decode="draft")


def test_check_images_are_decoded_at_the_scales_they_stand_for():
    floor = draft_floor(RESNET18)
    images = check_images(RESNET18)
    assert len(images) == sum(DRAFT_SCALES.values())
    for data, info in images:
        stored = Image.open(io.BytesIO(data)).size
        drafted = decode_image(data, floor)
        scale = int(info["draft_scale"].split("/")[1])
        assert min(drafted.shape[1:]) >= floor, info  # never below the floor
        assert max(drafted.shape[1:]) == -(-max(stored) // scale), info  # libjpeg's scaled size, rounded up
    assert any(info["sideways"] for _, info in images) and not all(info["sideways"] for _, info in images)


def metrics_of(exact: torch.Tensor, draft: torch.Tensor, top5: float = 1.0) -> dict:
    levels = (draft - exact).abs() * 255
    return {"mean_levels": levels.mean().item(), "max_levels": levels.max().item(), "relative_logit_error": 0.01,
            "confident_images": 10, "top1_agreement_confident": 1.0, "top5_agreement_confident": top5}


def test_the_gate_passes_real_draft_decoding_and_fails_a_decoder_that_turns_images_wrongly():
    exact, draft, _ = check_tensors(RESNET18)
    assert judge(metrics_of(exact, draft)) == []
    mirrored = judge(metrics_of(exact, draft.flip(-1)))  # an orientation bug: most pixels move by tens of levels
    assert any("mean tensor change" in f for f in mirrored) and any("max tensor change" in f for f in mirrored)


def test_the_gate_fails_each_answer_check_with_its_number_and_bound():
    base = {"mean_levels": 0.2, "max_levels": 5.0, "relative_logit_error": 0.01, "confident_images": 10,
            "top1_agreement_confident": 1.0, "top5_agreement_confident": 1.0}
    assert judge(base) == []
    assert judge({**base, "relative_logit_error": 0.5}) == [
        f"logit error 0.500 of the spread > {DECODE_TOLERANCE.max_relative_logit_error:g}"]
    assert "top-1 agreement on confident images 90.0 %" in judge({**base, "top1_agreement_confident": 0.9})[0]
    assert "top-5 agreement on confident images 95.0 %" in judge({**base, "top5_agreement_confident": 0.95})[0]
    # no confident image (random weights): the answers are not counted, the tensor and the logits still are
    nan = float("nan")
    assert judge({**base, "confident_images": 0, "top1_agreement_confident": nan, "top5_agreement_confident": nan}) == []
    assert judge({**base, "confident_images": 0, "top1_agreement_confident": nan, "mean_levels": 9.0}) != []


def test_images_below_twice_the_floor_are_decoded_exactly_in_draft_mode():
    floor = draft_floor(RESNET18)
    for side in (floor, 2 * floor - 8):  # libjpeg's 1/2 would leave a side below the floor
        buffer = io.BytesIO()
        Image.effect_mandelbrot((side + 64, side), (-2, -1.5, 1, 1.5), 64).convert("RGB").save(buffer, "JPEG")
        data = buffer.getvalue()
        assert torch.equal(decode_image(data, floor), decode_image(data))


def test_the_handler_setting_may_only_turn_draft_off():
    assert HandlerConfig.from_dict({"decode": "exact"}).decode == "exact"
    with pytest.raises(ContractError, match="only be \"exact\""):
        HandlerConfig.from_dict({"decode": "draft"})


@pytest.mark.slow
def test_trained_lite0_export_records_a_passed_check_and_serves_draft(lite0_int8_export):
    manifest = lite0_int8_export["manifest"]
    check = manifest.decode_check
    assert check["passed"] and check["decode"] == "draft", check
    assert manifest.input.preprocessing.decode == "draft"
    assert check["metrics"]["confident_images"] > 0  # trained weights: top-1 agreement is counted
    assert check["metrics"]["mean_levels"] <= DECODE_TOLERANCE.max_mean_levels
    assert "decode check (" in lite0_int8_export["stdout"] and "-> serving draft" in lite0_int8_export["stdout"]


@pytest.mark.slow
def test_the_core_decodes_as_the_manifest_says_unless_the_setting_says_exact(lite0_int8_export):
    folder = lite0_int8_export["out"]
    contract = lite0_int8_export["manifest"].input.image_contract()
    data, _ = check_images(contract)[-1]  # a 1/4-scale phone photo
    draft_core = ImageCore.from_folder(folder)
    exact_core = ImageCore.from_folder(folder, settings={"decode": "exact"})
    assert draft_core.decode_mode().startswith("draft") and exact_core.decode_mode() == "exact"
    exact_row = preprocess(decode_upright(data), contract)
    draft_row = preprocess(decode_upright(data, draft_floor(contract)), contract)
    assert not torch.equal(exact_row, draft_row)  # the photo is large enough for draft to apply
    for core, row in ((draft_core, draft_row), (exact_core, exact_row)):
        probabilities = core.predict(row[None])[0]
        top = core.answer(data)["predictions"][0]
        # int8 logits can tie exactly (here missile and mosque, both 0.242072): any class holding the maximum
        assert float(probabilities[top["index"]]) == pytest.approx(float(probabilities.max()), abs=1e-6)
        assert top["probability"] == pytest.approx(float(probabilities.max()), abs=1e-6)
