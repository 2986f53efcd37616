"""SGLang's rules, release by release (0.5.6-0.5.23), one module per rule; rules.py answers the
engine protocol (diag/engines/protocol.py) from them. Code outside diag/engines reaches them
through the registry, diag.engines.rules("sglang-0.5.23"); the few modules that still import
this package are listed, with a count that may only shrink, in tests/test_architecture.py."""
