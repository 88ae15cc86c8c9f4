"""Each probe image with what each form answered drawn on it: a detector's boxes with labels and scores (and masks),
a segmenter's class map overlaid, a classifier's top 5 as bars. Forms that agree with eager share eager's picture;
a form that answers something else gets its own beside it, so a trace's frozen answer is seen on the photo where
it goes wrong. A form the export refused (at parity) is still run here when it loaded: what it would have answered
is the lesson. Pictures are JPEG data URIs for report.html, which needs no network."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field

import torch
from PIL import Image, ImageDraw

from contract.records import CLASSIFICATION, DETECTION
from export.checks.parity import compare_outputs
from export.checks.trace_vs_script import MATCHES, REJECTED, SILENTLY_WRONG, TraceVsScript
from export.forms.tolerances import SetTolerance, Tolerance
from runtime.base import ArtifactRunError

SHOWN_SIDE = 360  # px of a picture's longer side in the report
SMALLEST_SIDE = 96  # a tiny probe is enlarged (nearest neighbour) to at least this
TOP_K = 5
MASK_ALPHA = 0.5
PALETTE = (
    (230, 25, 75),
    (60, 180, 75),
    (255, 225, 25),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
    (240, 50, 230),
    (210, 245, 60),
    (250, 190, 212),
    (0, 128, 128),
    (220, 190, 255),
    (170, 110, 40),
    (255, 250, 200),
    (128, 0, 0),
    (170, 255, 195),
    (128, 128, 0),
    (255, 215, 180),
    (0, 0, 128),
    (128, 128, 128),
    (255, 255, 255),
)


@dataclass
class Answer:
    """One picture: who answered it (eager and the forms that agree, or one form), drawn, with its legend."""

    forms: list[str]
    picture: str  # data:image/jpeg;base64,...
    summary: str  # "3 boxes", "top-1 tabby (0.41)", "2 classes"
    bars: list[tuple[str, float]] = field(default_factory=list)  # classifier: top 5 (label, probability)
    legend: list[tuple[str, str, float]] = field(default_factory=list)  # segmenter: (label, #rrggbb, share)
    agrees: bool = True  # False: this form's answer differs from eager's
    refused: str = ""  # the form was refused by the export (why); drawn for what it would have answered
    detail: str = ""  # how it differs, as the comparison says


@dataclass
class ProbePictures:
    probe: str
    shape: list[int]
    answers: list[Answer]
    rejected: dict[str, str] = field(default_factory=dict)  # form -> the runtime's error

    @property
    def disagree(self) -> bool:
        return any(not a.agrees for a in self.answers)


@dataclass
class Drawer:
    """What a picture needs to know about the model: its task and the names of its classes."""

    task: str
    labels: list[str] | None

    def name(self, index: int) -> str:
        return self.labels[index] if self.labels and 0 <= index < len(self.labels) else str(index)


def kept_answer(task: str):
    """What trace vs script keeps of each answer for the pictures: a detector's boxes whole, a classifier's first
    row of scores, a segmenter's first class map (not its logits: a 21 x H x W float map per form and probe)."""

    def keep(output):
        if task == DETECTION:
            return tuple(t.detach().cpu() for t in output)
        logits = (output[0] if isinstance(output, tuple) else output)[:1].detach().float().cpu()
        return logits if task == CLASSIFICATION else logits.argmax(1).to(torch.uint8)

    return keep


def draw_probes(
    drawer: Drawer,
    paths: TraceVsScript,
    probes: dict[str, torch.Tensor],
    refused: dict,
    tolerances: dict[str, Tolerance | SetTolerance],
    why_refused: dict[str, str],
) -> list[ProbePictures]:
    """Every image probe eager answered, with each form's answer as trace vs script kept it, and the answers of the
    forms refused after they were opened (refused: kind -> backend), run here."""
    keep = kept_answer(drawer.task)
    found = []
    for probe in paths.probes:
        tensor = probes[probe]
        if tensor.dim() != 4 or tensor.shape[1] not in (1, 3) or probe not in paths.eager_answers:
            continue  # not an image, or nothing kept: nothing to draw
        answers = {row.artifact: row.on(probe) for row in paths.rows}
        reference, image = paths.eager_answers[probe], to_image(tensor)
        agreeing = ["eager"] + [k for k, r in answers.items() if r.status == MATCHES]
        differing = [
            _differing(drawer, image, k, r.answer, r.detail or "")
            for k, r in answers.items()
            if r.status == SILENTLY_WRONG
        ]
        rejected = {k: (r.error or "").splitlines()[0] for k, r in answers.items() if r.status == REJECTED}
        for kind, backend in refused.items():
            try:
                output = keep(backend(tensor))
            except ArtifactRunError as error:
                rejected[kind] = str(error).splitlines()[0][:200]
                continue
            if _same(reference, output, tolerances[kind]):
                agreeing.append(kind)
            else:
                differing.append(_differing(drawer, image, kind, output, "", why_refused.get(kind, "")))
        first = draw_answer(drawer, image, reference, agreeing)
        found.append(ProbePictures(probe, list(tensor.shape), [first, *differing], rejected))
    return found


def _differing(drawer: Drawer, image, kind: str, output, detail: str, refused: str = "") -> Answer:
    answer = draw_answer(drawer, image, output, [kind], agrees=False)
    answer.detail, answer.refused = detail, refused
    return answer


def _same(reference, output, tolerance) -> bool:
    """A refused form's answer against eager's, on what was kept of both."""
    if isinstance(reference, tuple):
        return compare_outputs(reference, output, tolerance)[1]
    if reference.dtype == torch.uint8:
        return bool(torch.equal(reference, output))
    return compare_outputs(reference, output, tolerance)[1]


def to_image(tensor: torch.Tensor) -> Image.Image:
    """The first image of a batch in [0, 1] as RGB."""
    array = (tensor[0].detach().float().clamp(0, 1) * 255).round().byte()
    if array.shape[0] == 1:
        array = array.expand(3, -1, -1)
    return Image.fromarray(array.permute(1, 2, 0).contiguous().numpy(), "RGB")


def draw_answer(drawer: Drawer, image: Image.Image, output, forms: list[str], agrees: bool = True) -> Answer:
    scale = _scale(image.size)
    shown = image.resize(
        (round(image.width * scale), round(image.height * scale)),
        Image.Resampling.NEAREST if scale > 1 else Image.Resampling.BILINEAR,
    )
    if drawer.task == DETECTION:
        summary = _draw_boxes(drawer, shown, output, scale)
        return Answer(forms, data_uri(shown), summary, agrees=agrees)
    if drawer.task == CLASSIFICATION:
        bars = top_k(drawer, output)
        return Answer(forms, data_uri(shown), f"top-1 {bars[0][0]} ({bars[0][1]:.3g})", bars=bars, agrees=agrees)
    legend = _overlay_classes(drawer, shown, output)
    return Answer(forms, data_uri(shown), f"{len(legend)} classes", legend=legend, agrees=agrees)


def _scale(size: tuple[int, int]) -> float:
    longer, shorter = max(size), min(size)
    if shorter * SHOWN_SIDE / longer < SMALLEST_SIDE:
        return SMALLEST_SIDE / shorter
    return SHOWN_SIDE / longer


def _draw_boxes(drawer: Drawer, shown: Image.Image, output, scale: float) -> str:
    boxes, labels, scores = (t.detach().float().cpu() for t in output[:3])
    if len(output) > 3:  # instance masks: N x 1 x H x W probabilities, overlaid before the boxes
        _overlay_masks(shown, output[3].detach().float().cpu(), scale)
    pen = ImageDraw.Draw(shown)
    for index, (box, label, score) in enumerate(zip(boxes.tolist(), labels.tolist(), scores.tolist())):
        colour = PALETTE[index % len(PALETTE)]
        left, top, right, bottom = (v * scale for v in box)
        pen.rectangle((left, top, right, bottom), outline=colour, width=2)
        pen.text((left + 2, max(0, top - 11)), f"{drawer.name(int(label))} {score:.2f}", fill=colour)
    return f"{len(boxes)} box{'es' if len(boxes) != 1 else ''}"


def _overlay_masks(shown: Image.Image, masks: torch.Tensor, scale: float) -> None:
    for index, mask in enumerate(masks[:, 0] > 0.5):
        area = Image.fromarray((mask.numpy() * int(255 * MASK_ALPHA)).astype("uint8"), "L").resize(shown.size)
        shown.paste(Image.new("RGB", shown.size, PALETTE[index % len(PALETTE)]), mask=area)


def top_k(drawer: Drawer, logits) -> list[tuple[str, float]]:
    probabilities = torch.softmax(logits[0].detach().double().flatten(), 0)
    values, indices = probabilities.topk(min(TOP_K, probabilities.numel()))
    return [(drawer.name(int(i)), round(float(v), 4)) for v, i in zip(values, indices)]


def _overlay_classes(drawer: Drawer, shown: Image.Image, class_map) -> list[tuple[str, str, float]]:
    classes = class_map[0].long()
    counts = torch.bincount(classes.flatten())
    legend = []
    for index in counts.nonzero().flatten().tolist():
        colour = PALETTE[index % len(PALETTE)]
        legend.append((drawer.name(index), "#%02x%02x%02x" % colour, round(counts[index].item() / classes.numel(), 4)))
        if index == 0:
            continue  # the background stays as it is
        area = Image.fromarray(((classes == index).numpy() * int(255 * MASK_ALPHA)).astype("uint8"), "L")
        shown.paste(Image.new("RGB", shown.size, colour), mask=area.resize(shown.size, Image.Resampling.NEAREST))
    return sorted(legend, key=lambda item: -item[2])


def data_uri(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()
