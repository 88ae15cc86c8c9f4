"""A bad-input matrix against a real TorchServe with our handler: every case asserts its exact outcome (a
prediction, or a 4xx JSON error naming the problem), bad requests interleave with good ones under
concurrency, and the workers that served them are the same processes afterwards."""

from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import time

import numpy as np
import pytest
import requests
from PIL import Image

from tests.conftest import ROOT
from tests.runtime.test_images import encode, png_header_only, solid

pytestmark = pytest.mark.slow
CAT = ROOT / "examples" / "cat.jpg"
JPEG = {"Content-Type": "image/jpeg"}
JSON = {"Content-Type": "application/json"}


def jpeg(image: Image.Image, **options) -> bytes:
    return encode(image, "JPEG", **options)


def photo(size=(320, 240), mode="RGB") -> Image.Image:
    rng = np.random.default_rng(0)
    base = Image.fromarray(rng.integers(0, 255, (size[1] // 8, size[0] // 8, 3), dtype=np.uint8)).resize(size)
    return base.convert(mode)


def truncated_jpeg() -> bytes:
    data = jpeg(photo())
    return data[: len(data) // 2]


def broken_crc_png() -> bytes:
    data = bytearray(encode(photo(), "PNG"))
    data[29] ^= 0xFF  # inside the IHDR chunk's CRC
    return bytes(data)


def exif_rotated() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6
    return jpeg(photo(), exif=exif.tobytes())


def palette_with_transparency() -> bytes:
    image = photo().convert("P")
    return encode(image, "PNG", transparency=0)


def animated_gif() -> bytes:
    frames = [solid((255, 0, 0), (64, 64)), solid((0, 0, 255), (64, 64))]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    return buffer.getvalue()


def sixteen_bit_png() -> bytes:
    array = (np.linspace(0, 65535, 64 * 64).reshape(64, 64)).astype(np.uint16)
    return encode(Image.fromarray(array), "PNG")  # uint16 -> mode I;16


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="64" height="64"><rect width="64" height="64"/></svg>'
OK = (200, None)
# name -> (body, headers, (status, words the error must contain))
CASES = {
    "empty body": (b"", JPEG, (400, "empty")),
    "random bytes": (np.random.default_rng(1).bytes(4096), JPEG, (415, "not an image")),
    "text/html": (b"<html><body>hello</body></html>", {"Content-Type": "text/html"}, (415, "the body is text")),
    "truncated JPEG": (truncated_jpeg(), JPEG, (400, "corrupt or truncated")),
    "PNG with a broken CRC": (broken_crc_png(), {"Content-Type": "image/png"}, (415, "not an image PIL can read")),
    "JSON, invalid base64": (json.dumps({"data": "@@not base64@@"}).encode(), JSON, (400, "not valid base64")),
    "JSON without data": (json.dumps({"image_url": "x"}).encode(), JSON, (400, "\"data\"")),
    "JSON array": (b"[1, 2, 3]", JSON, (400, "must be an object")),
    "JSON number": (b"42", JSON, (400, "must be an object")),
    "decompression bomb": (png_header_only(50_000, 50_000), {"Content-Type": "image/png"}, (413, "pixels")),
    "1x1 image": (encode(solid(size=(1, 1)), "PNG"), {"Content-Type": "image/png"}, (400, "at least")),
    "10000x10 strip": (encode(solid(size=(10_000, 10)), "PNG"), {"Content-Type": "image/png"}, OK),
    "grayscale": (jpeg(photo(mode="L")), JPEG, OK),
    "RGBA": (encode(photo(mode="RGBA"), "PNG"), {"Content-Type": "image/png"}, OK),
    "palette with transparency": (palette_with_transparency(), {"Content-Type": "image/png"}, OK),
    "CMYK JPEG": (jpeg(photo(mode="CMYK")), JPEG, OK),
    "16-bit PNG": (sixteen_bit_png(), {"Content-Type": "image/png"}, OK),
    "animated GIF": (animated_gif(), {"Content-Type": "image/gif"}, OK),
    "EXIF-rotated JPEG": (exif_rotated(), JPEG, OK),
    "progressive JPEG": (jpeg(photo(), progressive=True), JPEG, OK),
    "WebP": (encode(photo(), "WEBP"), {"Content-Type": "image/webp"}, OK),
    "TIFF": (encode(photo(), "TIFF"), {"Content-Type": "image/tiff"}, OK),
    "wrong Content-Type": (CAT.read_bytes(), {"Content-Type": "image/png"}, OK),
    "base64 JSON": (json.dumps({"data": b64(CAT.read_bytes())}).encode(), JSON, OK),
    "SVG": (SVG, {"Content-Type": "image/svg+xml"}, (415, "not an image PIL can read")),
    "topk 0": (json.dumps({"data": b64(CAT.read_bytes()), "topk": 0}).encode(), JSON, (400, "topk")),
    "topk -1": (json.dumps({"data": b64(CAT.read_bytes()), "topk": -1}).encode(), JSON, (400, "topk")),
    "topk 10^9": (json.dumps({"data": b64(CAT.read_bytes()), "topk": 10**9}).encode(), JSON, (400, "topk")),
    "topk abc": (json.dumps({"data": b64(CAT.read_bytes()), "topk": "abc"}).encode(), JSON, (400, "topk")),
    "topk 3 in a header": (CAT.read_bytes(), {**JPEG, "X-TopK": "3"}, OK),
}


@pytest.fixture(scope="module")
def serving(resnet18_server):
    return resnet18_server


def worker_pids(settings) -> list[int]:
    workers = requests.get(f"{settings.management_url}/models/{settings.model_name}", timeout=10).json()[0]["workers"]
    assert all(w["status"] == "READY" for w in workers)
    return sorted(w["pid"] for w in workers)


@pytest.fixture(scope="module")
def pids_before(serving):
    """Every worker READY first: readiness means one prediction succeeded, others may still be loading."""
    deadline = time.monotonic() + 180
    while True:
        workers = requests.get(f"{serving.management_url}/models/{serving.model_name}",
                               timeout=10).json()[0]["workers"]
        if workers and all(w["status"] == "READY" for w in workers):
            return sorted(w["pid"] for w in workers)
        assert time.monotonic() < deadline, f"workers never all READY: {workers}"
        time.sleep(0.5)


def post(settings, body: bytes, headers: dict | None, **kwargs) -> requests.Response:
    return requests.post(settings.predictions_url(), data=body, headers=headers, timeout=60, **kwargs)


def assert_outcome(response: requests.Response, expected: tuple[int, str | None]) -> None:
    status, words = expected
    assert response.status_code == status, f"{response.status_code}: {response.text[:300]}"
    body = response.json()
    if status == 200:
        assert len(body["predictions"]) >= 1 and body["architecture"] == "resnet18"  # whatever name serves it
    else:
        assert body == {"code": status, "error": body["error"], "request_id": body["request_id"]}  # its id too
        assert (words or "") in body["error"] and body["request_id"]


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_case(serving, pids_before, case):
    body, headers, expected = CASES[case]
    response = post(serving, body, headers)
    assert_outcome(response, expected)
    if case == "topk 3 in a header":
        assert len(response.json()["predictions"]) == 3


def test_multipart_form_without_a_file(serving, pids_before):
    response = requests.post(serving.predictions_url(), files={"topk": (None, "3")}, timeout=60)
    assert_outcome(response, (400, "no image in the request"))


def test_body_over_max_request_size_is_refused_by_the_frontend(serving, pids_before):
    response = post(serving, b"\xff" * (9 * 2**20), JPEG)
    assert response.status_code == 413 and response.content == b""  # TorchServe's frontend sends no body


def test_unknown_model(serving, pids_before):
    unknown = requests.post(f"{serving.inference_url}/predictions/nope", data=CAT.read_bytes(), headers=JPEG,
                            timeout=60)
    assert unknown.status_code == 404
    assert unknown.json() == {"code": 404, "type": "ModelNotFoundException", "message": "Model not found: nope"}


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_wrong_method_without_an_image(serving, pids_before, method):
    # TorchServe hands every method on /predictions to the handler; without a body there is no image
    response = requests.request(method, serving.predictions_url(), timeout=60)
    assert_outcome(response, (400, "empty request"))


def test_no_content_type(serving, pids_before):
    response = requests.post(serving.predictions_url(), data=CAT.read_bytes(), timeout=60)
    assert_outcome(response, OK)


def interleaved_jobs(count: int) -> list[tuple]:
    """count (body, content type, expected outcome): the cat photo and a bad case in turn."""
    bad = [CASES[c] for c in ("random bytes", "truncated JPEG", "JSON array", "topk abc", "1x1 image")]
    return [(CAT.read_bytes(), JPEG, OK) if i % 2 == 0 else bad[i // 2 % len(bad)] for i in range(count)]


def test_bad_and_good_requests_interleaved_under_concurrency(serving, pids_before):
    jobs = interleaved_jobs(40)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda job: post(serving, job[0], job[1]), jobs))
    for (_, _, expected), response in zip(jobs, responses):
        assert_outcome(response, expected)


def test_workers_are_the_same_processes_afterwards(serving, pids_before):
    assert worker_pids(serving) == pids_before
