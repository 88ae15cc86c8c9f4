"""The archive's model-config: only what the user pins; handler settings in their own section."""

import pytest
import yaml

from export.archive import COMMON_CONFIG, model_config_yaml
from export.errors import ExportError


def test_model_config_routes_handler_settings_and_pins_only_what_was_asked():
    config = yaml.safe_load(model_config_yaml("onnx-traced", {"threads": 4, "batchSize": 2}))
    assert config["handler"] == {"topk": 5, "fp16": False, "artifact": "onnx-traced", "threads": 4}
    assert config["batchSize"] == 2 and "threads" not in config
    assert not {"minWorkers", "maxWorkers"} & set(config)  # the serving machine decides those
    assert {k: config[k] for k in COMMON_CONFIG} == COMMON_CONFIG


def test_unknown_model_config_key_is_refused():
    with pytest.raises(ExportError, match="unknown model-config keys batch_size"):
        model_config_yaml("onnx-traced", {"batch_size": 2})


def _manifest_with_failed_int8():
    from export.manifest import Manifest
    from export.selection import decide, Candidate
    size = (3, 224, 224)
    serving = decide([Candidate("onnx-dynamo", True, (), True, size),
                      Candidate("onnx-int8", True, (), False, size, gate="failed: top-1 agreement 94.5% < 98.0%"),
                      Candidate("traced", False, (), False, size)], size)
    return Manifest({"name": "m"}, {}, {"preprocessing": {"resize": 232}}, {}, 18,
                    artifacts={"onnx-dynamo": {}, "onnx-int8": {}, "traced": {}}, serving=serving)


def test_a_gate_failed_variant_is_refused_unless_the_benchmark_asks_for_its_speed_only():
    from export.archive import servable_artifact
    manifest = _manifest_with_failed_int8()
    assert servable_artifact(manifest, None) == "onnx-dynamo"
    with pytest.raises(ExportError, match="refusing to package 'onnx-int8': accuracy gate failed"):
        servable_artifact(manifest, "onnx-int8")
    assert servable_artifact(manifest, "onnx-int8", speed_only_ungated=True) == "onnx-int8"
    with pytest.raises(ExportError, match="failed parity"):  # the speed-only pass covers the gate, nothing else
        servable_artifact(manifest, "traced", speed_only_ungated=True)
