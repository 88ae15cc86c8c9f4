"""handlers/request.py, handlers/request_body.py and handlers/request_error.py: a request -> image bytes and options, and the HTTP
answer (status and message) of every bad request, a refused image included.

Every image is made with PIL in memory; nothing is read from disk and nothing is mocked.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from PIL import Image

from contract.errors import VisionExportError
from handlers.request import ImageRequest
from handlers.request_body import MAX_TOPK, image_of, option, requested_topk
from handlers.request_error import IMAGE_STATUS, RequestError
from runtime.images import MAX_PIXELS, MAX_SIDE, MIN_SIDE, ImageError, ImageProblem, decode_image
from tests.runtime.test_images import GREEN, encode, png_header_only, solid

PNG = encode(solid(GREEN))
PNG_B64 = base64.b64encode(PNG).decode("ascii")


def body(data, content_type: str = "", **headers) -> ImageRequest:
    return ImageRequest(bytes(data), content_type, {name.replace("_", "-"): v for name, v in headers.items()})


def form(**fields) -> ImageRequest:  # a form the engine parsed
    return ImageRequest(b"", "multipart/form-data", {}, fields)


def json_object(fields: dict, **headers) -> ImageRequest:  # a JSON object the engine parsed
    return ImageRequest(b"", "application/json", {name.replace("_", "-"): v for name, v in headers.items()}, fields)


# ---------------------------------------------------------------- the record
def test_request_id_from_the_header_else_made():
    assert body(PNG, x_request_id="abc-123").request_id == "abc-123"
    assert ImageRequest(PNG, headers={"X-Request-ID": "Trace.7"}).request_id == "Trace.7"
    made = body(PNG).request_id, body(PNG).request_id
    assert made[0] != made[1] and all(len(rid) == 32 for rid in made)
    forged = body(PNG, x_request_id="a\nrequest forged").request_id  # no header value that forges a log line
    assert "\n" not in forged and len(forged) == 32


def test_headers_and_content_type_normalised():
    request = ImageRequest(PNG, "Image/PNG; charset=binary", {"X-TopK": "3"})
    assert request.content_type == "image/png" and request.header("x-topk") == "3" and request.header("X-TOPK") == "3"


def test_of_image_keeps_the_image_and_its_options():
    request = ImageRequest.of_image(PNG, topk=3, masks="png", score_threshold=None)
    assert image_of(request) == PNG and request.fields == {"topk": 3, "masks": "png"}


# ---------------------------------------------------------------- image_of()
def test_image_of_raw_body():
    assert image_of(body(PNG, "image/png")) == PNG
    result = image_of(body(bytearray(PNG)))
    assert type(result) is bytes and result == PNG


@pytest.mark.parametrize("key", ["data", "body", "file", "image"])
def test_image_of_form_field_by_name(key):
    assert image_of(form(**{key: PNG})) == PNG


@pytest.mark.parametrize("text", [PNG_B64, "data:image/png;base64," + PNG_B64], ids=["plain", "data-url"])
def test_image_of_json_object_base64(text):
    assert image_of(json_object({"data": text, "topk": 2})) == PNG


def test_image_of_json_object_image_key():
    assert image_of(json_object({"image": PNG_B64})) == PNG


@pytest.mark.parametrize("content_type", ["", "application/json"])
def test_image_of_raw_json_text(content_type):
    assert image_of(body(json.dumps({"data": PNG_B64}).encode(), content_type)) == PNG


def test_image_of_multipart_field_name():
    request = form(myfile=bytearray(PNG))
    assert image_of(request) == PNG
    assert decode_image(image_of(request))[:, 0, 0].tolist() == list(GREEN)


def test_image_of_multipart_skips_empty_fields():
    assert image_of(form(note=b"", upload=bytearray(PNG))) == PNG


def test_image_of_multipart_with_topk_field_before_file():
    assert image_of(form(topk=bytearray(b"3"), myfile=bytearray(PNG))) == PNG


@pytest.mark.parametrize("request_, words", [
    (ImageRequest(), ["empty request", "send", "body", "base64"]),
    (form(topk="3"), ["no image", "send", "form file"]),
    (form(body=b""), ["empty"]),
    (json_object({"topk": 2}), ["\"data\"", "base64"]),
    (json_object({}), ["\"data\"", "base64"]),
    (json_object({"data": ""}), ["\"data\"", "base64"]),
    (json_object({"data": 12}), ["\"data\"", "base64"]),
    (body(b'{"topk": 2}'), ["\"data\"", "base64"]),
    (body(b'{"data": null}'), ["\"data\"", "base64"]),
    (json_object({"data": "not base64 at all!"}), ["\"data\"", "base64"]),
    (json_object({"data": "data:image/png;base64,@@@@"}), ["base64"]),
    (body(b"{this is not json"), ["JSON", "does not parse"]),
    (body(b"{this is not json", "application/json"), ["JSON", "does not parse"]),
    (body(b"{\xff\xfe}"), ["JSON", "does not parse"]),
], ids=["empty-request", "only-topk", "empty-field", "json-no-data", "json-empty", "json-empty-data",
        "json-data-not-str", "raw-json-no-data", "raw-json-null-data", "bad-base64", "bad-data-url",
        "brace-not-json", "json-type-not-json", "brace-not-utf8"])
def test_image_of_errors(request_, words):
    with pytest.raises(RequestError) as caught:
        image_of(request_)
    assert caught.value.code == 400
    for word in words:
        assert word in caught.value.message


@pytest.mark.parametrize("data", [b'["not", "an", "object"]', b"[1]", b"plain text"])
def test_image_of_non_object_bodies_pass_through_and_fail_as_images(data):
    # without a JSON content type only bodies starting with "{" are treated as JSON; the rest fail as images
    assert image_of(body(data)) == data
    with pytest.raises(ImageError) as caught:
        decode_image(image_of(body(data)))
    assert RequestError.for_image(caught.value).code == 415


def test_image_of_text_body_that_is_not_base64():
    with pytest.raises(RequestError) as caught:
        image_of(body(b"<html><body>hello</body></html>", "text/html"))
    assert caught.value.code == 415 and "the body is text" in caught.value.message
    assert image_of(body(PNG_B64.encode(), "text/plain")) == PNG  # a base64 text body is still an image


@pytest.mark.parametrize("parsed", [[1, 2, 3], 42, 4.5, True])
def test_image_of_json_that_is_not_an_object(parsed):
    with pytest.raises(RequestError) as caught:
        image_of(body(json.dumps(parsed).encode(), "application/json"))
    assert caught.value.code == 400 and "must be an object" in caught.value.message


# ---------------------------------------------------------------- requested_topk()
@pytest.mark.parametrize("request_, expected", [
    (body(PNG), 5),
    (json_object({"data": PNG_B64}), 5),
    (form(topk=b"3"), 3),
    (form(topk=bytearray(b"4")), 4),
    (form(topk="9"), 9),
    (form(topk=" 2 "), 2),
    (json_object({"data": PNG_B64, "topk": 2}), 2),
    (json_object({"data": PNG_B64, "topk": "6"}), 6),
    (body(PNG, x_topk="4"), 4),
    (ImageRequest(b"", "multipart/form-data", {"x-topk": "4"}, {"topk": b"3"}), 3),  # the field wins over the header
    (json_object({"topk": 8}, x_topk="4"), 8),
    (form(topk="1"), 1),
    (form(topk=str(MAX_TOPK)), MAX_TOPK),
], ids=["default", "default-json", "bytes", "bytearray", "str", "spaces", "json-int", "json-str", "header",
        "field-over-header", "json-over-header", "min", "max"])
def test_requested_topk(request_, expected):
    assert requested_topk(request_, 5) == expected


def test_requested_topk_default_is_passed_through():
    assert requested_topk(form(), 7) == 7
    assert requested_topk(ImageRequest(), 3) == 3
    assert requested_topk(body(PNG)) is None


@pytest.mark.parametrize("value", ["abc", "0", "101", "-1", "2.5", ""])
@pytest.mark.parametrize("where", ["field-str", "field-bytes", "json", "header"])
def test_requested_topk_invalid(value, where):
    request = {"field-str": lambda: form(data=PNG, topk=value), "field-bytes": lambda: form(data=PNG, topk=value.encode()),
               "json": lambda: json_object({"data": PNG_B64, "topk": value}),
               "header": lambda: body(PNG, x_topk=value)}[where]()
    with pytest.raises(RequestError) as caught:
        requested_topk(request, 5)
    assert caught.value.code == 400
    assert "topk must be" in caught.value.message and str(MAX_TOPK) in caught.value.message


@pytest.mark.parametrize("value", [0, 101])
def test_requested_topk_invalid_json_int(value):
    with pytest.raises(RequestError) as caught:
        requested_topk(json_object({"topk": value}), 5)
    assert caught.value.code == 400 and f"got {value}" in caught.value.message


def test_requested_topk_from_raw_json_bytes():
    request = body(json.dumps({"data": PNG_B64, "topk": 2}).encode())
    assert image_of(request) == PNG
    assert requested_topk(request, 5) == 2


def test_task_options_from_fields_then_headers():
    assert option(form(score_threshold="0.7"), "score_threshold") == "0.7"
    assert option(body(PNG, x_score_threshold="0.6", x_max_detections="3"), "max_detections") == "3"
    assert option(body(PNG), "masks") is None


# ---------------------------------------------------------------- RequestError
def test_request_error_as_response():
    error = RequestError(413, "too big")
    assert error.as_response() == {"code": 413, "error": "too big"}
    assert error.code == 413 and error.message == "too big" and str(error) == "too big"
    assert isinstance(error, VisionExportError)


def truncated_png() -> bytes:
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    data = encode(Image.fromarray(noise))
    return data[: len(data) // 2]


SEND = "send JPEG, PNG, WebP, BMP or GIF"
# (body, status, the message's start, its end): every ImageProblem at least once, with the exact text it is
# answered with (tests/runtime/test_images.py covers which images get which problem)
REFUSED = {
    "not an image": (b"not an image", 415, f"body is not an image PIL can read; {SEND}", ""),
    "unaccepted format": (encode(solid(), "PPM"), 415, f"PPM images are not accepted; {SEND}", ""),
    "too many pixels": (png_header_only(8000, 6000), 413, f"image is 8000x6000: the limit is {MAX_PIXELS:,} pixels "
                        f"and {MAX_SIDE} per side; downscale it before sending", ""),
    "bomb": (png_header_only(100_000, 100_000), 413,
             f"image too large: more than {MAX_PIXELS:,} pixels; downscale it before sending", ""),
    "too small": (encode(solid(size=(MIN_SIDE - 1, 20))), 400,
                  f"image is {MIN_SIDE - 1}x20: at least {MIN_SIDE} pixels per side are needed", ""),
    "truncated": (truncated_png(), 400, "image is corrupt or truncated: ", "; re-encode it as JPEG or PNG"),
}


@pytest.mark.parametrize("body, status, start, end", REFUSED.values(), ids=REFUSED.keys())
def test_a_refused_image_is_answered_with_its_problems_status_and_its_message(body, status, start, end):
    with pytest.raises(ImageError) as caught:
        decode_image(body)
    response = RequestError.for_image(caught.value).as_response()
    assert response["code"] == status
    message = response["error"]
    assert message.startswith(start) and message.endswith(end) and (end or message == start), message


def test_every_image_problem_has_a_status_and_is_answered_above():
    assert set(IMAGE_STATUS) == set(ImageProblem)
    problems = set()
    for body, _, _, _ in REFUSED.values():
        with pytest.raises(ImageError) as caught:
            decode_image(body)
        problems.add(caught.value.problem)
    assert problems == set(ImageProblem)


def test_decode_error_as_response():
    with pytest.raises(ImageError) as caught:
        decode_image(b"not an image")
    response = RequestError.for_image(caught.value).as_response()
    assert set(response) == {"code", "error"}
    assert response["code"] == 415 and "send JPEG" in response["error"]
