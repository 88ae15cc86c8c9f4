"""The batch command on the two-node Ray cluster of measure/distributed/cluster.py (a head node and a second node,
each a `ray start` in a session of its own on this machine): `python -m serving batch ... --address` onto it, then
both nodes ended.

    python docs/results/2026-11-27-batch/two_node.py EXPORT PHOTOS_DIR OUT WORK_DIR
"""

import subprocess
import sys
from pathlib import Path

from measure.distributed.cluster import two_nodes_up

export, photos, out, work = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
with two_nodes_up(work) as nodes:
    done = subprocess.run(
        [sys.executable, "-m", "serving", "batch", export, photos, "--out", out, "--address", nodes.address]
    )
sys.exit(done.returncode)
