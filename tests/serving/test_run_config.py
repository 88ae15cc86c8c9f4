"""`python -m serving` decides the policy for the machine it runs on (serving/settings.py) and writes it into
TorchServe's config (`python -m serving config`)."""

import json

import pytest
import torch

from handlers.policy import GPU_BATCH_SIZE, machine_policy
from serving import cli
from serving.settings import ServingError, decide_policy
from serving.torchserve.config import CPU_JVM_FLAGS, LOG_CONFIG, LOG_CONFIG_FLAG, ServerSettings, run_config_text
from serving.torchserve.engine import TorchServe


def parse(argv: list[str]):
    return cli.parser_for(TorchServe).parse_args(argv)


def models_setting(text: str) -> dict:
    line = next(l for l in text.splitlines() if l.startswith("models="))
    return json.loads(line.split("=", 1)[1])


def test_the_config_carries_the_policy_for_the_model():
    policy = machine_policy(gpus=0, cores=2)
    text = run_config_text(ServerSettings(model_name="resnet"), policy)
    setting = models_setting(text)["resnet"]["1.0"]
    assert setting["marName"] == "resnet.mar" and setting["defaultVersion"] is True
    assert (setting["minWorkers"], setting["maxWorkers"], setting["batchSize"]) == (2, 2, 1)
    assert "inference_address=http://127.0.0.1:8080" in text  # the base config is kept


def test_a_gpu_host_gets_the_gpu_policy_whatever_machine_exported(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    policy = decide_policy(parse([]))
    assert policy.device == "gpu" and policy.batch_size == GPU_BATCH_SIZE and policy.workers == 1


def test_command_line_overrides_and_their_validation():
    policy = decide_policy(parse(["--workers", "1", "--batch-size", "4"]))
    assert (policy.workers, policy.batch_size) == (1, 4)
    with pytest.raises(ServingError, match="--workers must be at least 1, got 0"):
        decide_policy(parse(["--workers", "0"]))


def store_with(folder, *names: str):
    """A model store holding NAME.mar files: `config` only lists the store, it does not open the archives."""
    folder.mkdir()
    for name in names:
        (folder / f"{name}.mar").write_bytes(b"")
    return folder


def test_config_action_writes_every_archive_of_the_store_and_needs_out(tmp_path, capsys):
    store, out = store_with(tmp_path / "store", "resnet18", "resnet50"), tmp_path / "config.properties"
    assert cli.main(["config", "--model-store", str(store), "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"{out}: resnet18, resnet50; ")
    models = models_setting(out.read_text())
    assert sorted(models) == ["resnet18", "resnet50"] and models["resnet18"]["1.0"]["marName"] == "resnet18.mar"
    assert all(setting["1.0"]["minWorkers"] >= 1 for setting in models.values())
    assert "load_models=resnet18=resnet18.mar,resnet50=resnet50.mar" in out.read_text().splitlines()
    assert cli.main(["config", "--model-store", str(store)]) == 1
    assert "error: `python -m serving config` needs --out PATH" in capsys.readouterr().err


def test_models_chooses_among_the_archives_and_names_the_missing_one(tmp_path, capsys):
    store, out = store_with(tmp_path / "store", "resnet18", "resnet50"), tmp_path / "config.properties"
    assert cli.main(["config", "--model-store", str(store), "--models", "resnet50", "--out", str(out)]) == 0
    assert list(models_setting(out.read_text())) == ["resnet50"]
    assert "load_models=resnet50=resnet50.mar" in out.read_text().splitlines()
    capsys.readouterr()
    assert cli.main(["config", "--model-store", str(store), "--models", "resnet50,vgg16", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "vgg16.mar not in" in err and "resnet18, resnet50" in err


@pytest.mark.parametrize("engine", ["torchserve", "kserve"])
def test_an_empty_store_says_to_export_first(tmp_path, capsys, engine):
    store = store_with(tmp_path / "store")
    assert cli.main(["--engine", engine, "--model-store", str(store), "--detach"]) == 1
    err = capsys.readouterr().err
    assert "no archive (*.mar) in" in err and "run `python -m export resnet` first" in err


def vmargs(text: str) -> str:
    lines = [l for l in text.splitlines() if l.startswith("vmargs=")]
    assert len(lines) == 1, lines
    return lines[0].split("=", 1)[1]


def test_a_cpu_host_gets_the_lean_jvm_and_our_log_configuration():
    text = run_config_text(ServerSettings(model_name="resnet"), machine_policy(gpus=0, cores=2))
    flags = vmargs(text).split()
    assert set(CPU_JVM_FLAGS) <= set(flags)
    assert f"{LOG_CONFIG_FLAG}{LOG_CONFIG.as_uri()}" in flags and LOG_CONFIG.is_file()


def test_a_gpu_host_keeps_the_jvm_defaults_and_a_config_of_its_own_wins(tmp_path):
    assert vmargs(run_config_text(ServerSettings(model_name="resnet"), machine_policy(gpus=1, cores=8))) == \
        f"{LOG_CONFIG_FLAG}{LOG_CONFIG.as_uri()}"
    own = tmp_path / "config.properties"
    own.write_text("inference_address=http://127.0.0.1:8080\nvmargs=-Xmx2g -Dlog4j.configurationFile=mine.xml\n")
    text = run_config_text(ServerSettings(model_name="resnet", config=own), machine_policy(gpus=0, cores=2))
    assert vmargs(text) == "-Xmx2g -Dlog4j.configurationFile=mine.xml"


def test_our_log_configuration_drops_debug_and_per_request_echoes_but_keeps_the_files():
    import xml.etree.ElementTree as ElementTree
    root = ElementTree.parse(LOG_CONFIG).getroot()
    files = {a.get("fileName").rsplit("/", 1)[1] for a in root.iter("RollingFile")}
    assert files == {"access_log.log", "model_log.log", "model_metrics.log", "ts_log.log", "ts_metrics.log"}
    loggers = {l.get("name"): l for l in root.iter("Logger")}
    assert loggers["org.pytorch.serve"].get("level") == "info"
    assert [r.get("ref") for r in loggers["MODEL_LOG"].iter("AppenderRef")] == ["model_log"]
    denied = {f.get("regex") for f in root.iter("RegexFilter") if f.get("onMatch") == "DENY"}
    assert denied == {r"result=\{\}, pattern=\{\}", r"Backend response time: \{\}", r"Sending response for jobId \{\}"}
