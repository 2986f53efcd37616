"""The serving engines diag models, one package each (vllm/ here; SGLang still in diag.engine)."""
