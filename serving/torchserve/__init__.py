"""TorchServe, our way: its configuration (config.py, config.properties), start, readiness and stop
(server.py), and what its logs say when it will not serve (logs.py)."""
