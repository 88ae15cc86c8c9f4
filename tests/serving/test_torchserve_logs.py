"""What `python -m serving` reads from TorchServe's logs when a model will not load, as our log4j2.xml lays them out:
worker lines (a dying worker, the handler's error) in model_log.log only, the frontend's in ts_log.log."""

from serving.torchserve.logs import exit_reason, load_failure

WORKER_DIED = ("2026-01-01T00:00:00,000 [INFO ] W-9000-m_1.0-stdout MODEL_LOG - Backend worker process died.\n"
               "2026-01-01T00:00:00,000 [INFO ] W-9000-m_1.0-stdout MODEL_LOG - ValueError: no labels\n")
LOAD_FAILED = "2026-01-01T00:00:00,000 [WARN ] W-9000-m_1.0 org.pytorch.serve.wlm.BatchAggregator - Load model failed: m, error: Worker died.\n"


def test_a_worker_that_fails_twice_is_a_verdict_with_the_handlers_error(tmp_path):
    (tmp_path / "model_log.log").write_text(WORKER_DIED)
    (tmp_path / "ts_log.log").write_text("")
    assert load_failure(tmp_path) is None  # one death: TorchServe retries
    (tmp_path / "ts_log.log").write_text(LOAD_FAILED)
    assert load_failure(tmp_path) == "ValueError: no labels"
    assert exit_reason(tmp_path) == "ValueError: no labels"


def test_nothing_written_yet_says_nothing(tmp_path):
    assert load_failure(tmp_path) is None
