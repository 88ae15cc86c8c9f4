import pytest
import torch
import torch.nn.functional as F

import models
from contract.records import ImageContract, InputRecord
from models.preprocess import ImagePreprocess
from models.registry import UnknownModelError


def test_registry_holds_every_resnet_and_the_demos():
    assert set(models.names("resnet")) == {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152"}
    assert set(models.names("controlflow")) == {"cf-branch", "cf-loop", "cf-repeat"}


def test_unknown_model_lists_the_choices():
    with pytest.raises(UnknownModelError, match="resnet50") as error:
        models.get("resnet9000")
    assert "resnet9000" in str(error.value)


def test_resnet_entry_builds_wrapped_network_with_labels():
    built = models.get("resnet18").build("random")
    assert isinstance(built.module, ImagePreprocess)
    assert len(built.labels) == 1000 and built.labels[0] == "tench"
    assert built.weights.kind == "random" and built.weights.seed == 0


def test_normalisation_buffers_are_saved_and_follow_the_module():
    module = ImagePreprocess(torch.nn.Identity())
    assert {"mean", "std"} <= set(module.state_dict())
    moved = module.to(torch.float64)
    assert moved.mean.dtype == torch.float64


def test_resize_branch_resizes_other_sizes_before_normalising():
    module = ImagePreprocess(torch.nn.Identity(), size=8).eval()
    x = torch.rand(2, 3, 12, 10)
    expected = (F.interpolate(x, size=[8, 8], mode="bilinear", align_corners=False) - module.mean) / module.std
    assert torch.allclose(module(x), expected)
    same = torch.rand(1, 3, 8, 8)
    assert torch.allclose(module(same), (same - module.mean) / module.std)


def test_torch_export_form_computes_the_same():
    module = ImagePreprocess(torch.nn.Conv2d(3, 4, 3), size=16).eval()
    form = module.torch_export_form()
    for shape in [(1, 3, 16, 16), (2, 3, 20, 24)]:
        x = torch.rand(shape)
        assert torch.allclose(module(x), form(x), atol=1e-6)


@pytest.mark.parametrize("arch,resize", [("resnet18", 256), ("resnet34", 256), ("resnet50", 232),
                                         ("resnet101", 232), ("resnet152", 232)])
def test_each_resnet_declares_the_contracts_image_contract_from_its_weights(arch, resize):
    import torchvision
    spec = models.get(arch).input_spec
    assert isinstance(spec.preprocessing, ImageContract)  # the very class the handler reads
    assert (spec.preprocessing.resize, spec.preprocessing.crop) == (resize, (224, 224))
    transform = torchvision.models.get_model_weights(arch).DEFAULT.transforms()
    assert spec.preprocessing.resize == transform.resize_size[0] and spec.preprocessing.crop[0] == transform.crop_size[0]
    record = spec.record()
    assert isinstance(record, InputRecord) and record.image_contract() == spec.preprocessing
    assert record.handler_input() == (3, 224, 224) and record.resizes_in_graph


def test_the_controlflow_demos_take_no_image_the_handler_could_send():
    for name in models.names("controlflow"):
        assert models.get(name).input_spec.record().handler_input() is None


def test_the_resnet_family_lists_its_archs_and_defaults_to_resnet50():
    resnet = models.family("resnet")
    assert resnet.archs == ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
    assert resnet.default_arch == "resnet50" and set(resnet.archs) == set(models.names("resnet"))
    assert models.entry_of("resnet", "resnet34") is models.get("resnet34")
    with pytest.raises(UnknownModelError, match="unknown --arch 'cf-loop'; choose one of: resnet18, resnet34"):
        models.entry_of("resnet", "cf-loop")  # registered, but not an arch of this family
    with pytest.raises(UnknownModelError, match="unknown model family 'vgg'; choose one of: detection, segmentation, efficientnet, resnet"):
        models.entry_of("vgg", "vgg16")


def test_a_family_of_unregistered_archs_or_registered_twice_is_refused():
    with pytest.raises(ValueError, match=r"archs \['resnet9000'\]"):
        models.register_family(models.Family("big", "big nets", ("resnet18", "resnet9000"), "resnet18"))
    with pytest.raises(ValueError, match="registered twice"):
        models.register_family(models.Family("resnet", "again", ("resnet18",), "resnet18"))
    with pytest.raises(ValueError, match="default 'resnet50'"):
        models.register_family(models.Family("small", "small nets", ("resnet18",), "resnet50"))
    assert not {"big", "small"} & {f.name for f in models.families()}  # nothing half-registered


def test_a_registered_family_is_a_command_of_python_m_export(monkeypatch):
    from export.cli import build_parser
    from models import registry
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))  # undone after the test
    models.register_family(models.Family("small", "small ResNets", ("resnet18", "resnet34"), "resnet34"))
    args = build_parser().parse_args(["small", "--no-archive"])
    assert (args.command, args.family, args.arch) == ("family", "small", "resnet34")
