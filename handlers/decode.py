"""Turn one TorchServe request row into an RGB image tensor, or a RequestError saying what was wrong.

Accepted bodies: a raw image (JPEG, PNG, WebP, BMP, GIF first frame, TIFF), JSON {"data": "<base64>"},
or a multipart form with the image as a file field. Decoding is PIL's (with torchvision for tensor
resizing); EXIF orientation is honoured; every mode (grayscale, RGBA, palette, CMYK, 16-bit) becomes RGB.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF  # the functions weights.transforms() itself calls

from models.errors import VisionExportError

# Limits checked from the header before decoding, so a small file cannot expand into gigabytes.
MAX_PIXELS = 40_000_000  # 40 megapixels: any camera photo; a decompression bomb is far larger
MAX_SIDE = 12_000
MIN_SIDE = 8
ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF", "MPO")
BODY_KEYS = ("data", "body", "file", "image")  # raw/JSON bodies arrive as data/body; forms by field name
OPTION_KEYS = ("topk",)  # form fields that are options, never the image
MAX_TOPK = 100



class RequestError(VisionExportError):
    """A bad request: becomes {"code": code, "error": message} with that HTTP status for this row only."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def as_response(self) -> dict:
        return {"code": self.code, "error": self.message}


def image_bytes(row: dict) -> bytes:
    """Find the image in a request row, whatever the content type it came with."""
    if not isinstance(row, dict):
        raise RequestError(400, "empty request: send an image body")
    value = next((row[k] for k in BODY_KEYS if row.get(k) is not None), None)
    if value is None:  # multipart forms use the client's field name; the file is the largest field
        files = [v for k, v in row.items() if k not in OPTION_KEYS and isinstance(v, (bytes, bytearray)) and v]
        value = max(files, key=len, default=None)
    if value is None:
        raise RequestError(400, "no image in the request: send the image as the body "
                                "(Content-Type: image/jpeg), as JSON {\"data\": base64}, or as a form file")
    if isinstance(value, (bytes, bytearray)) and value[:1] == b"{":
        value = _json_body(bytes(value))
    if isinstance(value, dict):
        value = value.get("data") or value.get("image")
        if not isinstance(value, str):
            raise RequestError(400, "JSON body needs a \"data\" field holding the base64-encoded image")
    if isinstance(value, str):
        value = _base64(value)
    if not value:
        raise RequestError(400, "empty image body")
    return bytes(value)


def requested_topk(row: dict, header: str | None, default: int) -> int:
    """k from a form field or JSON field "topk", or the X-TopK header (TorchServe drops query strings)."""
    value = row.get("topk") if isinstance(row, dict) else None
    body = next((row.get(k) for k in ("body", "data") if row.get(k) is not None), None) if isinstance(row, dict) else None
    if isinstance(body, (bytes, bytearray)) and body[:1] == b"{":
        body = _json_body(bytes(body))
    if value is None and isinstance(body, dict):
        value = body.get("topk")
    if value is None:
        value = header
    if value is None:
        return default
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", "replace")
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise RequestError(400, f"topk must be an integer from 1 to {MAX_TOPK}, got {value!r}") from None
    if not 1 <= k <= MAX_TOPK:
        raise RequestError(400, f"topk must be from 1 to {MAX_TOPK}, got {k}")
    return k


def _json_body(raw: bytes) -> dict:
    try:
        parsed = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RequestError(400, f"body looks like JSON but does not parse: {error}") from None
    if not isinstance(parsed, dict):
        raise RequestError(400, "JSON body must be an object with a \"data\" field")
    return parsed


def _base64(text: str) -> bytes:
    if text.startswith("data:") and "," in text:  # data URLs: data:image/png;base64,....
        text = text.split(",", 1)[1]
    text = "".join(text.split())  # line-wrapped base64 (GNU base64, encodebytes) is still base64
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(400, "\"data\" is not valid base64") from None


def decode_image(data: bytes) -> torch.Tensor:
    """Bytes -> uint8 tensor (3, H, W), RGB, upright."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            _check_header(image)
            image.seek(0)  # animated GIF/WebP: the first frame
            image.load()
    except RequestError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise RequestError(413, f"image too large: more than {MAX_PIXELS:,} pixels; downscale it before sending") from None
    except UnidentifiedImageError:
        raise RequestError(415, "body is not an image PIL can read; send JPEG, PNG, WebP, BMP or GIF") from None
    except (OSError, ValueError, SyntaxError) as error:
        raise RequestError(400, f"image is corrupt or truncated: {error}") from None
    return torch.from_numpy(np.array(to_rgb(ImageOps.exif_transpose(image)))).permute(2, 0, 1).contiguous()


def _check_header(image: Image.Image) -> None:
    if image.format not in ACCEPTED_FORMATS:
        raise RequestError(415, f"{image.format} images are not accepted; send JPEG, PNG, WebP, BMP or GIF")
    width, height = image.size
    if width * height > MAX_PIXELS or max(width, height) > MAX_SIDE:
        raise RequestError(413, f"image is {width}x{height}: the limit is {MAX_PIXELS:,} pixels and "
                                f"{MAX_SIDE} per side; downscale it before sending")
    if min(width, height) < MIN_SIDE:
        raise RequestError(400, f"image is {width}x{height}: at least {MIN_SIDE} pixels per side are needed")


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode to 8-bit RGB; transparency is composited on white (what a viewer shows)."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):  # 16/32-bit grayscale: scale to 8 bits, not clip
        array = np.asarray(image, dtype=np.float64)
        peak = 65535.0 if image.mode.startswith("I;16") or array.max() > 255 else 255.0
        image = Image.fromarray(np.clip(array / peak * 255.0 + 0.5, 0, 255).astype(np.uint8), mode="L")
    if image.mode == "F":  # float TIFFs: [0, 1] data is scaled, anything else is taken as 0..255
        array = np.asarray(image, dtype=np.float64)
        scale = 255.0 if array.size and array.max() <= 1.0 else 1.0
        image = Image.fromarray(np.clip(array * scale + 0.5, 0, 255).astype(np.uint8), mode="L")
    if image.mode in ("P", "RGB", "L") and "transparency" in image.info:  # palette or colour-key transparency
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


@dataclass(frozen=True)
class ImageContract:
    """The manifest's `input.preprocessing`: what the weights were evaluated with."""

    resize: int
    crop: tuple[int, int]
    interpolation: str = "bilinear"
    antialias: bool = True

    @classmethod
    def from_manifest(cls, record: dict | None) -> "ImageContract":
        if not record:
            raise ValueError("the manifest has no input.preprocessing: this model takes no RGB image input")
        return cls(int(record["resize"]), tuple(int(v) for v in record["crop"]), record.get("interpolation", "bilinear"),
                   bool(record.get("antialias", True)))


def preprocess(image: torch.Tensor, contract: ImageContract) -> torch.Tensor:
    """uint8 (3, H, W) -> float32 (3, crop) in [0, 1]: the same calls, in the same order, as torchvision's
    ImageClassification preset behind weights.transforms() (resize with its interpolation and antialias,
    centre crop, to float), so the served tensor equals the evaluated one; normalisation is in the graph."""
    image = TF.resize(image, [contract.resize], interpolation=InterpolationMode(contract.interpolation),
                      antialias=contract.antialias)
    image = TF.center_crop(image, list(contract.crop))
    return TF.convert_image_dtype(image, torch.float)
