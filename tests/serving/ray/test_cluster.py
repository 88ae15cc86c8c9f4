"""Our head node's start as the server process waits for it (serving/ray/cluster.py): its GCS answering, then its
raylet registered (what ray.init looks for, once a second); a `ray start` that exits is told with its code."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from serving.ray import cluster
from serving.settings import ServingError, free_port

pytest.importorskip("ray", reason="Ray is not installed: pip install '.[ray]' (an optional extra)")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """(the `ray start` process, its GCS address, its log) of a one-CPU head node of ours, ended after the module."""
    log = tmp_path_factory.mktemp("head") / "head.log"
    # Ray's socket paths under its temp dir must fit AF_UNIX's 107 bytes: pytest's folders are too deep for it
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-test-"))
    port = free_port()
    node = cluster.start_node(cluster.node_command(temp_dir, 1, head_port=port), log, new_session=True)
    try:
        yield node, f"127.0.0.1:{port}", log
    finally:
        if node.poll() is None:
            cluster.end_session(os.getsid(node.pid))
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_the_wait_for_a_starting_head_node_returns_once_the_gcs_lists_it_live(head):
    from ray._raylet import GcsClient
    from ray.core.generated.gcs_pb2 import GcsNodeInfo
    node, address, log = head
    cluster.wait_for_gcs(address, node, log)  # up before the raylet registers: no live node yet
    cluster.wait_for_live_node(address, node, log)
    live = GcsClient(address=address).get_all_node_info(timeout=10, state_filter=GcsNodeInfo.GcsNodeState.ALIVE)
    assert len(live) == 1


def test_a_node_whose_ray_start_exited_is_told_with_its_code(head, tmp_path):
    node, address, head_log = head
    cluster.wait_for_gcs(address, node, head_log)
    log = tmp_path / "node.log"
    log.write_text("the node's last words\n")
    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    exited.wait()
    with pytest.raises(ServingError, match="exited with code 3: the node's last words"):
        cluster.wait_for_live_node(address, exited, log)
