"""Ray Serve with our request core: the settings and what the policy becomes in Ray (config.py), the Ray nodes
this engine starts and ends (cluster.py), the Serve deployment that runs the core (deployment.py), the process
that deploys one application per archive and stays until stopped (server.py), and the engine (engine.py)."""

import os

# Every Ray process of ours (head and further nodes, the deploying process, replicas, batch drivers) must agree on
# Ray's authentication mode. With RAY_AUTH_MODE unset, Ray decides per process: a local ray.init() turns token
# auth on and saves a token (~/.ray/auth_token), after which `ray start` turns it on too, while a driver that
# connects by address stays off and is refused ("InvalidAuthToken"). Setting it once here, unless the user chose
# a mode, keeps them agreeing: off without --token-auth, which hands every process of a server the token mode and
# the cluster's token instead (cluster.py cluster_auth_env; docs/security.md).
RAY_AUTH_MODE = "disabled"
os.environ.setdefault("RAY_AUTH_MODE", RAY_AUTH_MODE)
