"""The archive's model-config (only what the user pins; handler settings in their own section, never the
artifact) and the manifest it ships (the export's serving decision, or the same rule re-applied)."""

from pathlib import Path

import pytest
import yaml

from contract.handler_config import HandlerConfig
from contract.records import (
    ArtifactRecord,
    ContractError,
    ImageContract,
    InputRecord,
    Manifest,
    ModelInfo,
    OutputRecord,
)
from export.errors import ExportError
from export.package.archive import COMMON_CONFIG, ArchiveRequest, archived_manifest, model_config_yaml
from export.package.selection import Candidate, decide

SIZE = (3, 224, 224)


def test_model_config_routes_handler_settings_and_pins_only_what_was_asked():
    config = yaml.safe_load(model_config_yaml({"threads": 4, "batchSize": 2}))
    assert config["handler"] == {"topk": 5, "fp16": False, "threads": 4, "simulate_hang_s": 0.0}
    assert set(config["handler"]) <= set(HandlerConfig.keys())
    assert "artifact" not in config["handler"]  # the served artifact is the archived manifest's decision
    assert config["batchSize"] == 2 and "threads" not in config
    assert not {"minWorkers", "maxWorkers"} & set(config)  # the serving machine decides those
    assert {k: config[k] for k in COMMON_CONFIG} == COMMON_CONFIG
    assert HandlerConfig.from_dict(config["handler"]) == HandlerConfig(threads=4)


def test_unknown_model_config_key_is_refused():
    with pytest.raises(ExportError, match="unknown model-config keys batch_size"):
        model_config_yaml({"batch_size": 2})
    with pytest.raises(ExportError, match="unknown model-config keys artifact"):  # the manifest decides that
        model_config_yaml({"artifact": "traced"})


def _record(kind: str, precision: str = "fp32") -> ArtifactRecord:
    return ArtifactRecord(kind=kind, path=f"{kind}.file", sha256="0" * 64, bytes=1, format="onnx", exporter="test",
                          spatial_dynamic=True, accepts="any", precision=precision)


RESNET_CONTRACT = ImageContract(232, (224, 224))


def _manifest_with_failed_int8(preprocessing=RESNET_CONTRACT) -> Manifest:
    serving = decide([Candidate("onnx-dynamo", True, (), True, SIZE),
                      Candidate("onnx-int8", True, (), False, SIZE, gate="failed: top-1 agreement 94.5% < 98.0%"),
                      Candidate("traced", False, (), False, SIZE)], SIZE)
    return Manifest(model=ModelInfo("m", "test", "a hand-made manifest"), weights={},
                    input=InputRecord(example_shape=(1, *SIZE), preprocessing=preprocessing),
                    output=OutputRecord(shape=["batch", 10]), opset=18,
                    artifacts={"onnx-dynamo": _record("onnx-dynamo"), "onnx-int8": _record("onnx-int8", "int8"),
                               "traced": _record("traced")}, serving=serving)


def _served(manifest: Manifest, artifact=None, speed_only_ungated=False) -> Manifest:
    return archived_manifest(manifest, ArchiveRequest(Path("store"), None, {}, artifact, speed_only_ungated))


def test_a_gate_failed_variant_is_refused_unless_the_benchmark_asks_for_its_speed_only():
    manifest = _manifest_with_failed_int8()
    assert _served(manifest).served_record().kind == "onnx-dynamo"
    with pytest.raises(ExportError, match="refusing to serve 'onnx-int8': accuracy gate failed"):
        _served(manifest, "onnx-int8")
    speed_only = _served(manifest, "onnx-int8", speed_only_ungated=True)
    assert speed_only.served_record().kind == "onnx-int8" and speed_only.decision().speed_only
    assert manifest.decision().served == "onnx-dynamo"  # the export's own decision is left as it was
    with pytest.raises(ExportError, match="failed parity"):  # the speed-only pass covers the gate, nothing else
        _served(manifest, "traced", speed_only_ungated=True)


def test_a_model_without_an_image_contract_is_not_archived_for_the_image_handler():
    with pytest.raises(ContractError, match="takes no RGB image input"):
        _served(_manifest_with_failed_int8(preprocessing=None))
