"""Validators built from the real schemas: KServe's Python SDK models, Kubernetes' OpenAPI (through
kubernetes-validate), and Triton's ModelConfig protobuf as shipped with tritonclient."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import kubernetes_validate
from google.protobuf import text_format

KUBERNETES_VERSION = kubernetes_validate.latest_version()
PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}


def _model_class(name: str):
    import kserve.models
    import kubernetes.client.models
    for module in (kserve.models, kubernetes.client.models):
        if hasattr(module, name):
            return getattr(module, name)
    raise AssertionError(f"no SDK model named {name}")


def to_sdk_model(data, type_name: str, where: str = "$"):
    """Build the SDK object for `data`, refusing unknown keys and wrong types at every level."""
    if type_name in PRIMITIVES:
        assert isinstance(data, PRIMITIVES[type_name]), f"{where}: expected {type_name}, got {data!r}"
        return data
    if match := re.fullmatch(r"(?:list|List)\[(.+)\]", type_name):
        assert isinstance(data, list), f"{where}: expected a list"
        return [to_sdk_model(item, match.group(1), f"{where}[{i}]") for i, item in enumerate(data)]
    if match := re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", type_name):
        assert isinstance(data, dict), f"{where}: expected a mapping"
        value_type = match.group(1) or match.group(2)
        return {k: to_sdk_model(v, value_type, f"{where}.{k}") for k, v in data.items()}
    cls = _model_class(type_name)
    assert isinstance(data, dict), f"{where}: expected a {type_name} mapping"
    attribute = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    unknown = sorted(set(data) - set(attribute))
    assert not unknown, f"{where}: {type_name} has no field(s) {unknown}"
    values = {attribute[k]: to_sdk_model(v, cls.openapi_types[attribute[k]], f"{where}.{k}") for k, v in data.items()}
    return cls(**values)  # the SDK's own constructor checks required fields


def validate_inference_service(document: dict):
    service = to_sdk_model(document, "V1beta1InferenceService")
    assert service.api_version == "serving.kserve.io/v1beta1" and service.kind == "InferenceService"
    return service


def validate_kubernetes(document: dict) -> None:
    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def triton_model_config_class():
    """tritonclient's model_config_pb2, loaded alone: its grpc package registers protos that clash with
    KServe's in one process, and only the ModelConfig schema is needed here."""
    import tritonclient
    path = Path(tritonclient.__file__).parent / "grpc" / "model_config_pb2.py"
    spec = importlib.util.spec_from_file_location("triton_model_config_pb2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ModelConfig


def parse_model_config(text: str):
    config = triton_model_config_class()()
    text_format.Parse(text, config)  # unknown fields or wrong types raise ParseError
    return config
