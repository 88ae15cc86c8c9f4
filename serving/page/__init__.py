"""The try-it page of a served model: page.html and its small server (server.py), started by `python -m serving`."""
