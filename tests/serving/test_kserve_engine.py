"""The KServe engine without a server: the settings the server process reads, its URLs and its curl line
(refusing --token-auth, choosing the engine and stopping with none running: tests/serving/test_cli.py)."""

from __future__ import annotations

from handlers.policy import machine_policy
from serving.kserve.config import KServeSettings
from serving.kserve.engine import KServe


def test_settings_travel_to_the_server_process_whole(tmp_path):
    settings = KServeSettings(tmp_path / "store", ("a", "b"), http_port=9999, run_dir=tmp_path / "run",
                              policy=machine_policy(0, 2))
    settings.run_dir.mkdir()
    again = KServeSettings.read(settings.write())
    assert again == KServeSettings(settings.model_store.absolute(), ("a", "b"), http_port=9999,
                                   run_dir=settings.run_dir.absolute(), policy=machine_policy(0, 2))
    assert again.predict_url("a") == "http://127.0.0.1:9999/v1/models/a:predict"
    assert again.infer_url("a") == "http://127.0.0.1:9999/v2/models/a/infer"


def test_a_user_is_given_the_v1_and_v2_urls_a_curl_line_and_the_stop_command(tmp_path):
    engine = KServe(KServeSettings(models=("a",), http_port=9999, run_dir=tmp_path))
    assert engine.urls("a") == {"v1": "http://127.0.0.1:9999/v1/models/a:predict",
                                "v2": "http://127.0.0.1:9999/v2/models/a/infer"}
    assert "curl -sS -X POST http://127.0.0.1:9999/v1/models/a:predict" in engine.curl_line("a")
    assert engine.metrics_url() == "http://127.0.0.1:9999/metrics"
    assert engine.stop_command() == f"python -m serving stop --engine kserve --run-dir {tmp_path}"
    assert engine.pid_file == tmp_path.absolute() / "kserve.pgid"
