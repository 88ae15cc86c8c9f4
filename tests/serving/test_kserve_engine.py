"""The KServe engine without a server: the settings the server process reads, its URLs and its curl line
(choosing the engine and stopping with none running: tests/serving/test_cli.py)."""

from __future__ import annotations

import zipfile

import yaml

from contract.policy import Machine, PolicyChoices
from handlers.policy import machine_policy
from serving.kserve.config import KServeSettings
from serving.kserve.engine import KServe


def test_settings_travel_to_the_server_process_whole(tmp_path):
    settings = KServeSettings(tmp_path / "store", ("a", "b"), http_port=9999, run_dir=tmp_path / "run",
                              policy=machine_policy(0, 2))
    settings.run_dir.mkdir()
    again = KServeSettings.read(settings.write())
    both = {"a": machine_policy(0, 2), "b": machine_policy(0, 2)}  # resolved here, read there as they are
    assert again == KServeSettings(settings.model_store.absolute(), ("a", "b"), http_port=9999,
                                   run_dir=settings.run_dir.absolute(), policies=both)
    assert again.model_policies() == both and again.server_workers() == 2
    assert again.predict_url("a") == "http://127.0.0.1:9999/v1/models/a:predict"
    assert again.infer_url("a") == "http://127.0.0.1:9999/v2/models/a/infer"


def test_an_archives_pinned_workers_do_not_split_kserves_workers_but_its_other_pins_hold(tmp_path):
    """KServe's worker processes serve every model at once: an archive's pinned workers are TorchServe's and Ray's."""
    store = tmp_path / "store"
    store.mkdir()
    for name, config in (("plain", {}), ("pinned", {"minWorkers": 1, "maxWorkers": 1, "batchSize": 4})):
        with zipfile.ZipFile(store / f"{name}.mar", "w") as archive:
            archive.writestr("model-config.yaml", yaml.safe_dump(config))
    settings = KServeSettings(store, ("plain", "pinned"), flags=PolicyChoices(threads_per_worker=1))
    policies = settings.resolve_policies(Machine(0, 4))
    assert {policy.workers for policy in policies.values()} == {4} and settings.server_workers() == 4
    assert (policies["plain"].batch_size, policies["pinned"].batch_size) == (1, 4)


def test_a_user_is_given_the_v1_and_v2_urls_a_curl_line_and_the_stop_command(tmp_path):
    engine = KServe(KServeSettings(models=("a",), http_port=9999, run_dir=tmp_path))
    assert engine.urls("a") == {"v1": "http://127.0.0.1:9999/v1/models/a:predict",
                                "v2": "http://127.0.0.1:9999/v2/models/a/infer"}
    assert "curl -sS -X POST http://127.0.0.1:9999/v1/models/a:predict" in engine.curl_line("a")
    assert engine.metrics_url() == "http://127.0.0.1:9999/metrics"
    assert engine.stop_command() == f"python -m serving stop --engine kserve --run-dir {tmp_path}"
    assert engine.pid_file == tmp_path.absolute() / "kserve.pgid"


def test_a_client_posts_one_photo_as_kserves_v1_instances_and_reads_the_first_prediction(tmp_path):
    """What load generators and tests send to any engine (Engine.client_body): KServe's v1 JSON here, the photo's
    own bytes on the engines that take them."""
    import base64
    import json

    from serving.torchserve.config import ServerSettings
    from serving.torchserve.engine import TorchServe
    body, content_type = KServe(KServeSettings(models=("a",), run_dir=tmp_path)).client_body(b"\xff\xd8photo")
    assert content_type == "application/json"
    assert base64.b64decode(json.loads(body)["instances"][0]["image"]["b64"]) == b"\xff\xd8photo"
    raw = TorchServe(ServerSettings(model_store=tmp_path, run_dir=tmp_path)).client_body(b"\xff\xd8photo")
    assert raw == (b"\xff\xd8photo", "image/jpeg")
