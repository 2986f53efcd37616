"""vLLM as a served engine, release by release: its wheels (read by HTTP range, wheels.py), its
rules with release ranges (table.py, written by rules_gen.py), the served layout (capture.py), its
launch command (spec_config.py), log and /metrics (detect.py, metrics.py), its rejection sampler
(rejection.py) and the sanity verdict on its sampled runs (sanity.py)."""
