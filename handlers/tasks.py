"""The request cores of whole-image tasks: a detector's and a segmenter's. They keep ImageCore's request
life (decode, preprocess, batch, predict, encode; every row's error with its row) and change its hooks.

Both send the whole upright image, resized by the archive's resize rule (the model's own transform then changes
nothing, and a 12 MP photo is not copied whole into the graph), and answer in the photo's own pixels.

  detection     {"detections": [{"box": [x1, y1, x2, y2], "label": "dog", "index": 18, "score": 0.93,
                 "mask": RLE (Mask R-CNN)}, ...], "image": {"width", "height"}, "model", "architecture", "artifact"};
                options score_threshold (at least the model's own) and max_detections (at most its cap)
  segmentation  {"classes": [{"label": "person", "index": 15, "share": 0.231, "mask": RLE}, ...] (the classes
                present, largest first), "image": {...}, "model", "architecture", "artifact"}; option masks:
                rle | png | none (png: one PNG of the class map, each pixel's value its class index, base64 in
                "class_map_png")

RLE is COCO's uncompressed run-length encoding of a binary mask at the photo's size: {"size": [height, width],
"counts": [zeros, ones, zeros, ...]} in column-major order, which pycocotools' frPyObjects and drawing tools read.
A batch of requests runs one image at a time: the exported graph takes one image, and images of different sizes
do not stack (docs/detection.md).
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image

from contract.records import DETECTION, SEGMENTATION, Manifest, ResizeRule
from handlers.core import HandlerSetupError, ImageCore, ImageRequest
from handlers.request_body import option
from handlers.request_error import RequestError
from runtime.images import resize_whole

MASK_THRESHOLD = 0.5  # torchvision's convention: a mask pixel belongs to the object above this probability
MASK_FORMATS = ("rle", "png", "none")


@dataclass(frozen=True)
class WholeImage:
    """A row of a whole-image core: the image as sent to the model, and the photo's own size to answer in."""

    tensor: torch.Tensor  # float32 (3, H', W') in [0, 1]
    height: int
    width: int


class WholeImageCore(ImageCore):
    @staticmethod
    def input_contract(manifest: Manifest) -> ResizeRule:
        if manifest.input.resize_rule is None:
            raise HandlerSetupError(f"{manifest.model.name} records no resize rule for its images; re-export it")
        return manifest.input.resize_rule

    def decode_floor(self, config) -> None:
        return None  # every pixel decoded: no decode check was made for these tasks

    def input_line(self) -> str:
        rule = self.contract
        return f"whole image, {f'fitted in {rule.fixed[0]}x{rule.fixed[1]}' if rule.fixed else f'shorter side {rule.min_side}, longer at most {rule.max_side}'}"

    def preprocess(self, image: Image.Image) -> WholeImage:
        return WholeImage(resize_whole(image, self.contract).to(self.device), image.height, image.width)

    @staticmethod
    def batch(rows: list[WholeImage]) -> list[WholeImage]:
        return rows  # one image at a time (see the module's doc)

    def predict(self, rows: list[WholeImage]) -> list:
        return [(self.backend(row.tensor[None]), row) for row in rows]

    def framed(self, answer: dict, row: WholeImage) -> dict:
        return {**answer, "image": {"width": row.width, "height": row.height}, **self.names()}

    def label(self, index: int) -> str:
        return self.labels.get(index, str(index))


class DetectorCore(WholeImageCore):
    TASK = DETECTION

    def request_options(self, request: ImageRequest) -> tuple[float, int]:
        """(score threshold, most boxes): the model's own unless the request asks for fewer boxes."""
        limits = self.manifest.limits
        threshold = _number(option(request, "score_threshold"), float, "score_threshold", limits.score_threshold)
        most = _number(option(request, "max_detections"), int, "max_detections", limits.max_detections)
        if not limits.score_threshold <= threshold <= 1:
            raise RequestError(400, f"score_threshold must be from the model's own {limits.score_threshold:g} to 1, "
                                    f"got {threshold:g}: the model keeps no box below its own")
        if not 1 <= most <= limits.max_detections:
            raise RequestError(400, f"max_detections must be from 1 to the model's cap {limits.max_detections}, got {most}")
        return threshold, most

    def encode_response(self, output, options: tuple[float, int]) -> dict:
        (boxes, labels, scores, *masks), row = output
        threshold, most = options
        keep = (scores >= threshold).nonzero().flatten()[:most]
        scale_x, scale_y = row.width / row.tensor.shape[-1], row.height / row.tensor.shape[-2]
        found = []
        for i in keep.tolist():
            x1, y1, x2, y2 = boxes[i].tolist()
            item = {"box": [round(x1 * scale_x, 2), round(y1 * scale_y, 2), round(x2 * scale_x, 2), round(y2 * scale_y, 2)],
                    "label": self.label(int(labels[i])), "index": int(labels[i]), "score": round(float(scores[i]), 6)}
            if masks:
                item["mask"] = rle(photo_sized(masks[0][i, 0], row) > MASK_THRESHOLD)
            found.append(item)
        return self.framed({"detections": found}, row)


class SegmenterCore(WholeImageCore):
    TASK = SEGMENTATION

    def request_options(self, request: ImageRequest) -> str:
        masks = str(option(request, "masks") or MASK_FORMATS[0]).lower()
        if masks not in MASK_FORMATS:
            raise RequestError(400, f"masks must be one of {', '.join(MASK_FORMATS)}, got {masks!r}")
        return masks

    def encode_response(self, output, masks: str) -> dict:
        logits, row = output
        # max(0)'s indices are argmax(0)'s (the first of a tie), computed several times faster over the class axis
        class_map = photo_sized(logits[0].max(0).indices.to(torch.uint8).float(), row, mode="nearest").to(torch.uint8)
        counts = torch.bincount(class_map.flatten(), minlength=logits.shape[1])  # linear, where unique sorts
        present = [(index, count) for index, count in enumerate(counts.tolist()) if count]
        masks_of = rle_per_class(class_map) if masks == "rle" else {}
        classes = []
        for index, count in sorted(present, key=lambda pair: -pair[1]):
            item = {"label": self.label(index), "index": index, "share": round(count / class_map.numel(), 6)}
            if masks == "rle":
                item["mask"] = masks_of[index]
            classes.append(item)
        answer = {"classes": classes}
        if masks == "png":
            answer["class_map_png"] = png_base64(class_map)
        return self.framed(answer, row)


CORES = {core.TASK: core for core in (ImageCore, DetectorCore, SegmenterCore)}


def open_core(folder: str | Path, device: str = "cpu", settings: dict | None = None, measure: bool = True,
              **options) -> ImageCore:
    """The core of the archive's task (its manifest says which), set up as from_folder does, serving the first
    of its gated candidates within a margin of the fastest on this machine (measure: runtime/form_choice.py): what
    every engine opens, so a detector's archive gets the detector's handler and never a classifier's."""
    return CORES[Manifest.read(folder).task].from_folder(folder, device, settings, measure=measure, **options)


def photo_sized(plane: torch.Tensor, row: WholeImage, mode: str = "bilinear") -> torch.Tensor:
    """A (H', W') plane at the model's size -> the photo's (height, width)."""
    if plane.shape == (row.height, row.width):
        return plane
    options = {"align_corners": False} if mode == "bilinear" else {}
    return F.interpolate(plane[None, None].float(), size=(row.height, row.width), mode=mode, **options)[0, 0]


def rle(mask: torch.Tensor) -> dict:
    """COCO's uncompressed RLE of a binary (H, W) mask: run lengths in column-major order, starting with zeros."""
    flat = mask.t().reshape(-1).to(torch.uint8)
    changes = (flat[1:] != flat[:-1]).nonzero().flatten() + 1
    bounds = torch.cat([torch.tensor([0]), changes, torch.tensor([flat.numel()])])
    counts = (bounds[1:] - bounds[:-1]).tolist()
    if flat.numel() and flat[0] == 1:
        counts = [0] + counts
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": counts}


def rle_per_class(class_map: torch.Tensor) -> dict[int, dict]:
    """rle(class_map == c) for every class c present, from one pass over the map: its runs in column-major order
    (value, start, length) give each class's runs of ones, and the gaps between them its runs of zeros. A 12 MP
    map is read once, not once per class."""
    height, width = int(class_map.shape[0]), int(class_map.shape[1])
    flat = class_map.t().reshape(-1)
    total = flat.numel()
    starts = torch.cat([torch.tensor([0]), (flat[1:] != flat[:-1]).nonzero().flatten() + 1])
    ends = torch.cat([starts[1:], torch.tensor([total])])
    values = flat[starts]
    found = {}
    for index in values.unique().tolist():
        mine = values == index
        first, last = starts[mine], ends[mine]
        zeros = torch.cat([first[:1], first[1:] - last[:-1]])  # before each run of ones: the gap since the last
        counts = torch.stack([zeros, last - first], dim=1).flatten().tolist()
        if int(last[-1]) < total:
            counts.append(total - int(last[-1]))
        found[index] = {"size": [height, width], "counts": counts}
    return found


def png_base64(class_map: torch.Tensor) -> str:
    buffer = io.BytesIO()
    Image.fromarray(class_map.cpu().numpy(), mode="L").save(buffer, format="PNG", optimize=True)
    return base64.b64encode(buffer.getvalue()).decode()


def _number(value, kind: type, name: str, default):
    if value is None:
        return default
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", "replace")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise RequestError(400, f"{name} must be a number, got {value!r}") from None
