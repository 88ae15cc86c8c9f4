"""Request bodies: find the image and the options in one request (handlers/request.py's ImageRequest, whichever
engine built it), or a RequestError saying what was wrong.

Accepted bodies: a raw image (JPEG, PNG, WebP, BMP, GIF first frame, TIFF), JSON {"data": "<base64>"},
or a multipart form with the image as a file field. Options (topk, a task's) come from a form's or a JSON
object's fields, else from headers (X-TopK, X-Score-Threshold: TorchServe drops query strings). Turning the bytes
into the model's input is runtime.images' job (decode_upright, preprocess).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from handlers.request import ImageRequest
from handlers.request_error import RequestError

BODY_KEYS = ("data", "body", "file", "image")  # a form's image field, by the names clients give it
TASK_OPTIONS = ("score_threshold", "max_detections", "masks")  # read here, checked by the task's core
OPTION_KEYS = ("topk",) + TASK_OPTIONS  # form fields that are options, never the image
MAX_TOPK = 100
TOPK_HEADER = "X-TopK"  # TorchServe drops query strings: options also come as headers
NO_IMAGE = ("send the image as the body (Content-Type: image/jpeg), as JSON {\"data\": base64}, "
            "or as a form file")


def option_header(name: str) -> str:
    """score_threshold -> X-Score-Threshold."""
    return "X-" + "-".join(part.capitalize() for part in name.split("_"))


def option(request: ImageRequest, name: str) -> Any:
    """An option by name: a form's or JSON object's field, else its header (None when the request names none)."""
    value = request.fields.get(name)
    if value is None and request.body and (request.is_json or request.body[:1] == b"{"):
        parsed = _json_value(request.body)
        value = parsed.get(name) if isinstance(parsed, dict) else None
    if value is None:
        value = request.header(TOPK_HEADER if name == "topk" else option_header(name))
    return value


def image_of(request: ImageRequest) -> bytes:
    """The image in the request, whatever the content type it came with."""
    value = _image_value(request)
    if isinstance(value, (bytes, bytearray)) and value[:1] == b"{":
        value = _json_value(bytes(value))
    if not isinstance(value, (bytes, bytearray, dict, str)):  # a JSON array, number, ...
        raise RequestError(400, f"JSON body must be an object with a \"data\" field holding the base64-encoded "
                                f"image, got a JSON {type(value).__name__}")
    if isinstance(value, dict):
        value = value.get("data") or value.get("image")
        if not isinstance(value, str):
            raise RequestError(400, "JSON body needs a \"data\" field holding the base64-encoded image")
        value = from_base64(value)
    elif isinstance(value, str):  # a text body: base64, or not an image
        try:
            value = from_base64(value)
        except RequestError:
            raise RequestError(415, "the body is text, neither an image nor base64: send the image bytes with "
                                    "Content-Type image/jpeg, or JSON {\"data\": base64}") from None
    if not value:
        raise RequestError(400, "empty image body")
    return bytes(value)


def _image_value(request: ImageRequest):
    """The body (JSON parsed, text decoded), the JSON object the engine parsed, or a form's image field."""
    if request.body:
        if request.is_json:
            return _json_value(request.body)
        if request.content_type.startswith("text/"):
            return request.body.decode("utf-8", "replace")
        return request.body
    if request.is_json:
        return dict(request.fields)
    fields = request.fields
    value = next((fields[k] for k in BODY_KEYS if fields.get(k) is not None), None)
    if value is None:  # multipart forms use the client's field name; the file is the largest field
        files = [v for k, v in fields.items() if k not in OPTION_KEYS and isinstance(v, (bytes, bytearray)) and v]
        value = max(files, key=len, default=None)
    if value is None:
        raise RequestError(400, f"{'no image in the request' if fields else 'empty request'}: {NO_IMAGE}")
    return value


def requested_topk(request: ImageRequest, default: int | None = None) -> int | None:
    """k from a form field or JSON field "topk", or the X-TopK header; `default` when the request names none."""
    value = option(request, "topk")
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


def _json_value(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RequestError(400, f"body looks like JSON but does not parse: {error}") from None


def from_base64(text: str) -> bytes:
    """base64 text (a data: URL, line-wrapped) -> bytes, or a 400 saying it is not base64."""
    if text.startswith("data:") and "," in text:  # data URLs: data:image/png;base64,....
        text = text.split(",", 1)[1]
    text = "".join(text.split())  # line-wrapped base64 (GNU base64, encodebytes) is still base64
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(400, "\"data\" is not valid base64") from None
