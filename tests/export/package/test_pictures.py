"""The pictures report.html draws, on small answers made here: a detector's boxes where its answer puts them, a segmenter's class map overlaid with a legend of the classes present and their shares, a
classifier's top 5, and a tiny probe enlarged so that it can be seen."""

from __future__ import annotations

import base64
import io

import torch
from PIL import Image

from contract.records import CLASSIFICATION, DETECTION, SEGMENTATION
from export.package.pictures import PALETTE, SHOWN_SIDE, SMALLEST_SIDE, Drawer, draw_answer, kept_answer, to_image

GREY = torch.full((1, 3, 120, 160), 0.5)


def decoded(answer) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(answer.picture.split(",", 1)[1]))).convert("RGB")


def test_a_box_is_drawn_where_the_answer_puts_it_scaled_to_the_picture():
    boxes = torch.tensor([[20.0, 30.0, 100.0, 90.0]])
    output = (boxes, torch.tensor([1]), torch.tensor([0.9]))
    answer = draw_answer(Drawer(DETECTION, ["background", "face"]), to_image(GREY), output, ["eager"])
    picture, scale = decoded(answer), SHOWN_SIDE / 160
    assert answer.summary == "1 box" and picture.size == (SHOWN_SIDE, round(120 * scale))
    left, middle = round(20 * scale), round(60 * scale)
    edge, inside = picture.getpixel((left, middle)), picture.getpixel((left + 20, middle))
    assert PALETTE[0][0] > PALETTE[0][1] + 150 and edge[0] > edge[1] + 60  # the first box's red (JPEG softens it)
    assert sum(abs(a - 128) for a in inside) < 30


def test_a_segmenters_classes_are_overlaid_with_their_shares():
    logits = torch.zeros(1, 21, 120, 160)
    logits[0, 0] = 1.0
    logits[0, 8, :, :40] = 2.0  # a quarter of the photo is class 8
    class_map = kept_answer(SEGMENTATION)(logits)
    assert class_map.dtype == torch.uint8 and class_map.shape == (1, 120, 160)
    answer = draw_answer(Drawer(SEGMENTATION, [f"class {i}" for i in range(21)]), to_image(GREY), class_map, ["eager"])
    assert [(label, share) for label, _, share in answer.legend] == [("class 0", 0.75), ("class 8", 0.25)]
    picture = decoded(answer)
    assert picture.getpixel((10, 100)) != picture.getpixel((300, 100))  # overlaid where class 8 is, not elsewhere


def test_a_classifiers_top_five_and_a_tiny_probe_enlarged():
    logits = torch.arange(10, dtype=torch.float32)[None]
    tiny = torch.rand(1, 3, 10, 10)
    answer = draw_answer(Drawer(CLASSIFICATION, None), to_image(tiny), kept_answer(CLASSIFICATION)(logits), ["eager"])
    assert [label for label, _ in answer.bars] == ["9", "8", "7", "6", "5"]
    assert decoded(answer).size == (SHOWN_SIDE, SHOWN_SIDE)  # enlarged pixel by pixel
    thin = draw_answer(Drawer(CLASSIFICATION, None), to_image(torch.rand(1, 3, 10, 400)), logits, ["eager"])
    assert decoded(thin).size == (400 * SMALLEST_SIDE // 10, SMALLEST_SIDE)  # never thinner than SMALLEST_SIDE
