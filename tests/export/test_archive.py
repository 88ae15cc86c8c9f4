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
