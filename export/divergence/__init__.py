"""Where a form diverges from eager: every intermediate of both on the same batch, matched by module, the first
one out of tolerance named with its op, module path and the model's source line (python -m export explain)."""
