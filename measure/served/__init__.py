"""The serving benchmark: configurations served by a real engine under a real load generator, beside the naive
baseline, the LitServe peer and the ceilings measured in the same run."""
