"""A live inference server as an input (`diag probe`): ask it which engine it is, send the
case's prompts with the case's decoding, and save its answers, /metrics and /server_info in
the shapes `diag run --server-*` reads.

client.py (HTTP, timeout, retries) -> detect.py (which engine, release, model) -> plan.py
(what to send) -> probe.py (one probe, saved atomically). Each engine's routes and JSON are its
package's LiveServer (diag/engines/<family>/live.py), the counter deltas diag.engines.prometheus;
this package names no engine and reads no weights.
"""
