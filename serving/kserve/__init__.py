"""KServe's protocol (its data plane, v1 and v2 routes and error handlers) with our request core: its
configuration (config.py), our app that KServe's parts are composed on (app.py: bind address, error statuses, raw v2
BYTES), the server process (worker.py) and the engine (engine.py: start, readiness, stop, its options of
`python -m serving --engine kserve`; server.py: the same as functions of a KServeSettings)."""
