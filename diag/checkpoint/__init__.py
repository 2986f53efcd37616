"""Reading checkpoint files: config.json, safetensors headers, content digests. No models."""
