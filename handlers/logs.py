"""What every engine that runs the core in Python processes of its own logs alike: KServe's server and worker
processes (serving/kserve/), Ray's replicas (serving/ray/deployment.py). TorchServe configures its workers' logging
itself (serving/torchserve/).
"""

from __future__ import annotations

import logging

LOG_FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"
SERVED_BY = "X-Served-By"  # the response header naming who answered: KServe's worker, Ray's node and replica


def configure_logging() -> None:
    """The core's lines (sha256 verified, "batch of N: decode=..." stage times) in this process's log: KServe
    configures only its own and uvicorn's loggers, and Ray sends a replica's log to the server process's."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    logging.getLogger("handlers").setLevel(logging.INFO)
