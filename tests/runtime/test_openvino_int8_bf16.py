"""runtime/openvino.py on an int8 IR under the bf16 hint (openvino-int8-bf16): a small CNN quantized by NNCF with its
head left in floating point (as NNCF's accuracy control leaves the layers it reverts), read back from OpenVINO's
own execution graph: the quantized convolution runs in u8 under either hint, and the head in bf16 under the bf16
hint where OpenVINO says this CPU computes in bf16 (in f32 elsewhere, as it runs a bf16 hint without it)."""

from __future__ import annotations

import pytest
import torch

from export.forms.openvino_ir import save_ir
from runtime import RunOptions, open_artifact
from tests.runtime.test_openvino import tiny_onnx

openvino = pytest.importorskip("openvino")
nncf = pytest.importorskip("nncf")

SIZE = (1, 3, 16, 16)


@pytest.fixture(scope="module")
def int8_ir(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("openvino-int8")
    module, onnx_path = tiny_onnx(folder, SIZE)
    images = [torch.rand(SIZE, generator=torch.Generator().manual_seed(i)).numpy() for i in range(16)]
    quantized = nncf.quantize(openvino.convert_model(str(onnx_path)), nncf.Dataset(images), subset_size=len(images),
                              ignored_scope=nncf.IgnoredScope(types=["MatMul"]))  # the head stays in floating point
    save_ir(quantized, folder / "tiny.int8.openvino.xml")
    return {"module": module, "xml": folder / "tiny.int8.openvino.xml"}


def ran_in(backend) -> dict[str, str]:
    """OpenVINO's execution graph: each compute layer type -> the precision it runs in."""
    layers = {}
    for op in backend.compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        layers[info["layerType"].astype(str)] = info["runtimePrecision"].astype(str)
    return {layer: layers[layer] for layer in ("Convolution", "FullyConnected")}


def test_under_the_bf16_hint_the_int8_layers_stay_int8_and_the_remainder_runs_in_bf16_where_native(int8_ir):
    native = "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")  # OpenVINO's own word
    as_f32 = open_artifact("openvino", int8_ir["xml"], RunOptions(threads=1))
    as_bf16 = open_artifact("openvino", int8_ir["xml"], RunOptions(threads=1, precision="bf16"))
    assert ran_in(as_f32) == {"Convolution": "u8", "FullyConnected": "f32"}
    assert ran_in(as_bf16) == {"Convolution": "u8", "FullyConnected": "bf16" if native else "f32"}
    assert as_bf16.describe()["actual_precision"] == ("bf16" if native else "fp32")
    x = torch.rand(4, *SIZE[1:], generator=torch.Generator().manual_seed(99))
    # bf16 keeps 8 bits of mantissa: the head's answers move by about int8's own rounding, no more
    torch.testing.assert_close(as_bf16(x), as_f32(x), atol=0.05, rtol=0.05)
