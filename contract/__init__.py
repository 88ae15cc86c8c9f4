"""The contract between export and serving, on the bottom floor: the typed records of manifest.json and of the
handler's settings (records.py), the one error family (errors.py) and the one place a user-facing error becomes
a message and an exit code (cli.py). Standard library only: every TorchServe archive ships this package whole,
so what serving reads is exactly what development imports."""
