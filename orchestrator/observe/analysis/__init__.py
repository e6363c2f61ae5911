"""Analyses of one configuration's comparison rows: why TTFT grows below the knee (diagnosis), the fitted
queueing model and its predicted knee (predict), and what the knee costs in cores against GPUs (cost); over a
whole sweep, whether its repeats moved together (drift)."""
