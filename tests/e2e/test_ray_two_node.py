"""A real two-node Ray cluster on this machine (a head node and a second `ray start --address` node, each with its
own resources), the ray engine deployed onto it with --address: one replica runs on each node, each answers as
the archive's artifact in-process, and both nodes' processes are gone afterwards. The node killed under load is
a measurement (`python -m measure ray-two-node`, results in docs/results/2026-11-24-ray-two-node/)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.answers import assert_same_answer, expected_answer
from tests.conftest import ROOT

pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install '.[ray]' (an optional extra)")
from measure.distributed.cluster import TWO_REPLICAS, two_node_serving  # noqa: E402  (after the skip)
from measure.distributed.two_node import SERVED_BY, wait_for_replicas  # noqa: E402
from serving.ray.cluster import session_members  # noqa: E402

pytestmark = pytest.mark.slow
CAT = ROOT / "examples" / "cat.jpg"
ROUNDS, AT_ONCE = 10, 8  # the head's proxy prefers its own node's replica: the second gets what overflows


def test_a_replica_on_each_node_answers_as_the_artifact(resnet18_export, tmp_path_factory):
    import ray
    expected = expected_answer(resnet18_export["archive"], CAT.read_bytes())
    folder = tmp_path_factory.mktemp("two-nodes")
    with two_node_serving(resnet18_export["model_store"], "resnet18", folder, CAT) as (nodes, settings):
        second = nodes.second_node_id()
        head = next(node["NodeID"] for node in ray.nodes() if node["Alive"] and node["NodeID"] != second)
        wait_for_replicas("resnet18", TWO_REPLICAS.workers)
        by_node: dict[str, list[requests.Response]] = {}
        with ThreadPoolExecutor(AT_ONCE) as pool:
            for _ in range(ROUNDS):
                for response in pool.map(lambda _: requests.post(
                        settings.predictions_url("resnet18"), data=CAT.read_bytes(),
                        headers={"Content-Type": "image/jpeg"}, timeout=60), range(AT_ONCE)):
                    assert response.status_code == 200, response.text
                    by_node.setdefault(response.headers[SERVED_BY].split()[0], []).append(response)
                if len(by_node) == 2:
                    break
        assert set(by_node) == {head, second}, f"answers came from {set(by_node)}, not head {head} and {second}"
        for responses in by_node.values():
            assert_same_answer(responses[0].json(), expected)
    assert not session_members(nodes.head.pid) and not session_members(nodes.second.pid), "Ray processes survived"
