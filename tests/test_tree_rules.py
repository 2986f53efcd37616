"""SGLang's tree-flag rules (diag.engines.sglang.tree_rules): auto defaults, the topk=1 rewrite,
partial flags, too many draft tokens, the sweep grid."""

from diag.engines.sglang.tree_rules import grid, resolve_sglang_shape, topk1_draft_tokens
from diag.trees import TreeShape


def test_resolve_seed_example_topk1_rewrite():
    r = resolve_sglang_shape(1, 1, 16)
    assert r.shape == TreeShape(1, 1, 2) and r.crash is None
    assert "16" in r.notes[0] and "num_steps + 1" in r.notes[0]


def test_resolve_auto_defaults_and_partial_flags():
    assert resolve_sglang_shape(None, None, None, "LlamaForCausalLM").shape == TreeShape(5, 4, 8)
    assert resolve_sglang_shape(None, None, None, "DeepseekV3ForCausalLM").shape == TreeShape(3, 1, 4)
    for flags in [(None, 4, 8), (None, None, 8), (3, None, 8), (3, 4, None)]:
        r = resolve_sglang_shape(*flags)
        assert r.crash is not None and r.shape is None, flags
    assert "AssertionError" in resolve_sglang_shape(None, 1, None).crash
    # S and topk=1 given: the topk=1 rule fills D, SGLang runs
    assert resolve_sglang_shape(4, 1, None).shape == TreeShape(4, 1, 5)
    # an architecture SGLang has no entry for gets its fallback
    assert resolve_sglang_shape(None, None, None, "Mystery").shape == TreeShape(3, 1, 4)   # 0.5.8+


def test_resolve_too_many_draft_tokens():
    r = resolve_sglang_shape(2, 2, 8)  # 7 slots > 2 + 4 candidates
    assert r.shape == TreeShape(2, 2, 8)
    assert "out of range" in r.crash and r.notes


def test_grid_rewrites_and_dedups():
    shapes, rewritten = grid([3], [1, 4], [4, 8])
    assert [s.name for s in shapes] == ["chain-3", "s3-k4-d4", "s3-k4-d8"]
    assert rewritten == [((3, 1, 8), TreeShape(3, 1, 4))]




def test_topk1_rule_worked_example():
    assert topk1_draft_tokens(1, 1, 16) == 2 and topk1_draft_tokens(3, 4, 8) == 8
