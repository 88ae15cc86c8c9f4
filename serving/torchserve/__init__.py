"""TorchServe, our way: its configuration (config.py, config.properties), the engine (engine.py: start,
readiness, stop, its options of `python -m serving`; server.py: the same as functions of a ServerSettings) and
what its logs say when it will not serve (logs.py)."""
