"""TorchServe's canary and capture, done by our handler (handlers/routes.py): the live version's real handler in a
real ts.context.Context, the control file the rollout writes, and a candidate version served over real HTTP on
loopback by its own real handler (what TorchServe's /predictions/NAME/VERSION runs)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import stat
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from PIL import Image
from ts.context import Context, RequestProcessor

from contract.records import Manifest
from contract.versions import VERSION_HEADER, ModelVersion
from handlers import routes
from handlers.image_classifier import TorchServeHandler
from handlers.policy import RUN_CONFIG_ENV
from handlers.request import ImageRequest
from handlers.routes import ROUTES_FOLDER, Canary, Control, ModelRoutes, WorkerRoutes
from serving.settings import free_port
from serving.torchserve.config import KEY_FILE, RUN_CONFIG
from serving.torchserve.switchboard import TorchServeSwitchboard
from tests.answers import assert_same_answer, expected_answer

NAME = "resnet18"


def jpeg(color) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(buffer, "JPEG")
    return buffer.getvalue()


def private(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) == 0o600


# ---------------------------------------------------------------------------------------------- files only, fast
def test_a_capture_keeps_the_next_live_photos_in_order_and_forgets_them_when_stopped(tmp_path):
    files = ModelRoutes(tmp_path / ROUTES_FOLDER, NAME)
    live, candidate = WorkerRoutes(files, "v1"), WorkerRoutes(files, "v2")
    files.start_capture("v1", 3)
    assert private(files.control_file) and candidate.control() is None  # the candidate's workers keep nothing
    candidate.route([ImageRequest(b"photo-0", "image/jpeg", request_id="c0")])
    live.route([ImageRequest(b"photo-1", "image/jpeg", request_id="r1"), ImageRequest(b"", "image/jpeg")])
    live.route([ImageRequest(b"photo-2", "image/jpeg", request_id="a/b:2"),  # an id that is no file name
                ImageRequest(b"photo-3", "image/jpeg", request_id="r3"),
                ImageRequest(b"photo-4", "image/jpeg", request_id="r4")])
    assert files.captured() == [("r1", b"photo-1"), ("a/b:2", b"photo-2"), ("r3", b"photo-3")]  # an empty body: none
    longest = "a" + "/" * 127  # the longest id a client may send (handlers/request.py), no file name as it is
    files.start_capture("v1", 1)
    live.route([ImageRequest(b"photo-6", "image/jpeg", request_id=longest)])
    assert files.captured() == [(longest, b"photo-6")]
    assert all(private(path) for path in files.capture_dir.iterdir())  # live requests' photos: this user's only
    files.stop_capture()
    assert files.captured() == [] and not files.capture_dir.exists() and not files.control_file.exists()
    live.route([ImageRequest(b"photo-5", "image/jpeg", request_id="r5")])  # a capture ended keeps nothing more
    assert files.captured() == []


def test_a_worker_reads_the_control_again_only_when_it_changed(tmp_path):
    files = ModelRoutes(tmp_path / ROUTES_FOLDER, NAME)
    worker = WorkerRoutes(files, "v1")
    assert worker.control() is None  # no file: one failed stat
    files.write(Control("v1", capture=2))
    first = worker.control()
    assert first == Control("v1", capture=2) and worker.control() is first  # unchanged: not read again
    files.write(Control("v1", capture=7))
    assert worker.control() == Control("v1", capture=7)
    files.write(Control("v2", capture=7))  # v2 is live now: this worker routes nothing
    assert worker.control() is None
    files.control_file.write_text("{not json")  # never written so: logged, and the live version answers on
    assert worker.control() is None
    files.clear()
    assert worker.control() is None and not files.control_file.exists()


MALFORMED = {"a list": "[]",
             "a string percent": json.dumps({"live": "v1", "canary": {"id": "c", "label": "v2", "url": "http://x",
                                                                       "percent": "50"}}),
             "a percent over 100": json.dumps({"live": "v1", "canary": {"id": "c", "label": "v2", "url": "http://x",
                                                                         "percent": 150}}),
             "a canary of unknown keys": json.dumps({"live": "v1", "canary": {"label": "v2", "share": 5}}),
             "a string capture": json.dumps({"live": "v1", "capture": "3"}),
             "invalid JSON": "{not json",
             "not UTF-8": b"\xff\xfe".decode("latin-1")}


@pytest.mark.parametrize("shape", sorted(MALFORMED))
def test_a_malformed_control_is_ignored_with_one_warning_per_change_and_fails_no_request(shape, tmp_path, caplog):
    files = ModelRoutes(tmp_path / ROUTES_FOLDER, NAME)
    worker = WorkerRoutes(files, "v1")
    files.control_file.parent.mkdir()
    files.control_file.write_bytes(MALFORMED[shape].encode("latin-1"))
    batch = [ImageRequest(jpeg("red"), "image/jpeg", request_id=f"r{index}") for index in range(3)]
    with caplog.at_level("WARNING", logger="handlers.routes"):
        for _ in range(5):  # five live batches while the file stands: each routes nothing, each answered here
            assert worker.route(batch) == {}
    warned = [record for record in caplog.records if "cannot be read" in record.getMessage()]
    assert len(warned) == 1 and warned[0].levelname == "WARNING", caplog.text
    assert str(files.control_file) in warned[0].getMessage()
    files.control_file.write_text("[1]")  # changed, still malformed: said once more
    with caplog.at_level("WARNING", logger="handlers.routes"):
        assert worker.route(batch) == {} and worker.route(batch) == {}
    assert len([record for record in caplog.records if "cannot be read" in record.getMessage()]) == 2
    files.start_capture("v1", 2)  # the rollout writes over it; the worker follows the new control
    worker.route(batch)
    assert [request_id for request_id, _ in files.captured()] == ["r0", "r1"]


def test_a_control_names_what_is_wrong_with_it():
    with pytest.raises(ValueError, match='"canary"."percent" is \'50\', not a number from 0 to 100'):
        Control.from_json(MALFORMED["a string percent"])
    with pytest.raises(ValueError, match='not a JSON object naming the "live" version'):
        Control.from_json("[]")
    control = Control("v1", 2, Canary("c", "v2", "http://127.0.0.1:1/predictions/m/2", {"Authorization": "k"}, 5))
    assert Control.from_json(control.to_json()) == control


def test_the_switchboard_gives_the_canary_the_inference_key_when_tokens_are_on(tmp_path):
    (tmp_path / RUN_CONFIG).write_text("inference_address=http://0.0.0.0:8085\nmanagement_address=http://127.0.0.1:"
                                       "8086\nmodel_store=/store\ndisable_token_authorization=false\n")
    (tmp_path / KEY_FILE).write_text(json.dumps({"inference": {"key": "in-key"}, "management": {"key": "man-key"}}))
    board = TorchServeSwitchboard(tmp_path)
    canary = board.canary_route(NAME, "v2", 25)
    assert (canary.label, canary.url, canary.percent) == ("v2", f"http://127.0.0.1:8085/predictions/{NAME}/2", 25)
    assert canary.headers == {"Authorization": "Bearer in-key"}
    board.routes(NAME).start_canary("v1", canary)
    assert private(board.routes(NAME).control_file)  # it holds the key
    assert WorkerRoutes.of_worker(NAME, "v1", {RUN_CONFIG_ENV: str(tmp_path / RUN_CONFIG)}).control().canary == canary


# ---------------------------------------------------------------------------------------------- real handlers
def context_for(model_dir: Path, rows: int, headers: dict | None = None) -> Context:
    config = yaml.safe_load((model_dir / "model-config.yaml").read_text())
    mar_manifest = json.loads((model_dir / "MAR-INF" / "MANIFEST.json").read_text())
    context = Context(NAME, str(model_dir), mar_manifest, batch_size=rows, gpu=None, mms_version="0.12.0",
                      model_yaml_config=config)
    context.request_processor = [RequestProcessor(dict((headers or {}).get(i, {}))) for i in range(rows)]
    return context


@pytest.fixture(scope="module")
def run_config(tmp_path_factory) -> Path:
    """Where `python -m serving` would have written TorchServe's run config: the workers find the routes beside it."""
    path = tmp_path_factory.mktemp("run") / RUN_CONFIG
    path.write_text("")
    return path


@pytest.fixture(scope="module")
def v2_dir(resnet18_unpacked, tmp_path_factory) -> Path:
    """The session's archive unpacked again as version 2: the same files, its manifest naming version 2."""
    folder = tmp_path_factory.mktemp("v2") / NAME
    shutil.copytree(resnet18_unpacked, folder, copy_function=os.symlink)
    manifest = Manifest.read(resnet18_unpacked)
    (folder / "manifest.json").unlink()
    (folder / "manifest.json").write_text(dataclasses.replace(manifest, model_version=ModelVersion(2, "c")).to_json())
    return folder


@pytest.fixture(scope="module")
def handlers(resnet18_unpacked, v2_dir, run_config):
    """The live version's handler (v1) and the candidate's (v2), each opened as a worker of a server whose run config
    is run_config."""
    opened = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(RUN_CONFIG_ENV, str(run_config))
        for folder in (resnet18_unpacked, v2_dir):
            handler = TorchServeHandler()
            handler.initialize(context_for(folder, 1))
            opened.append(handler)
    assert [handler.core.version for handler in opened] == ["v1", "v2"]
    return opened


class CandidateServer(ThreadingHTTPServer):
    """POST /predictions/NAME/2 answered by the candidate's handler as TorchServe's frontend calls it: the body one
    row, the status and headers the handler set; without the inference key, refused as TorchServe refuses it."""

    def __init__(self, handler: TorchServeHandler, model_dir: Path, key: str):
        self.handler, self.model_dir, self.key, self.asked = handler, model_dir, key, 0
        super().__init__(("127.0.0.1", 0), CandidateRequest)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/predictions/{NAME}/2"


class CandidateRequest(BaseHTTPRequestHandler):
    server: CandidateServer

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Authorization") != f"Bearer {self.server.key}":
            return self.reply(400, {"code": 400, "type": "InvalidKeyException",
                                    "message": "Token Authorization failed"}, {})
        self.server.asked += 1
        context = context_for(self.server.model_dir, 1, {0: dict(self.headers.items())})
        answer = self.server.handler.handle([{"body": bytearray(body)}], context)[0]
        return self.reply(context.get_response_status(0)[0], answer, context.get_response_headers(0))

    def reply(self, code: int, answer: dict, headers: dict) -> None:
        payload = json.dumps(answer).encode()
        self.send_response(code)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def candidate(handlers, v2_dir):
    server = CandidateServer(handlers[1], v2_dir, key="in-key")
    yield server
    server.shutdown()
    server.server_close()


def canary_on(run_config: Path, url: str, percent: float, key: str = "in-key") -> ModelRoutes:
    files = ModelRoutes(run_config.parent / ROUTES_FOLDER, NAME)
    files.start_canary("v1", Canary("c-" + url[-12:] + key, "v2", url, {"Authorization": f"Bearer {key}"}, percent))
    return files


@pytest.mark.slow
def test_the_canarys_share_is_answered_by_the_candidate_naming_its_version(handlers, candidate, run_config,
                                                                             resnet18_unpacked):
    live = handlers[0]
    files = canary_on(run_config, candidate.url, 100)
    photos = [jpeg((200, 120, 40)), b"not a photo", jpeg((30, 160, 90))]
    rows = [{"body": bytearray(photo)} for photo in photos]
    context = context_for(resnet18_unpacked, 3, {2: {"X-TopK": "2", "X-Request-ID": "canary-row-2"}})
    answers = live.handle(rows, context)
    versions = [context.get_response_headers(index)[VERSION_HEADER] for index in range(3)]
    assert versions == ["v2", "v1", "v2"] and candidate.asked == 3  # the candidate refused the bad photo: answered here
    assert [answer.get("version") for answer in answers] == ["v2", None, "v2"]
    assert context.get_response_status(1)[0] == 415 and "request_id" in answers[1]
    assert_same_answer(answers[0], expected_answer(resnet18_unpacked, photos[0]))
    assert_same_answer(answers[2], expected_answer(resnet18_unpacked, photos[2], topk=2))  # its options went along
    counts = files.end_canary(settle_s=5)  # the request's own fault is not the candidate's failure
    assert (counts["asked"], counts["served"], counts["declined"], counts["failed"]) == (3, 2, 1, 0)
    assert not files.counts_dir.exists()
    live.handle(rows[:1], context := context_for(resnet18_unpacked, 1))  # the canary ended: answered here
    assert context.get_response_headers(0)[VERSION_HEADER] == "v1" and candidate.asked == 3


@pytest.mark.slow
def test_a_forward_that_fails_is_counted_and_answered_by_the_live_version(handlers, candidate, run_config,
                                                                          resnet18_unpacked):
    live, photo = handlers[0], jpeg((90, 90, 200))
    unused = f"http://127.0.0.1:{free_port()}/predictions/{NAME}/2"  # nothing listens there
    for url, key in ((candidate.url, "stale-key"), (unused, "in-key")):
        files = canary_on(run_config, url, 100, key)
        context = context_for(resnet18_unpacked, 1)
        answer = live.handle([{"body": bytearray(photo)}], context)[0]
        assert context.get_response_headers(0)[VERSION_HEADER] == answer["version"] == "v1"
        assert_same_answer(answer, expected_answer(resnet18_unpacked, photo))
        counts = files.end_canary(settle_s=5)
        assert (counts["asked"], counts["served"], counts["failed"]) == (1, 0, 1)  # a refused key is a failure too
    assert candidate.asked == 0


class Hanging(BaseHTTPRequestHandler):
    """A candidate that takes every request and never answers (a hung worker)."""

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.server.asked += 1  # type: ignore[attr-defined]
        self.server.release.wait(60)  # type: ignore[attr-defined]

    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_a_candidate_that_hangs_holds_a_live_request_no_longer_than_the_forward_timeout_and_then_none(
        handlers, run_config, resnet18_unpacked, monkeypatch):
    monkeypatch.setattr(routes, "FORWARD_TIMEOUT_S", 1.0)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hanging)
    server.asked, server.release = 0, threading.Event()  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        files = canary_on(run_config, f"http://127.0.0.1:{server.server_address[1]}/predictions/{NAME}/2", 100, "hang")
        live, photo = handlers[0], jpeg((10, 200, 60))
        for _ in range(3):
            started = time.monotonic()
            context = context_for(resnet18_unpacked, 1)
            answer = live.handle([{"body": bytearray(photo)}], context)[0]
            assert context.get_response_headers(0)[VERSION_HEADER] == answer["version"] == "v1"
            assert time.monotonic() - started < 30
        assert server.asked == 1  # the hung candidate failed once: the live version answered the rest itself
        counts = files.end_canary(settle_s=5)
        assert (counts["asked"], counts["served"], counts["failed"]) == (1, 0, 1)
    finally:
        server.release.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()
