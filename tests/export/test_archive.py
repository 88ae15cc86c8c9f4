"""The archive's model-config: serving policy by device, handler settings in their section."""

import yaml

from export.archive import GPU_SERVING, cpu_serving, default_serving, model_config_yaml


def test_model_config_routes_handler_settings_and_picks_policy_by_device():
    config = yaml.safe_load(model_config_yaml("onnx-traced", {"threads": 4, "batchSize": 2}))
    assert config["handler"] == {"topk": 5, "fp16": False, "artifact": "onnx-traced", "threads": 4}
    assert config["batchSize"] == 2 and "threads" not in config
    assert default_serving(cuda_available=True)["batchSize"] == GPU_SERVING["batchSize"] == 8
    assert default_serving(cuda_available=False)["batchSize"] == 1
    assert cpu_serving(cores=2)["maxWorkers"] == 2 and cpu_serving(cores=64)["maxWorkers"] == 4
