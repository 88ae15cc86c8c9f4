"""Request bodies: find the image and the options in one request row (TorchServe's, or the KServe adapter's),
or a RequestError saying what was wrong.

Accepted bodies: a raw image (JPEG, PNG, WebP, BMP, GIF first frame, TIFF), JSON {"data": "<base64>"},
or a multipart form with the image as a file field. Turning the bytes into the model's input is
runtime.images' job (decode_upright, preprocess).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Callable

from handlers.request_error import RequestError

BODY_KEYS = ("data", "body", "file", "image")  # raw/JSON bodies arrive as data/body; forms by field name
@dataclass(frozen=True)
class ImageRequest:
    """One request row as the core sees it: the image's bytes, the top-k it asked for (None: the default) and the
    task's other options by name (a detector's score_threshold, max_detections; a segmenter's masks), unchecked."""

    image: bytes
    topk: int | None = None
    options: dict = field(default_factory=dict)


TASK_OPTIONS = ("score_threshold", "max_detections", "masks")  # read here, checked by the task's core
OPTION_KEYS = ("topk",) + TASK_OPTIONS  # form fields that are options, never the image
MAX_TOPK = 100
TOPK_HEADER = "X-TopK"  # TorchServe drops query strings: options also come as headers


def option_header(name: str) -> str:
    """score_threshold -> X-Score-Threshold."""
    return "X-" + "-".join(part.capitalize() for part in name.split("_"))


def read_request(row: dict, header: Callable[[str], str | None]):
    """One engine's request row (TorchServe's shape) as the core's ImageRequest: the image, topk and the task's
    options from form fields, JSON fields or headers (`header(name)` reads one; None when absent)."""
    options = {name: value for name in TASK_OPTIONS
               if (value := _field(row, name) if _field(row, name) is not None else header(option_header(name)))
               is not None}
    return ImageRequest(image_bytes(row), requested_topk(row, header(TOPK_HEADER), None), options)


def _field(row: dict, name: str):
    """A form field or a JSON body's field."""
    if not isinstance(row, dict):
        return None
    if row.get(name) is not None:
        return row[name]
    body = next((row.get(k) for k in ("body", "data") if row.get(k) is not None), None)
    if isinstance(body, (bytes, bytearray)) and body[:1] == b"{":
        body = _json_body(bytes(body))
    return body.get(name) if isinstance(body, dict) else None


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
    if not isinstance(value, (bytes, bytearray, dict, str)):  # TorchServe parsed a JSON array, number, ...
        raise RequestError(400, f"JSON body must be an object with a \"data\" field holding the base64-encoded "
                                f"image, got a JSON {type(value).__name__}")
    if isinstance(value, dict):
        value = value.get("data") or value.get("image")
        if not isinstance(value, str):
            raise RequestError(400, "JSON body needs a \"data\" field holding the base64-encoded image")
        value = from_base64(value)
    elif isinstance(value, str):  # a text body (TorchServe decodes text/* content types): base64, or not an image
        try:
            value = from_base64(value)
        except RequestError:
            raise RequestError(415, "the body is text, neither an image nor base64: send the image bytes with "
                                    "Content-Type image/jpeg, or JSON {\"data\": base64}") from None
    if not value:
        raise RequestError(400, "empty image body")
    return bytes(value)


def requested_topk(row: dict, header: str | None, default: int | None) -> int | None:
    """k from a form field or JSON field "topk", or the X-TopK header (TorchServe drops query strings);
    `default` when the request names none."""
    value = _field(row, "topk")
    if value is None:
        value = header
    if value is None:
        return default
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", "replace")
    return checked_topk(value)


def checked_topk(value) -> int:
    """k as an integer from 1 to MAX_TOPK, or a 400 saying what was sent."""
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


def from_base64(text: str) -> bytes:
    """base64 text (a data: URL, line-wrapped) -> bytes, or a 400 saying it is not base64."""
    if text.startswith("data:") and "," in text:  # data URLs: data:image/png;base64,....
        text = text.split(",", 1)[1]
    text = "".join(text.split())  # line-wrapped base64 (GNU base64, encodebytes) is still base64
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(400, "\"data\" is not valid base64") from None
