"""JPEG decoding on the GPU: a batch of request bodies -> the model's input rows on that GPU, with nvJPEG
(`torchvision.io.decode_jpeg(list, device="cuda")`) and the resize and crop run there too.

On a GPU the model's own time is small beside CPU decoding, which then is most of a request's cost (the
request path, measured: docs/results/2026-11-24-serving-bench-photo-sizes/analysis.md); nvJPEG moves the Huffman decoding into one batched call and the
IDCT, colour conversion and resize onto the device.
What stays on the CPU, per body: the header checks of runtime/images.py (format, size limits, decompression
bombs: never handed to a decoder) and the EXIF orientation tag (torchvision applies it only on the CPU; the
turn is done here, on the device, with the same tensor views as runtime.images.upright).
Falls back to the caller's CPU path (handlers.core: runtime.images.decode_upright, which refuses each bad body
with its ImageError):
  - bodies that are not baseline-decodable JPEGs here (PNG, WebP, CMYK JPEG, MPO, anything the header check
    refuses): each on its own;
  - a batch nvJPEG rejects as a whole (torchvision returns no partial results): that batch, logged once with
    the reason;
  - a torchvision without its GPU image ops: everything, logged once at construction.
nvJPEG's IDCT and chroma upsampling are not libjpeg's, so its pixels differ from the exact decode, as draft
decoding's do: the core uses it only where the export's decode check allowed draft, and the GPU check
(measure/gpu/steps.py; docs/benchmarks.md) measures its speed and its deviation from the exact decode.
torchvision 0.29 marks its image decoders deprecated in favour of TorchCodec; its warning is captured here.
"""

from __future__ import annotations

import io
import logging
import warnings
from contextlib import nullcontext
from typing import Callable, ContextManager

import torch
from PIL import Image

from contract.records import ImageContract
from runtime.images import check_header, orientation, preprocess, upright

logger = logging.getLogger(__name__)

NVJPEG_MODES = ("RGB", "L")  # what nvJPEG decodes to RGB like libjpeg does; CMYK/YCCK go to the CPU


class NvjpegDecoder:
    """Bodies -> float32 rows (3, crop) on `device`, or what the CPU path gives a bad body (its error)."""

    def __init__(self, device: str, contract: ImageContract):
        self.device = torch.device(device)
        self.contract = contract
        self.available = self.device.type == "cuda" and torch.cuda.is_available() and _has_gpu_image_ops()
        if not self.available:
            logger.warning("nvJPEG decoding is not available on %s (needs CUDA and torchvision's GPU image ops): "
                           "decoding on the CPU", device)

    def __call__(self, bodies: list[bytes], on_cpu: Callable[[bytes], object],
                 measure: Callable[[str], ContextManager[object]] | None = None) -> list[object]:
        """Rows in the bodies' order; `on_cpu(body)` gives the row (or the error) of a body nvJPEG does not
        take, on the CPU; `measure(stage)` times the decode and preprocess stages."""
        measure = measure or (lambda stage: nullcontext())
        rows: list[object] = [None] * len(bodies)
        tags = {i: nvjpeg_orientation(body) for i, body in enumerate(bodies)} if self.available else {}
        on_gpu = {i: tag for i, tag in tags.items() if tag is not None}  # index -> EXIF orientation
        if on_gpu:
            self._decode_on_gpu(bodies, on_gpu, rows, measure)
        for index, body in enumerate(bodies):
            if rows[index] is None:
                rows[index] = on_cpu(body)
        return rows

    def _decode_on_gpu(self, bodies: list[bytes], indices: dict[int, int], rows: list[object],
                       measure: Callable[[str], ContextManager[object]]) -> None:
        encoded = [torch.frombuffer(bytearray(bodies[i]), dtype=torch.uint8) for i in indices]
        try:
            with measure("decode"), warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # reported in the module docstring
                from torchvision.io import ImageReadMode, decode_jpeg
                images = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError as error:  # nvJPEG refused one body: no partial results, the CPU decodes this batch
            logger.warning("nvJPEG rejected a batch of %d (%s): decoding it on the CPU", len(indices), error)
            return
        with measure("preprocess"):
            for (index, tag), image in zip(indices.items(), images):
                rows[index] = preprocess(upright(image.permute(1, 2, 0), tag).permute(2, 0, 1), self.contract)


def nvjpeg_orientation(body: bytes) -> int | None:
    """The body's EXIF orientation when nvJPEG should decode it (a JPEG within the limits, RGB or greyscale),
    else None: the CPU path decodes it and, if it is bad, says why. Reads the header only."""
    try:
        image = Image.open(io.BytesIO(body))
        check_header(image)
        if image.format != "JPEG" or image.mode not in NVJPEG_MODES:
            return None
        return orientation(image)
    except Exception:  # noqa: BLE001 - not for nvJPEG; the CPU decoder turns it into the request's error
        return None


def _has_gpu_image_ops() -> bool:
    try:
        return hasattr(torch.ops.image, "decode_jpegs_cuda")
    except (AttributeError, RuntimeError):  # torchvision's image extension not loaded
        return False
