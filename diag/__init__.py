"""diag: drafter-vs-target diagnostics for EAGLE-3 speculative decoding.

diag loads a target model and an EAGLE-3 drafter outside the serving engine,
replays prompts, and reports per-position acceptance under alternative
hidden-state layouts, quantization regimes and tree shapes.
"""

__version__ = "0.1.0"
