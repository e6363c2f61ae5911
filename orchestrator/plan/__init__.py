"""Plan: the sweep YAML a user writes (spec), its pure expansion into trials (expand), the model shapes, and the preflight checks of every input."""
