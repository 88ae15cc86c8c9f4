"""AOTInductor packages through runtime/: tied to the torch build, device and CPU instruction set that compiled
them (refused before any of their code is loaded), and refusing input shapes they were not compiled for."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch

from runtime import ArtifactRunError, RunOptions, open_artifact
from runtime.aoti import BUILD_FILE, BuildMismatchError, build_facts, check_build, read_build_facts
from runtime.machine import cpu_flags
from tests.machines import flags_this_cpu_lacks, isa_this_cpu_cannot_run

CPU = torch.device("cpu")


def facts(**changes) -> dict:
    return {**build_facts(CPU, [None, 3, 16, 16]), **changes}


def _isas() -> list[str]:
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list
    return [str(isa) for isa in valid_vec_isa_list()]


def test_a_package_of_this_build_passes_the_check():
    check_build(facts(), CPU)
    if "avx2" in _isas():
        check_build(facts(cpu_isa="avx2"), CPU)  # an older instruction set runs on a newer CPU


OTHER_ISA = isa_this_cpu_cannot_run(_isas())
OTHER_FLAGS = flags_this_cpu_lacks(2)  # the CPU that compiled the package had these; this one has not


@pytest.mark.parametrize("changes, expected", [
    ({"torch": "2.13.0+cpu"}, "compiled by torch 2.13.0+cpu, this is torch " + torch.__version__),
    ({"device": "cuda", "compute_capability": "9.0"}, "compiled for cuda, asked to run on cpu"),
    ({"cpu_isa": OTHER_ISA}, f"compiled for the {OTHER_ISA} instruction set, which this CPU lacks"),
    ({"cpu_flags": [*sorted(cpu_flags())[:1], *OTHER_FLAGS]}, "compiled with -march=native on a CPU with instructions this one lacks "
                                            f"({', '.join(OTHER_FLAGS)})"),
])
def test_another_torch_device_or_instruction_set_is_refused_with_what_to_do(changes, expected):
    with pytest.raises(BuildMismatchError) as raised:
        check_build(facts(**changes), CPU)
    assert expected in str(raised.value) and "re-export with --formats aotinductor" in str(raised.value)


def test_a_file_without_our_build_record_is_refused(tmp_path):
    foreign = tmp_path / "foreign.pt2"
    with zipfile.ZipFile(foreign, "w") as archive:
        archive.writestr("foreign/data/aotinductor/model/x.wrapper.so", b"\x7fELF")
    with pytest.raises(BuildMismatchError, match="was not written by `python -m export`"):
        read_build_facts(foreign)
    (tmp_path / "text.pt2").write_text("not a zip")
    with pytest.raises(BuildMismatchError, match="not a readable AOTInductor package"):
        read_build_facts(tmp_path / "text.pt2")


@pytest.mark.slow
def test_the_package_records_its_build_in_itself_and_in_the_manifest(aoti_export):
    record = aoti_export["manifest"].artifacts["aotinductor"]
    inside = read_build_facts(aoti_export["out"] / record.path)
    assert inside == record.details["build"]
    assert inside["torch"] == torch.__version__ and inside["device"] == "cpu" and inside["input_shape"] == [None, 3, 16, 16]
    assert record.format == "aoti" and not record.spatial_dynamic


@pytest.mark.slow
def test_a_shape_the_package_was_not_compiled_for_is_refused_not_computed(aoti_export):
    path = aoti_export["out"] / aoti_export["manifest"].artifacts["aotinductor"].path
    backend = open_artifact("aoti", path, RunOptions(threads=1), name="aotinductor")
    assert backend(torch.rand(5, 3, 16, 16)).shape == (5, 3)  # the batch is dynamic
    with pytest.raises(ArtifactRunError, match=r"compiled for inputs of shape N x 3 x 16 x 16, got 1 x 3 x 24 x 24"):
        backend(torch.rand(1, 3, 24, 24))  # the package itself would return numbers for it


@pytest.mark.slow
def test_a_package_from_another_torch_is_refused_before_its_code_is_loaded(aoti_export, tmp_path):
    """The recorded torch version is changed and the shared library overwritten: loading it would fail (or
    crash); the refusal must come first and name the mismatch."""
    source = aoti_export["out"] / aoti_export["manifest"].artifacts["aotinductor"].path
    moved = tmp_path / "model.aoti.pt2"
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(moved, "w") as new:
        for item in old.infolist():
            data = old.read(item)
            if item.filename.endswith(BUILD_FILE):
                data = json.dumps({**json.loads(data), "torch": "2.99.0"}).encode()
            elif item.filename.endswith(".so"):
                data = b"\0" * len(data)
            new.writestr(item, data)
    with pytest.raises(BuildMismatchError, match="compiled by torch 2.99.0, this is torch"):
        open_artifact("aoti", moved, RunOptions(threads=1))



def test_a_build_record_that_is_not_an_object_is_refused(tmp_path):
    from runtime.aoti import EXTRA_FOLDER
    package = tmp_path / "listed.pt2"
    with zipfile.ZipFile(package, "w") as archive:
        archive.writestr(f"model/{EXTRA_FOLDER}{BUILD_FILE}", "[1, 2]")
    with pytest.raises(BuildMismatchError, match="is not a JSON object"):
        read_build_facts(package)
