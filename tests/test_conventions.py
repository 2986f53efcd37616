"""Layer-id conventions: a worked example per rule, then round-trip properties."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from diag.engines.conventions import all_conventions, readings, resolve, to_ids
from diag.errors import DiagError
from diag.layouts import layout

KIMI_N = 61


@pytest.mark.parametrize("ids, convention, expected", [
    ([2, 30, 58], "sglang-llama", "L3+L31+L59"),
    ([2, 30, 58], "sglang-deepseek", "L2+L30+L58"),
    ([1, 29, 57], "sglang-deepseek", "L2+L30+L58"),
    (None, "sglang-llama", "L2+L30+L58"),
    (None, "sglang-deepseek", "L2+L30+L58"),
    ([2, 30, 58], "sglang-default", "L2+L30+L58"),   # ids ignored
    ([2, 30, 58], "vllm", "L2+L30+L58"),
    ([2, 30, 58], "eagle-reference", "L2+L30+L58"),
    ([2, 30, 58], "specforge", "L3+L31+L59"),
    (None, "specforge", "L2+L30+L58"),               # [1, 29, 57] + 1
    (None, "speculators", "L2+L30+L58+L61"),         # [2, 30, 58, 61]
    ([0, 3, 61], "speculators", "embed+L3+L61"),
    ([-1, 2, 30], "sglang-llama", "embed+L3+L31"),   # layers_to_capture 0 = embeddings (0.5.22+)
    ([0, 3, 31], "sglang-deepseek", "embed+L3+L31"),  # first id 0: no shift, 0 = embeddings (0.5.14+)
    ([0, 1, 2], "sglang-deepseek", "embed+L1+L2"),
    ([2, 30, 58], "sglang-deepseek-0.5.13", "L2+L30+L58"),
    ([2, 30, 58], "sglang-deepseek-pre-0.5.13", "L3+L31+L59"),  # always +1 up to 0.5.12.post1
    ([0, 3, 31], "sglang-deepseek-pre-0.5.13", "L1+L4+L32"),
])
def test_kimi_worked_examples(ids, convention, expected):
    assert str(resolve(ids, convention, KIMI_N).layout) == expected


def test_sglang_concatenates_ascending_whatever_the_list_order():
    res = resolve([30, 2, 58], "sglang-llama", KIMI_N)
    assert str(res.layout) == "L3+L31+L59"
    assert "ascending" in res.rule
    assert str(resolve([30, 2, 58], "vllm", KIMI_N).layout) == "L30+L2+L58"


def test_deepseek_first_one_rule_reads_list_order_not_minimum():
    # [30, 1, 58]: first id is 30, so no shift: L1+L30+L58 sorted
    assert str(resolve([30, 1, 58], "sglang-deepseek", KIMI_N).layout) == "L1+L30+L58"


def test_rule_names_engine_version_and_source():
    rule = resolve([2, 30, 58], "sglang-deepseek", KIMI_N).rule
    assert "SGLang 0.5.14–0.5.23" in rule and "deepseek_v2.py" in rule and "L2+L30+L58" in rule
    rule = resolve([2, 30, 58], "sglang-deepseek-pre-0.5.13", KIMI_N).rule
    assert "SGLang 0.5.6–0.5.12.post1" in rule and "L3+L31+L59" in rule


def test_small_model_defaults():
    # N = 8: sglang default [2, 8//2, 8-3] = [2, 4, 5]; specforge ids [1, 3, 4] + 1
    assert str(resolve(None, "specforge", 8).layout) == "L2+L4+L5"  # ids [1, 3, 4]
    assert str(resolve(None, "sglang-llama", 8).layout) == "L2+L4+L5"
    with pytest.raises(DiagError):  # N = 6: [2, 3, 3] repeats L3
        resolve(None, "sglang-llama", 6)


@pytest.mark.parametrize("ids, convention", [
    ([2, 30, 60], "sglang-llama"),      # layers_to_capture 61 is never reached
    ([0, 30, 58], "sglang-deepseek-0.5.13"),     # capture at layer 0 adds residual None
    ([-1, 2, 30], "sglang-deepseek-pre-0.5.13"),  # likewise, after the +1
    ([-1, 2, 30], "sglang-llama-pre-0.5.22"),
    ([2, 30, 61], "vllm"),
    ([2, 30, 62], "speculators"),
    ([2, 2, 30], "sglang-llama"),
    ([], "vllm"),
])
def test_uncapturable_ids_raise(ids, convention):
    with pytest.raises(DiagError):
        resolve(ids, convention, KIMI_N)


def test_unknown_convention_names_the_known_ones():
    with pytest.raises(DiagError) as err:
        resolve([1], "tensorrt", 4)
    assert "sglang-llama" in str(err.value)


@pytest.mark.parametrize("text, convention, expected", [
    ("L3+L31+L59", "sglang-llama", [2, 30, 58]),
    ("L2+L30+L58", "sglang-deepseek", [2, 30, 58]),
    ("L1+L30+L58", "sglang-deepseek", [30, 58, 1]),  # id 1 moved last: no +1 shift   # id 1 first would trigger the +1 shift
    ("embed+L3+L31", "sglang-deepseek", [0, 3, 31]),
    ("embed+L3+L31", "sglang-deepseek-0.5.13", None),
    ("embed+L3+L31", "sglang-deepseek-pre-0.5.13", None),
    ("L3+L31+L59", "sglang-deepseek-pre-0.5.13", [2, 30, 58]),
    ("embed+L3+L31", "sglang-llama-pre-0.5.22", None),
    ("embed+L3+L31", "sglang-llama", [-1, 2, 30]),
    ("L31+L3", "sglang-llama", None),          # SGLang cannot concatenate out of order
    ("L31+L3", "vllm", [31, 3]),
    ("final", "vllm", None),
    ("L2+L30+L58", "sglang-default", None),
    ("L61", "speculators", [61]),
    ("L61", "vllm", None),
])
def test_to_ids(text, convention, expected):
    assert to_ids(layout(text), convention, KIMI_N) == expected


def test_readings_group_conventions_by_layout():
    got = {str(r.layout): set(r.conventions) for r in readings([2, 30, 58], KIMI_N)}
    plus_one = {"sglang-llama", "sglang-llama-pre-0.5.22", "sglang-deepseek-pre-0.5.13", "specforge"}
    assert got == {"L3+L31+L59": plus_one,
                   "L2+L30+L58": {"sglang-deepseek", "sglang-deepseek-0.5.13", "vllm",
                                  "eagle-reference", "speculators"}}


def test_readings_skip_conventions_that_cannot_read():
    got = {str(r.layout): set(r.conventions) for r in readings([0, 3, 61], KIMI_N)}
    assert got == {"embed+L3+L61": {"speculators"}}
    got = {str(r.layout): set(r.conventions) for r in readings([0, 3, 31], KIMI_N)}
    assert got["embed+L3+L31"] == {"sglang-deepseek", "vllm", "eagle-reference", "speculators"}


N_LAYERS = st.integers(min_value=4, max_value=96)


@st.composite
def ids_for(draw, convention):
    n = draw(N_LAYERS)
    conv = all_conventions()[convention]
    lo, hi = conv.min_index - conv.shift, n + conv.max_from_n - conv.shift
    ids = draw(st.lists(st.integers(lo, hi), min_size=1, max_size=4, unique=True))
    return n, ids


ID_CONVENTIONS = [name for name, c in all_conventions().items() if c.reads_ids]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_ids_points_ids_round_trip(data):
    name = data.draw(st.sampled_from(ID_CONVENTIONS))
    n, ids = data.draw(ids_for(name))
    conv = all_conventions()[name]
    # sglang-deepseek with first id 1 shifts every id by one: keep them in range
    assume(not (conv.first_one_shift and ids[0] == 1 and max(ids) + 1 > n - 1))
    res = resolve(ids, name, n)
    back = to_ids(res.layout, name, n)
    assert back is not None
    assert resolve(back, name, n).layout == res.layout
    if not conv.ascending and not conv.first_one_shift:
        assert back == ids
    if conv.ascending and not (conv.first_one_shift and 1 in (ids[0], min(ids))):
        assert back == sorted(ids)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_points_ids_points_round_trip(data):
    name = data.draw(st.sampled_from(ID_CONVENTIONS))
    n = data.draw(N_LAYERS)
    idx = data.draw(st.lists(st.integers(0, n), min_size=1, max_size=4, unique=True))
    lay = layout("+".join(f"L{r}" for r in idx))
    ids = to_ids(lay, name, n)
    if ids is not None:
        assert resolve(ids, name, n).layout == lay


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.just("embed"), st.just("final"),
                          st.integers(1, 200).map(lambda i: f"L{i}")),
                min_size=1, max_size=5, unique=True))
def test_layout_parse_print_round_trip(names):
    text = "+".join(names)
    assert str(layout(text)) == text
