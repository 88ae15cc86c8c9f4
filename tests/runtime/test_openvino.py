"""runtime/openvino.py on a real OpenVINO IR: a small CNN converted from its ONNX file as the exporter does it
(openvino.convert_model + save_model, fp32 weights), run like eager, its options and errors, and the precision it
reports having run in."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from export.forms.openvino_ir import ir_files, save_ir
from export.forms.tolerances import OPENVINO_TOLERANCE
from runtime import ArtifactError, RunOptions, open_artifact
from runtime.eager import EagerBackend
from runtime.openvino import OpenVinoBackend, compile_config
from tests.runtime.test_backends import Tiny

openvino = pytest.importorskip("openvino")


def tiny_onnx(folder: Path, size: tuple = (1, 3, 16, 16)) -> tuple[torch.nn.Module, Path]:
    """The small CNN (seeded) and its ONNX file with a dynamic batch, as the legacy exporter writes it."""
    torch.manual_seed(0)
    module = Tiny().eval()
    onnx_path = folder / "tiny.onnx"
    torch.onnx.export(module, (torch.rand(size),), str(onnx_path), dynamo=False, input_names=["input"],
                      output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    return module, onnx_path


@pytest.fixture(scope="module")
def ir(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("openvino")
    module, onnx_path = tiny_onnx(folder)
    save_ir(openvino.convert_model(str(onnx_path)), folder / "tiny.openvino.xml")
    return {"module": module, "xml": folder / "tiny.openvino.xml", "folder": folder}


def test_the_ir_runs_like_eager_within_its_tolerance(ir):
    backend = open_artifact("openvino", ir["xml"], RunOptions(threads=1), name="mine")
    assert type(backend) is OpenVinoBackend and backend.name == "mine"
    for batch in (1, 3):  # one request, reused, with another batch size
        x = torch.rand(batch, 3, 16, 16, generator=torch.Generator().manual_seed(batch))
        got = backend(x)
        assert got.dtype == torch.float32 and got.shape == (batch, 5)
        torch.testing.assert_close(got, EagerBackend(ir["module"]).predict(x), atol=OPENVINO_TOLERANCE.atol,
                                   rtol=OPENVINO_TOLERANCE.rtol)
    described = backend.describe()
    assert described["format"] == "openvino" and described["actual_precision"] == "fp32"
    assert described["threads_used"] == 1 and described["openvino"] == openvino.get_version()
    # unpinned, read back from the compiled model: pinned, every worker process ran on the same first core
    assert described["cpu_pinning"] is False


def test_the_precision_hint_is_always_explicit_and_threads_map_to_openvino():
    assert compile_config(RunOptions()) == {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
                                            "ENABLE_CPU_PINNING": False}
    assert compile_config(RunOptions(threads=2, precision="bf16"))["INFERENCE_PRECISION_HINT"] == "bf16"
    assert compile_config(RunOptions(threads=2))["INFERENCE_NUM_THREADS"] == 2


def test_describe_reports_the_precision_it_actually_runs_in(ir):
    backend = open_artifact("openvino", ir["xml"], RunOptions(threads=1, precision="bf16"))
    # OpenVINO's own word on this CPU (not our reading of its flags): without native bf16 it ignores the hint and
    # runs f32, and what ran is reported, not what was asked
    native = "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    assert backend.describe()["actual_precision"] == ("bf16" if native else "fp32")
    assert backend.describe()["precision"] == "bf16"


def test_a_gpu_or_fp16_is_a_clear_error(ir):
    with pytest.raises(ArtifactError, match="on the CPU here"):
        open_artifact("openvino", ir["xml"], RunOptions(device="cuda"))
    with pytest.raises(ArtifactError, match="runs fp32, bf16, not fp16"):
        open_artifact("openvino", ir["xml"], RunOptions(precision="fp16"))


def test_missing_weights_are_named(ir, tmp_path):
    xml, _ = ir_files(ir["xml"])
    shutil.copy(xml, tmp_path / xml.name)
    with pytest.raises(ArtifactError, match="tiny.openvino.bin"):
        open_artifact("openvino", tmp_path / xml.name, RunOptions())


RELEASE_OUT_OF_ORDER = """
import gc, os, signal, sys
from runtime import RunOptions, open_artifact
first = open_artifact("openvino", sys.argv[1], RunOptions(threads=1))
second = open_artifact("openvino", sys.argv[1], RunOptions(threads=1))
del first; gc.collect()
del second; gc.collect()  # the plugin puts back the stack it replaced: the first model's, freed above
handled = []
signal.signal(signal.SIGUSR1, lambda *_: handled.append(True))  # Python's handlers run on the alternate stack
os.kill(os.getpid(), signal.SIGUSR1)
print("handled" if handled else "not handled")
"""


def test_a_signal_after_models_are_released_out_of_order_is_handled_not_a_crash(ir):
    """OpenVINO's plugin gives each compiled model's thread a signal stack that the model frees: released in the
    order they were made, two models left the thread on a freed one and the next signal ended the process with
    SIGSEGV (runtime/signal_stack.py). In a process of its own, since without the fix it dies."""
    import subprocess
    import sys

    from tests.conftest import ROOT
    ran = subprocess.run([sys.executable, "-c", RELEASE_OUT_OF_ORDER, str(ir["xml"])], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 0 and ran.stdout.strip() == "handled", (ran.returncode, ran.stderr[-2000:])
