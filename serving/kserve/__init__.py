"""KServe's own ModelServer with our request core: its configuration (config.py), the pieces of KServe's server
we set (app.py: bind address, error statuses, raw v2 BYTES), the server process (worker.py) and the engine
(engine.py: start, readiness, stop, its options of `python -m serving --engine kserve`; server.py: the same as
functions of a KServeSettings)."""
