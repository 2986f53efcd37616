"""vLLM's rules, release by release (the engine issue adds them behind diag/engines/protocol.py).
So far: metrics.py, the speculative counters of a saved GET /metrics."""
