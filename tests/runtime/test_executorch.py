"""The ExecuTorch backend: a `.pte` run by ExecuTorch's own runtime through the one backend interface, on a small
program lowered here (a convolution and a linear head, batch 1 to 4): the outputs eager gives, a batch larger than
the program's planned one run in slices, a size it does not take refused as a run error naming the size, the
program's companion contract required, the XNNPACK thread pool sized by RunOptions, and no GPU."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from runtime import ArtifactError, ArtifactRunError, RunOptions, open_artifact
from runtime.executorch import contract_name

pytest.importorskip("executorch")

MAX_BATCH = 4
SIZE = (3, 16, 16)


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 5)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).mean((2, 3)))


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    module = Small().eval()
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    exported = torch.export.export(module, (torch.rand(2, *SIZE),), dynamic_shapes=({0: batch},))
    path = tmp_path_factory.mktemp("executorch") / "model.pte"
    path.write_bytes(to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch().buffer)
    path.with_name(contract_name(path.name)).write_text(json.dumps({"program": path.name, "method": "forward"}))
    return {"path": path, "module": module}


def test_it_computes_what_eager_computes_in_slices_of_the_planned_batch(program):
    backend = open_artifact("executorch", program["path"], RunOptions(threads=1))
    assert backend.describe()["max_batch"] == MAX_BATCH
    for rows in (1, MAX_BATCH, 2 * MAX_BATCH + 1):
        batch = torch.rand(rows, *SIZE)
        with torch.no_grad():
            expected = program["module"](batch)
        assert torch.allclose(backend(batch), expected, atol=1e-5, rtol=1e-4)


def test_another_size_is_a_run_error_naming_the_size_it_takes(program):
    backend = open_artifact("executorch", program["path"])
    with pytest.raises(ArtifactRunError, match="exactly 16x16"):
        backend(torch.rand(1, 3, 20, 20))


def test_threads_size_xnnpacks_pool(program):
    assert open_artifact("executorch", program["path"], RunOptions(threads=1)).describe()["xnnpack_threads"] == 1


def test_a_program_without_its_contract_or_on_a_gpu_is_refused(program, tmp_path):
    alone = tmp_path / "model.pte"
    alone.write_bytes(program["path"].read_bytes())
    with pytest.raises(ArtifactError, match="model.executorch.json is missing"):
        open_artifact("executorch", alone)
    with pytest.raises(ArtifactError, match="run on the CPU"):
        open_artifact("executorch", program["path"], RunOptions(device="cuda"))
