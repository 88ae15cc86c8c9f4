"""TorchScriptTaps on real artifacts: resnet18 (random weights) and a small model of this file, traced and
scripted, saved and loaded back as the exporters write them; checked against eager PyTorch's taps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

from export.divergence.eager import EagerTaps
from export.divergence.taps import keep_all
from export.divergence.torchscript_taps import TorchScriptTaps

FORMS = ("trace", "script")
LEAVES = (nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d, nn.AdaptiveAvgPool2d, nn.Linear)


class CalledTwice(nn.Module):
    """One module called twice, functional ops in forward and a ModuleList (its modules called through an
    attribute that is never called itself): the keys and lines this file should get."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.ReLU()
        self.blocks = nn.ModuleList([nn.Conv2d(4, 4, 1) for _ in range(2)])
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        x = self.act(self.conv(x))  # marker: first act
        for block in self.blocks:
            x = block(x)  # marker: block
        x = x * 0.5 - 0.1  # marker: functional
        x = self.act(x)  # marker: second act
        return self.head(x.mean((2, 3)))  # marker: head


class InPlace(nn.Module):
    """bn's output is overwritten by the in-place ReLU right after it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


def saved_and_loaded(model: nn.Module, batch: torch.Tensor, form: str, folder: Path) -> TorchScriptTaps:
    """The artifact as export.forms.exporters writes it, read back as runtime/torchscript.py does."""
    with torch.no_grad():
        module = torch.jit.trace(model, batch, check_trace=False) if form == "trace" else torch.jit.script(model)
    path = folder / f"{form}.pt"
    torch.jit.save(module, str(path))
    return TorchScriptTaps.from_file(path)


def resnet18() -> nn.Module:
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    # EagerTaps keeps a module's output without a copy, so an in-place ReLU right after bn would overwrite
    # eager's bn value; ours are copied when made (test_in_place_ops_do_not_overwrite_taps).
    for module in model.modules():
        if isinstance(module, nn.ReLU):
            module.inplace = False
    return model


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    model, batch = resnet18(), torch.randn(1, 3, 64, 64)
    folder = tmp_path_factory.mktemp("resnet18")
    runners = {form: saved_and_loaded(model, batch, form, folder) for form in FORMS}
    with torch.inference_mode():
        output = model(batch)
    return model, batch, output, runners


@pytest.fixture(scope="module", params=FORMS)
def resnet_taps(resnet, request):
    model, batch, output, runners = resnet
    return model, batch, output, runners[request.param].taps(batch, keep_all)


def last_within(taps, key: str):
    """The comparator's rule: the last tap made in the module call `key` or in a module inside it."""
    within = [tap for tap in taps if key == "" or tap.key == key or tap.key.startswith(key + ".")]
    return within[-1] if within else None


def marked_line(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if line.endswith(f"# marker: {marker}"))


def test_every_key_is_a_module_of_the_model(resnet_taps):
    model, _, _, taps = resnet_taps
    paths = dict(model.named_modules())
    assert taps and all(tap.module in paths for tap in taps)


def test_leaf_modules_match_eager(resnet_taps):
    model, batch, _, taps = resnet_taps
    leaves = {path for path, module in model.named_modules() if isinstance(module, LEAVES)}
    eager = [tap for tap in EagerTaps(model).taps(batch, keep_all) if tap.module in leaves]
    assert "layer1.0.relu@1" in {tap.key for tap in eager}
    for reference in eager:
        found = last_within(taps, reference.key)
        assert found is not None, reference.key
        assert found.shape == reference.shape, reference.key
        torch.testing.assert_close(found.value, reference.value, atol=1e-5, rtol=0, msg=reference.key)


def test_the_last_tap_is_the_output(resnet_taps):
    _, _, output, taps = resnet_taps
    assert taps[-1].key == "fc"
    torch.testing.assert_close(taps[-1].value, output, atol=1e-5, rtol=0)
    torch.testing.assert_close(last_within(taps, "").value, output, atol=1e-5, rtol=0)


def test_sources_are_lines_of_resnet(resnet_taps):
    _, _, _, taps = resnet_taps
    in_resnet = [tap for tap in taps if tap.source.rpartition(":")[0].endswith("torchvision/models/resnet.py")]
    assert len(in_resnet) >= 0.9 * len(taps)
    assert all(tap.source.rpartition(":")[2].isdigit() for tap in in_resnet)
    by_key = {tap.key: tap for tap in taps}
    assert by_key["layer1.0.relu"].source != by_key["layer1.0.relu@1"].source  # each call its own line


@pytest.mark.parametrize("form", FORMS)
def test_keys_not_kept_have_shapes_but_no_values(resnet, form):
    _, batch, _, runners = resnet
    taps = runners[form].taps(batch, lambda key: False)
    assert taps and all(tap.value is None for tap in taps)
    assert taps[-1].shape == (1, 1000)
    kept = runners[form].taps(batch, lambda key: key == "layer1.0.relu@1")
    assert [tap.key for tap in kept if tap.value is not None] == ["layer1.0.relu@1"]
    assert [tap.shape for tap in kept] == [tap.shape for tap in taps]


@pytest.mark.parametrize("form", FORMS)
def test_keys_and_lines_of_a_module_called_twice(form, tmp_path):
    torch.manual_seed(0)
    model, batch = CalledTwice().eval(), torch.randn(2, 3, 8, 8)
    taps = saved_and_loaded(model, batch, form, tmp_path).taps(batch, keep_all)
    here = str(Path(__file__).resolve())
    lines = {tap.key: int(tap.source.rpartition(":")[2]) for tap in taps if tap.source.startswith(here)}
    assert {"conv", "act", "blocks.0", "blocks.1", "act@1", "head", ""} <= {tap.key for tap in taps}
    assert all(tap.module in dict(model.named_modules()) for tap in taps)
    assert lines["act"] == marked_line("first act")
    assert lines["blocks.0"] == lines["blocks.1"] == marked_line("block")
    assert lines["act@1"] == marked_line("second act")
    assert lines["head"] == marked_line("head")
    assert [tap.source for tap in taps if tap.op in ("aten::mul", "aten::sub")] == \
        [f"{here}:{marked_line('functional')}"] * 2
    eager = {tap.key: tap for tap in EagerTaps(model).taps(batch, keep_all)}
    for key in ("conv", "act", "blocks.0", "blocks.1", "act@1", "head"):
        torch.testing.assert_close(last_within(taps, key).value, eager[key].value, atol=1e-5, rtol=0)


@pytest.mark.parametrize("form", FORMS)
def test_in_place_ops_do_not_overwrite_taps(form, tmp_path):
    torch.manual_seed(0)
    model, batch = InPlace().eval(), torch.randn(1, 3, 8, 8)
    taps = saved_and_loaded(model, batch, form, tmp_path).taps(batch, keep_all)
    by_key = {tap.key: tap for tap in taps}
    with torch.inference_mode():
        normalized = model.bn(model.conv(batch))
    torch.testing.assert_close(by_key["bn"].value, normalized, atol=1e-5, rtol=0)
    assert by_key["bn"].value.min() < 0 <= by_key["relu"].value.min()
