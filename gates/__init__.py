"""The gate library: held-out photos and each task's comparator (top-k, box sets, masks), whose typed results carry
the evidence the comparison had. Export's parity and precision gate and the rollout's gate call it; the archive
does not ship it (nothing served needs it)."""
