"""`python -m serving` resolves each model's policy for the machine it runs on, with its archive's pins and the
command's flags (serving/settings.py, contract/policy.py), and writes it into TorchServe's config, its run config
(`python -m serving config`): TorchServe's `models=` keys and the line the handler reads as it is."""

import json
import subprocess
import sys
import zipfile

import pytest
import torch
import yaml

from contract.policy import GPU_BATCH_SIZE, PINNED, Machine, PolicyChoices, PolicyError
from handlers.policy import machine_policy, policies_in
from serving import cli
from serving.torchserve.config import CPU_JVM_FLAGS, LOG_CONFIG, LOG_CONFIG_FLAG, ServerSettings, run_config_text
from serving.torchserve.engine import TorchServe
from tests.conftest import ROOT


def parse(argv: list[str]):
    return cli.parser_for(TorchServe).parse_args(argv)


def resolved(argv: list[str], store, *models: str):
    """The policies `python -m serving ARGV` resolves for models of store."""
    settings = ServerSettings(model_store=store, models=models, flags=PolicyChoices.from_flags(parse(argv)))
    return settings.resolve_policies()


def models_setting(text: str) -> dict:
    line = next(row for row in text.splitlines() if row.startswith("models="))
    return json.loads(line.split("=", 1)[1])


def test_the_config_carries_the_policy_for_the_model():
    policy = machine_policy(gpus=0, cores=2)
    text = run_config_text(ServerSettings(model_name="resnet", policy=policy))
    setting = models_setting(text)["resnet"]["1.0"]
    assert setting["marName"] == "resnet.mar" and setting["defaultVersion"] is True
    assert (setting["minWorkers"], setting["maxWorkers"], setting["batchSize"]) == (2, 2, 1)
    assert "inference_address=http://127.0.0.1:8080" in text  # the base config is kept


def test_the_config_holds_each_policy_with_its_reasons_for_the_handler(tmp_path):
    policy = machine_policy(gpus=0, cores=2)
    run_config = tmp_path / "config.properties"
    run_config.write_text(run_config_text(ServerSettings(model_name="resnet", policy=policy)))
    assert policies_in(run_config) == {"resnet": policy}  # what the handler reads, as it is
    assert "#   resnet: workers 2: one per CPU core, 2 cores" in run_config.read_text().splitlines()


def test_a_gpu_host_gets_the_gpu_policy_whatever_machine_exported(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    policy = resolved([], store_with(tmp_path / "store", "resnet"), "resnet")["resnet"]
    assert policy.device == "gpu" and policy.batch_size == GPU_BATCH_SIZE and policy.workers == 1


def test_command_line_overrides_and_their_validation(tmp_path):
    policy = resolved(["--workers", "1", "--batch-size", "4"], store_with(tmp_path / "store", "resnet"), "resnet")
    assert (policy["resnet"].workers, policy["resnet"].batch_size) == (1, 4)
    assert policy["resnet"].reasons["workers"] == "--workers"
    with pytest.raises(PolicyError, match="--workers must be at least 1, got 0"):
        PolicyChoices.from_flags(parse(["--workers", "0"]))


def test_an_archives_pins_win_over_the_command_line_for_that_model_only(tmp_path):
    store = store_with(tmp_path / "store", "plain", pinned={"batchSize": 2, "handler": {"threads": 1}})
    policies = resolved(["--batch-size", "4"], store, "plain", "pinned")
    assert (policies["plain"].batch_size, policies["pinned"].batch_size) == (4, 2)
    assert policies["pinned"].reasons["batch_size"] == PINNED and policies["pinned"].threads_per_worker == 1


def store_with(folder, *names: str, **pinned: dict):
    """A model store of NAME.mar archives holding only a model-config.yaml (`config` reads their pins there);
    pinned: NAME=model-config of an archive that pins values."""
    folder.mkdir()
    for name, config in {**{name: {} for name in names}, **pinned}.items():
        with zipfile.ZipFile(folder / f"{name}.mar", "w") as archive:
            archive.writestr("model-config.yaml", yaml.safe_dump(config))
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


def test_config_action_applies_each_archives_pins(tmp_path, capsys):
    store, out = store_with(tmp_path / "store", "plain", pinned={"minWorkers": 1}), tmp_path / "config.properties"
    assert cli.main(["config", "--model-store", str(store), "--threads", "1", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "pinned: " in said and "workers 1: the archive pins it" in said and "threads 1: --threads" in said
    assert models_setting(out.read_text())["pinned"]["1.0"]["minWorkers"] == 1
    assert policies_in(out)["pinned"].reasons["workers"] == PINNED


def test_an_archive_that_is_not_a_zip_pins_nothing_and_is_left_to_the_engine_to_refuse(tmp_path):
    """A truncated archive is TorchServe's to refuse, with its own reason (tests/e2e/test_integrity.py)."""
    store = store_with(tmp_path / "store", "plain")
    (store / "plain.mar").write_bytes(b"not a zip")
    settings = ServerSettings(model_store=store, models=("plain",))
    assert settings.resolve_policies(Machine(gpus=0, cores=2)) == {"plain": machine_policy(gpus=0, cores=2)}


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
    lines = [row for row in text.splitlines() if row.startswith("vmargs=")]
    assert len(lines) == 1, lines
    return lines[0].split("=", 1)[1]


def test_a_cpu_host_gets_the_lean_jvm_and_our_log_configuration():
    text = run_config_text(ServerSettings(model_name="resnet", policy=machine_policy(gpus=0, cores=2)))
    flags = vmargs(text).split()
    assert set(CPU_JVM_FLAGS) <= set(flags)
    assert f"{LOG_CONFIG_FLAG}{LOG_CONFIG.as_uri()}" in flags and LOG_CONFIG.is_file()


def test_a_gpu_host_keeps_the_jvm_defaults_and_a_config_of_its_own_wins(tmp_path):
    assert vmargs(run_config_text(ServerSettings(model_name="resnet", policy=machine_policy(gpus=1, cores=8)))) == \
        f"{LOG_CONFIG_FLAG}{LOG_CONFIG.as_uri()}"
    own = tmp_path / "config.properties"
    own.write_text("inference_address=http://127.0.0.1:8080\nvmargs=-Xmx2g -Dlog4j.configurationFile=mine.xml\n")
    text = run_config_text(ServerSettings(model_name="resnet", config=own, policy=machine_policy(gpus=0, cores=2)))
    assert vmargs(text) == "-Xmx2g -Dlog4j.configurationFile=mine.xml"


def test_our_log_configuration_drops_debug_and_per_request_echoes_but_keeps_the_files():
    import xml.etree.ElementTree as ElementTree
    root = ElementTree.parse(LOG_CONFIG).getroot()
    files = {a.get("fileName").rsplit("/", 1)[1] for a in root.iter("RollingFile")}
    assert files == {"access_log.log", "model_log.log", "model_metrics.log", "ts_log.log", "ts_metrics.log"}
    loggers = {logger.get("name"): logger for logger in root.iter("Logger")}
    assert loggers["org.pytorch.serve"].get("level") == "info"
    assert [r.get("ref") for r in loggers["MODEL_LOG"].iter("AppenderRef")] == ["model_log"]
    denied = {f.get("regex") for f in root.iter("RegexFilter") if f.get("onMatch") == "DENY"}
    assert denied == {r"result=\{\}, pattern=\{\}", r"Backend response time: \{\}", r"Sending response for jobId \{\}"}


CONFIG_THEN_MODULES = """
import json, sys
from serving import cli
code = cli.main(sys.argv[1:])
print(json.dumps({"code": code, "torch": sorted(name for name in sys.modules if name.split(".")[0] == "torch")}))
"""


def test_the_command_resolves_its_policies_without_importing_torch(tmp_path):
    """`python -m serving` decides each model's policy before it launches the server, which does the work: the
    machine's GPUs are asked of the driver, not of torch, whose import would delay every start."""
    store, out = store_with(tmp_path / "store", "resnet50"), tmp_path / "config.properties"
    done = subprocess.run([sys.executable, "-c", CONFIG_THEN_MODULES, "config", "--model-store", str(store),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"code": 0, "torch": []}, done.stderr[-2000:]
    assert models_setting(out.read_text())["resnet50"]["1.0"]["minWorkers"] >= 1
