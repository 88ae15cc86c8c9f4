"""Ray Serve with our request core: the settings and what the policy becomes in Ray (config.py), the Ray nodes
this engine starts and ends (cluster.py), the Serve deployment that runs the core (deployment.py), the process
that deploys one application per archive and stays until stopped (server.py), and the engine (engine.py)."""
