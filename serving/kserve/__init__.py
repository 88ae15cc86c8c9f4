"""KServe's own ModelServer with our request core: its configuration (config.py), the pieces of KServe's server
we set (app.py: bind address, error statuses, raw v2 BYTES), the server process (worker.py), start, readiness
and stop (server.py) and `python -m serving --engine kserve` (cli.py)."""
