"""A two-node Ray cluster on this machine for the measurement and its test: a head node and a second node, each a
`ray start --block` in a session of its own (so the second can be killed alone, as a machine dies), and the ray
engine deployed onto it with --address, one replica of one CPU on each node."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from handlers.policy import ServingPolicy
from serving.ray import cluster
from serving.ray.config import RaySettings
from serving.ray.engine import RayServe
from serving.settings import HOST, ServingError, free_port

# Serve's proxy sends a request to a replica on its own node while one can take it, others get the overflow.
PREFER_LOCAL = "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING"
SECOND_NODE = "second_node"  # a custom resource only the second node offers: how we tell its node id apart
# One CPU per node and per replica: the policy's two replicas can only be placed one on each node. The head
# offers one more CPU, where Serve places the replacement of the replica the second node takes down with it.
HEAD_CPUS, SECOND_NODE_CPUS = 2, 1
TWO_REPLICAS = ServingPolicy(workers=2, batch_size=1, max_batch_delay_ms=5, threads_per_worker=1, device="cpu",
                             reason="two nodes: one replica of one CPU each")


@dataclass
class Nodes:
    address: str
    head: object  # the `ray start --head` process (subprocess.Popen)
    second: object  # the second node's `ray start --address` process
    folder: Path

    def second_node_id(self) -> str:
        """The second node's Ray node id (it alone offers SECOND_NODE)."""
        import ray
        alive = [node for node in ray.nodes() if node["Alive"] and SECOND_NODE in node["Resources"]]
        if not alive:
            raise ServingError("the second Ray node is not alive in the cluster")
        return alive[0]["NodeID"]


def start_nodes(folder: Path, even_routing: bool = False) -> Nodes:
    """A head node and a second node joining it, each with its own resources and temp dir. even_routing: the
    head's proxy spreads requests over every replica instead of preferring its own node's."""
    folder.mkdir(parents=True, exist_ok=True)
    if even_routing:
        os.environ[PREFER_LOCAL] = "0"  # read by the proxy, which the head node's raylet starts
    port = free_port()
    address = f"{HOST}:{port}"
    head = cluster.start_node(cluster.node_command(short_temp_dir(folder, "head"), HEAD_CPUS, head_port=port),
                              folder / "ray-head.log", new_session=True)
    cluster.wait_for_gcs(address, head, folder / "ray-head.log")
    second = cluster.start_node(cluster.node_command(short_temp_dir(folder, "second"), SECOND_NODE_CPUS,
                                                     address=address, resources=json.dumps({SECOND_NODE: 1})),
                                folder / "ray-second-node.log", new_session=True)
    return Nodes(address, head, second, folder)


def short_temp_dir(folder: Path, name: str) -> Path:
    """A node's temp dir: Ray's socket paths under it must stay short (serving/ray/config.py)."""
    settings = RaySettings(run_dir=folder / name)
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    return settings.temp_dir()


def wait_for_second_node(nodes: Nodes, timeout: float = cluster.NODE_UP_TIMEOUT_S) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if nodes.second.poll() is not None:
            raise ServingError(f"the second node exited: {cluster.log_tail(nodes.folder / 'ray-second-node.log')}")
        with contextlib.suppress(ServingError):
            return nodes.second_node_id()
        time.sleep(0.5)
    raise ServingError(f"the second node did not join within {timeout:.0f} s")


def end_nodes(nodes: Nodes) -> None:
    """Both nodes' processes ended (the `ray start` watchers killed first: see serving/ray/server.stop_head)."""
    for node in (nodes.second, nodes.head):
        if node.poll() is None:
            node.kill()
            node.wait()
        cluster.end_session(node.pid)


@contextlib.contextmanager
def two_nodes_up(folder: Path, attempts: int = 6, wait_s: float = 10.0):
    """Both nodes started and the second joined (a driver connected to see it, then gone), for a command run onto
    nodes.address; both ended on the way out. A loaded machine starts the head slowly: its first drivers are
    retried."""
    import ray
    nodes = start_nodes(folder)
    try:
        for attempt in range(attempts):
            try:
                ray.init(address=nodes.address, logging_level="WARNING", log_to_driver=False, _node_ip_address=HOST)
                break
            except ConnectionError:
                if attempt == attempts - 1:
                    raise
                time.sleep(wait_s)
        wait_for_second_node(nodes)
        ray.shutdown()
        yield nodes
    finally:
        end_nodes(nodes)


@contextlib.contextmanager
def two_node_serving(model_store: Path, model: str, folder: Path, image: Path, even_routing: bool = False):
    """(nodes, engine settings) of the ray engine serving model on both nodes; every process ended on the way out."""
    import ray
    nodes = start_nodes(folder, even_routing)
    try:
        ray.init(address=nodes.address, namespace="serve", logging_level="WARNING", log_to_driver=False)
        wait_for_second_node(nodes)
        settings = RaySettings(model_store, (model,), http_port=free_port(), run_dir=folder / "engine",
                               address=nodes.address, policy=TWO_REPLICAS, signals_port=free_port())
        with RayServe(settings).running(image):
            yield nodes, settings
    finally:
        ray.shutdown()
        end_nodes(nodes)
