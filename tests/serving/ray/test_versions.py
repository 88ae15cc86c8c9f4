"""The Ray server's version routes (serving/ray/versions.py) as its signals server hands them over, without a
cluster: the refusals decided before Ray is asked (a route that does not exist, a
number missing, a model the server does not serve, an archive not in the store). The steps themselves run on a
real Ray Serve in tests/e2e/test_rollout.py."""

import pytest

from contract.policy import ServingPolicy
from serving.ray.config import RaySettings
from serving.ray.versions import RayVersions

# as the run config holds it: resolved when the server started
ONE_REPLICA = ServingPolicy(workers=1, batch_size=1, max_batch_delay_ms=5, threads_per_worker=1, device="cpu",
                            reason="tests: one replica")


@pytest.fixture
def versions(tmp_path) -> RayVersions:
    (tmp_path / "resnet18.v1.mar").write_bytes(b"")
    settings = RaySettings(tmp_path, ("resnet18",), run_dir=tmp_path / "run", policies={"resnet18": ONE_REPLICA})
    return RayVersions(settings, lambda policy: {})


@pytest.mark.parametrize("method, path, query, status, why", [
    ("GET", "/rollout/resnet18/v2/x", {}, 404, "no version route GET /rollout/resnet18/v2/x"),
    ("PATCH", "/rollout/resnet18/v2", {}, 404, "no version route PATCH"),
    ("POST", "/rollout/resnet18/latest", {}, 404, "no version route POST"),  # a label is vN
    ("PUT", "/rollout/resnet18/v2/canary", {}, 422, "give ?percent=NUMBER"),
    ("PUT", "/rollout/resnet18/capture", {"count": "many"}, 422, "give ?count=NUMBER"),
    ("POST", "/rollout/mobilenet/v2", {}, 404, "no model mobilenet"),
    ("POST", "/rollout/resnet18/v2", {}, 404, "resnet18.v2.mar not in the model store"),
])
def test_a_route_is_refused_with_its_status_and_reason_before_ray_is_asked(versions, method, path, query, status,
                                                                            why):
    answered, body = versions.answer(method, path, query)
    assert answered == status and why in body["detail"], body
