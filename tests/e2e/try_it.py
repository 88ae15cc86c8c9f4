"""The try-it page (serving/page/) in headless Chromium, in front of an engine a test already started: a photo is
uploaded, the engine's own JSON answer comes back through the page's server, and the boxes drawn on the canvas sit
at that answer's boxes (scaled to the canvas, pixel by pixel); a file that is no photo shows the API's own message.
Called by the detection e2e test for each engine (tests/e2e/test_detection.py), on its servers."""

from __future__ import annotations

import json
from pathlib import Path

import requests

from serving.page.server import V1, PageServer, target_of
from serving.settings import free_port
from tests.browser import chromium, screenshot, wait_for

NOT_A_PHOTO = b"these are notes, not a photo\n"
MAX_DETECTIONS = 5


def check_try_it_page(engine, model: str, example_answer: dict, photo: Path, tmp_path: Path) -> Path:
    """Everything the page must do for one engine; returns its screenshot."""
    target = target_of(engine, {model: example_answer})
    with PageServer(target, port=free_port()) as page, chromium() as browser:
        browser.get(page.url)
        wait_for(lambda: browser.execute_script("return document.getElementById('model').options.length"))
        browser.find_element("id", "max").send_keys(str(MAX_DETECTIONS))
        browser.find_element("id", "file").send_keys(str(photo))
        wait_for(lambda: browser.execute_script("return document.body.dataset.state") == "answered")
        answer = browser.execute_script("return window.lastAnswer")
        assert answer["detections"] and len(answer["detections"]) <= MAX_DETECTIONS
        asked = _asked(target, model, photo.read_bytes(), "image/jpeg", engine.request_headers())
        assert answer["detections"] == asked["detections"]
        _boxes_sit_where_the_answer_puts_them(browser, answer)
        facts = browser.find_element("id", "facts").text
        assert f"served form {answer['artifact']}" in facts and " ms " in facts
        shot = screenshot(browser, tmp_path / f"try-it-{target.engine}.png")
        bad = tmp_path / "notes.txt"
        bad.write_bytes(NOT_A_PHOTO)
        browser.find_element("id", "file").send_keys(str(bad))
        wait_for(lambda: browser.execute_script("return document.body.dataset.state") == "error")
        expected = _asked(target, model, NOT_A_PHOTO, "text/plain", engine.request_headers(), ok=False)
        shown = browser.find_element("id", "error").text
        assert shown and shown == (expected.get("message") or expected.get("error") or expected.get("detail"))
    return shot


def _boxes_sit_where_the_answer_puts_them(browser, answer: dict) -> None:
    canvas = browser.find_element("id", "canvas")
    scale = float(canvas.get_attribute("data-scale"))
    drawn = json.loads(canvas.get_attribute("data-boxes"))
    assert [d["box"] for d in drawn] == [[round(v * scale) for v in d["box"]] for d in answer["detections"]]
    x1, y1, _, y2 = drawn[-1]["box"]  # the last box drawn is on top: its left edge is its colour
    pixel = browser.execute_script(
        "return Array.from(arguments[0].getContext('2d').getImageData(arguments[1], arguments[2], 1, 1).data)",
        canvas,
        x1 + 1,
        (y1 + y2) // 2,
    )
    colour = drawn[-1]["colour"]
    assert pixel[:3] == [int(colour[k : k + 2], 16) for k in (1, 3, 5)]


def _asked(target, model: str, body: bytes, content_type: str, auth: dict, ok: bool = True) -> dict:
    """What the engine itself answers the same request (curl's), to hold the page's display to."""
    url = target.urls[model]
    if target.protocol == V1:
        import base64

        instance = {"image": {"b64": base64.b64encode(body).decode()}, "max_detections": MAX_DETECTIONS}
        response = requests.post(url, json={"instances": [instance]}, headers=auth, timeout=300)
    else:
        response = requests.post(
            url,
            data=body,
            timeout=300,
            headers={"Content-Type": content_type, "X-Max-Detections": str(MAX_DETECTIONS), **auth},
        )
    assert response.ok == ok, response.text
    found = response.json()
    return found["predictions"][0] if ok and target.protocol == V1 else found


def check_openapi_page(base_url: str) -> None:
    """KServe's OpenAPI page is on: /docs answers its Swagger UI, /openapi.json documents the v1 predict the page calls."""
    docs = requests.get(f"{base_url}/docs", timeout=60)
    assert docs.status_code == 200 and "swagger-ui" in docs.text.lower() and "/openapi.json" in docs.text
    paths = requests.get(f"{base_url}/openapi.json", timeout=60).json()["paths"]
    assert "/v1/models/{model_name}:predict" in paths, sorted(paths)
