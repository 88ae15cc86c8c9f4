"""One refusal record for every form that cannot be made: the exception's type, its first meaningful line, the
model code's file:line, the traceback in export.log and one line on the terminal (export.refusals)."""

from __future__ import annotations

import importlib.util
import io
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from export import interrupt
from export.pipeline import Progress
from export.refusals import EXPORT_LOG, Refusals, describe, first_line, model_location
from tests.conftest import ROOT
from tests.export.user_models import USER_FILE
from tests.export.user_models.models_for_tests import Unscriptable


def _line_of(path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _error_of(call) -> BaseException:
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the test inspects whatever it raised
        return error
    pytest.fail("expected an error")


def test_torchscript_refusal_names_the_model_line_that_cannot_compile():
    refusal = describe(_error_of(lambda: torch.jit.script(Unscriptable())), "build", EXPORT_LOG)
    assert (refusal.step, refusal.error, refusal.log) == ("build", "RuntimeError", EXPORT_LOG)
    assert "has no attribute or method 'widen'" in refusal.message and "\n" not in refusal.message
    assert refusal.location == f"{USER_FILE}:{_line_of(USER_FILE, 'if self.settings.widen != 1:')}"
    assert refusal.line() == (f"build: RuntimeError: {refusal.message} at {refusal.location} "
                              f"(traceback in {EXPORT_LOG})")


def test_a_third_party_package_is_model_code_and_named_from_the_package_down():
    # Its own process: TorchScript keeps a failed class in its one compilation unit, so a second script of
    # lite0 in a process (the suite's in-process exports do one) fails with "Can't redefine method" instead.
    pytest.importorskip("efficientnet_lite_pytorch")
    script = ("import torch, efficientnet_lite_pytorch as e\n"
              "from export.refusals import describe\n"
              "try:\n    torch.jit.script(e.EfficientNet.from_name('efficientnet-lite0'))\n"
              "except Exception as error:\n    r = describe(error, 'build'); print(r.message); print(r.location)\n")
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, check=True)
    message, location = done.stdout.strip().splitlines()[-2:]
    assert "object has no attribute or method 'expand_ratio'" in message
    assert location.startswith("efficientnet_lite_pytorch/model.py:")


def test_without_a_line_in_the_message_the_innermost_frame_of_the_model_code_is_named(tmp_path):
    source = tmp_path / "user_code.py"
    source.write_text("def forward(x):\n    return helper(x)\n\ndef helper(x):\n    raise ValueError('odd size')\n")
    spec = importlib.util.spec_from_file_location("user_code", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    error = _error_of(lambda: module.forward(1))
    assert model_location(error) == f"{source}:5"


def test_a_wrapped_error_is_told_by_its_innermost_cause():
    def wrapped():
        try:
            {}["missing"]
        except KeyError as cause:
            raise RuntimeError("\x1b[31mthe same boilerplate for every model\x1b[0m") from cause
    refusal = describe(_error_of(wrapped), "build")
    assert refusal.error == "RuntimeError" and refusal.message == "KeyError: 'missing'"
    assert first_line("\n\n  ---\n\x1b[1mreal reason:\x1b[0m\nmore") == "real reason"


def test_refusals_print_one_line_each_and_keep_the_traceback_in_the_log(tmp_path):
    stream = io.StringIO()
    refusals = Refusals(tmp_path, Progress(stream))
    refusals.refuse("scripted", "build", _error_of(lambda: torch.jit.script(Unscriptable())))
    refusals.skip("onnx-scripted", "needs", "made from scripted, which was not made")
    lines = stream.getvalue().strip().splitlines()
    assert len(lines) == 2 and "scripted NOT MADE, build: RuntimeError:" in lines[0]
    assert lines[1].endswith("onnx-scripted NOT MADE, needs: made from scripted, which was not made")
    log = (tmp_path / EXPORT_LOG).read_text()
    assert log.startswith("--- scripted refused at build\nTraceback (most recent call last):")
    assert "onnx-scripted" not in log and refusals.records["onnx-scripted"].log == ""


def test_ctrl_c_that_an_exporter_turned_into_another_exception_still_stops_the_export(tmp_path):
    interrupt.watch()
    try:
        try:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # the handler raises KeyboardInterrupt here
            except KeyboardInterrupt:
                raise RuntimeError("an exporter's C++ rethrew the interrupt as its own error") from None
        except RuntimeError as swallowed:
            with pytest.raises(KeyboardInterrupt):  # not recorded as the form's refusal: the export stops
                Refusals(tmp_path, Progress(quiet=True)).refuse("traced", "build", swallowed)
            with pytest.raises(KeyboardInterrupt):
                Progress(quiet=True).step("the next step")
    finally:
        interrupt.watch()  # clears the flag for the tests after this one
        signal.signal(signal.SIGINT, signal.default_int_handler)
