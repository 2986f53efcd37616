"""vLLM as a served engine, release by release: its wheels (read by HTTP range), its rules with
release ranges, its launch command / log / metrics, and the sanity verdict on its sampled runs."""
