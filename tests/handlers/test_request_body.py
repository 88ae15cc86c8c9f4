"""handlers/request_body.py and handlers/request_error.py: request rows -> image bytes and options, and the HTTP
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
from handlers.request_body import MAX_TOPK, image_bytes, requested_topk
from handlers.request_error import IMAGE_STATUS, RequestError
from runtime.images import MAX_PIXELS, MAX_SIDE, MIN_SIDE, ImageError, ImageProblem, decode_image
from tests.runtime.test_images import GREEN, encode, png_header_only, solid

PNG = encode(solid(GREEN))
PNG_B64 = base64.b64encode(PNG).decode("ascii")


# ---------------------------------------------------------------- image_bytes()
@pytest.mark.parametrize("key", ["body", "data"])
def test_image_bytes_raw_body(key):
    assert image_bytes({key: PNG}) == PNG


def test_image_bytes_bytearray_becomes_bytes():
    result = image_bytes({"body": bytearray(PNG)})
    assert type(result) is bytes and result == PNG


@pytest.mark.parametrize("text", [PNG_B64, "data:image/png;base64," + PNG_B64], ids=["plain", "data-url"])
def test_image_bytes_json_dict_base64(text):
    assert image_bytes({"body": {"data": text, "topk": 2}}) == PNG


def test_image_bytes_json_dict_image_key():
    assert image_bytes({"body": {"image": PNG_B64}}) == PNG


@pytest.mark.parametrize("container", [bytes, bytearray])
def test_image_bytes_raw_json_text(container):
    assert image_bytes({"body": container(json.dumps({"data": PNG_B64}).encode())}) == PNG


def test_image_bytes_multipart_field_name():
    row = {"myfile": bytearray(PNG)}
    assert image_bytes(row) == PNG
    assert decode_image(image_bytes(row))[:, 0, 0].tolist() == list(GREEN)


def test_image_bytes_multipart_skips_empty_fields():
    assert image_bytes({"note": b"", "upload": bytearray(PNG)}) == PNG


def test_image_bytes_multipart_with_topk_field_before_file():
    assert image_bytes({"topk": bytearray(b"3"), "myfile": bytearray(PNG)}) == PNG


@pytest.mark.parametrize("row, words", [
    ({}, ["send", "body", "base64"]),
    ({"body": None}, ["send", "body"]),
    ({"topk": "3"}, ["send", "form file"]),
    (None, ["send an image"]),
    ({"body": b""}, ["empty"]),
    ({"body": {"topk": 2}}, ["\"data\"", "base64"]),
    ({"body": {"data": ""}}, ["\"data\"", "base64"]),
    ({"body": {"data": 12}}, ["\"data\"", "base64"]),
    ({"body": b'{"topk": 2}'}, ["\"data\"", "base64"]),
    ({"body": b'{"data": null}'}, ["\"data\"", "base64"]),
    ({"body": {"data": "not base64 at all!"}}, ["\"data\"", "base64"]),
    ({"body": {"data": "data:image/png;base64,@@@@"}}, ["base64"]),
    ({"body": b"{this is not json"}, ["JSON", "does not parse"]),
    ({"body": b"{\xff\xfe}"}, ["JSON", "does not parse"]),
], ids=["empty-row", "body-none", "only-topk", "not-a-dict", "empty-body", "json-no-data", "json-empty-data",
        "json-data-not-str", "raw-json-no-data", "raw-json-null-data", "bad-base64", "bad-data-url",
        "brace-not-json", "brace-not-utf8"])
def test_image_bytes_errors(row, words):
    with pytest.raises(RequestError) as caught:
        image_bytes(row)
    assert caught.value.code == 400
    for word in words:
        assert word in caught.value.message


@pytest.mark.parametrize("body", [b'["not", "an", "object"]', b"[1]", b"plain text"])
def test_image_bytes_non_object_bodies_pass_through_and_fail_as_images(body):
    # only bodies starting with "{" are treated as JSON; anything else is handed on to fail as an image
    assert image_bytes({"body": body}) == body
    with pytest.raises(ImageError) as caught:
        decode_image(image_bytes({"body": body}))
    assert RequestError.for_image(caught.value).code == 415


def test_image_bytes_text_body_that_is_not_base64():
    with pytest.raises(RequestError) as caught:
        image_bytes({"body": "<html><body>hello</body></html>"})
    assert caught.value.code == 415 and "the body is text" in caught.value.message
    assert image_bytes({"body": PNG_B64}) == PNG  # a base64 text body is still an image


@pytest.mark.parametrize("parsed", [[1, 2, 3], 42, 4.5, True])
def test_image_bytes_json_that_is_not_an_object(parsed):
    # with Content-Type: application/json TorchServe hands over the parsed value itself
    with pytest.raises(RequestError) as caught:
        image_bytes({"body": parsed})
    assert caught.value.code == 400 and "must be an object" in caught.value.message


# ---------------------------------------------------------------- requested_topk()
@pytest.mark.parametrize("row, header, expected", [
    ({"body": PNG}, None, 5),
    ({"body": {"data": PNG_B64}}, None, 5),
    ({"topk": b"3"}, None, 3),
    ({"topk": bytearray(b"4")}, None, 4),
    ({"topk": "9"}, None, 9),
    ({"topk": " 2 "}, None, 2),
    ({"body": {"data": PNG_B64, "topk": 2}}, None, 2),
    ({"body": {"data": PNG_B64, "topk": "6"}}, None, 6),
    ({"body": PNG}, "4", 4),
    ({"topk": b"3"}, "4", 3),  # the row's field wins over the header
    ({"body": {"topk": 8}}, "4", 8),
    ({"topk": "1"}, None, 1),
    ({"topk": str(MAX_TOPK)}, None, MAX_TOPK),
], ids=["default", "default-json", "bytes", "bytearray", "str", "spaces", "json-int", "json-str", "header",
        "row-over-header", "json-over-header", "min", "max"])
def test_requested_topk(row, header, expected):
    assert requested_topk(row, header, 5) == expected


def test_requested_topk_default_is_passed_through():
    assert requested_topk({}, None, 7) == 7
    assert requested_topk(None, None, 3) == 3


@pytest.mark.parametrize("value", ["abc", "0", "101", "-1", "2.5", ""])
@pytest.mark.parametrize("where", ["row-str", "row-bytes", "json", "header"])
def test_requested_topk_invalid(value, where):
    row, header = {"body": PNG}, None
    if where == "row-str":
        row["topk"] = value
    elif where == "row-bytes":
        row["topk"] = value.encode()
    elif where == "json":
        row = {"body": {"data": PNG_B64, "topk": value}}
    else:
        header = value
    with pytest.raises(RequestError) as caught:
        requested_topk(row, header, 5)
    assert caught.value.code == 400
    assert "topk must be" in caught.value.message and str(MAX_TOPK) in caught.value.message


@pytest.mark.parametrize("value", [0, 101])
def test_requested_topk_invalid_json_int(value):
    with pytest.raises(RequestError) as caught:
        requested_topk({"body": {"topk": value}}, None, 5)
    assert caught.value.code == 400 and f"got {value}" in caught.value.message


def test_requested_topk_from_raw_json_bytes():
    row = {"body": json.dumps({"data": PNG_B64, "topk": 2}).encode()}
    assert image_bytes(row) == PNG
    assert requested_topk(row, None, 5) == 2


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
