"""A live inference server as an input (`diag probe`): ask it which engine it is, send the
case's prompts with the case's decoding, and save its answers, /metrics and /server_info in
the shapes `diag run --server-*` reads.

client.py (HTTP, timeout, retries) -> detect.py (which engine, release, model) -> plan.py
(what to send) -> sglang_shape.py / vllm_shape.py (each engine's JSON) -> prometheus.py
(counter deltas) -> probe.py (one probe, saved atomically). This package reads no weights.
"""
