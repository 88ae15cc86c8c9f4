"""TorchServe's own gRPC APIs, as a client of them: the stubs compiled (grpcio-tools) from the .proto files its
frontend jar ships, so that tests call its gRPC inference and management ports as users' gRPC clients do."""

from __future__ import annotations

import importlib
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import grpc

PROTOS = ("inference.proto", "management.proto")
TIMEOUT_S = 60
LIST_LIMIT = 100  # proto3 sends an unset limit as 0, which TorchServe reads as "none"


def _jar() -> Path:
    import ts
    return Path(ts.__file__).parent / "frontend" / "model-server.jar"


def compiled(folder: Path) -> dict[str, ModuleType]:
    """{proto's stem: its *_pb2_grpc module}, compiled once into folder from the jar's protos."""
    import google.rpc
    import grpc_tools
    from grpc_tools import protoc
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(_jar()) as jar:
        for name in PROTOS:
            (folder / name).write_bytes(jar.read(f"proto/{name}"))
    includes = [folder, Path(grpc_tools.__file__).parent / "_proto", Path(list(google.rpc.__path__)[0]).parents[1]]  # google/rpc/status.proto
    for name in PROTOS:
        status = protoc.main(["protoc", *(f"-I{path}" for path in includes), f"--python_out={folder}",
                              f"--grpc_python_out={folder}", str(folder / name)])
        assert status == 0, f"protoc could not compile TorchServe's {name}"
    sys.path.insert(0, str(folder))
    try:
        return {Path(name).stem: importlib.import_module(f"{Path(name).stem}_pb2_grpc") for name in PROTOS}
    finally:
        sys.path.remove(str(folder))


def predict(stubs: dict, port: int, model: str, photo: bytes, key: str | None = None) -> bytes:
    """The gRPC Predictions call's answer (raises grpc.RpcError when TorchServe refuses it)."""
    inference = importlib.import_module("inference_pb2")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = stubs["inference"].InferenceAPIsServiceStub(channel)
        request = inference.PredictionsRequest(model_name=model, input={"data": photo})
        return stub.Predictions(request, timeout=TIMEOUT_S, metadata=_metadata(key)).prediction


def list_models(stubs: dict, port: int, key: str | None = None) -> str:
    """The gRPC ListModels call's message (raises grpc.RpcError when TorchServe refuses it)."""
    management = importlib.import_module("management_pb2")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = stubs["management"].ManagementAPIsServiceStub(channel)
        return stub.ListModels(management.ListModelsRequest(limit=LIST_LIMIT), timeout=TIMEOUT_S, metadata=_metadata(key)).msg


def _metadata(key: str | None) -> tuple:
    return (("authorization", f"Bearer {key}"),) if key else ()
