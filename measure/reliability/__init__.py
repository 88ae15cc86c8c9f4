"""A served model held under load: the soak (memory and errors over minutes) and the worker-kill fault."""
