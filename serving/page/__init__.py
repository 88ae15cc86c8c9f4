"""The try-it page of a served model: page.html and its small server (server.py), started by `python -m serving`.
Its address is here, apart from the server, so that `python -m serving --help` imports no HTTP client."""

DEFAULT_PORT = 8090
DEFAULT_HOST = "127.0.0.1"
