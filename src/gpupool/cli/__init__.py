"""The composition root: the only place that reads flags and environment and wires objects."""
