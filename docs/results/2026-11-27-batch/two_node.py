"""The batch command on the two-node Ray cluster of measure/distributed/cluster.py (a head node and a second node,
each a `ray start` in a session of its own on this machine): `python -m serving batch ... --address` onto it, then
both nodes ended.

    python docs/results/2026-11-27-batch/two_node.py EXPORT PHOTOS_DIR OUT WORK_DIR
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import ray

from measure.distributed.cluster import end_nodes, start_nodes, wait_for_second_node
from serving.settings import HOST

export, photos, out, work = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
# Ray's token authentication: the nodes started here generate tokens the drivers here do not read; both ends are
# this machine's loopback, so it is switched off for the nodes and the drivers alike.
os.environ["RAY_AUTH_MODE"] = "disabled"
nodes = start_nodes(work)
try:
    for _attempt in range(6):  # a loaded machine starts the head slowly: wait until it takes a driver
        try:
            ray.init(address=nodes.address, logging_level="WARNING", log_to_driver=False, _node_ip_address=HOST)
            break
        except ConnectionError:
            time.sleep(10)
    wait_for_second_node(nodes)
    ray.shutdown()
    done = subprocess.run(
        [sys.executable, "-m", "serving", "batch", export, photos, "--out", out, "--address", nodes.address]
    )
finally:
    end_nodes(nodes)
sys.exit(done.returncode)
