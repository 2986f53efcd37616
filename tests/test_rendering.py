"""Prompt renderings (issue 14.1): the name grammar, what each rendering turns a prompt into,
the thinking switch read from a template's Jinja source (Kimi-K2.5's `thinking`, Qwen3's
`enable_thinking`), system prompts on and off, and where two renders part (the first difference:
diag/diagnoses/prompt_renderings.py, tests/diagnoses/test_prompt_renderings.py)."""

import json

import pytest

import tiny
from diag.diagnoses.prompt_renderings import first_difference
from diag.errors import DiagError
from diag.run.prompts import Prompt, tokenize
from diag.run.render import Renderer, load_template, thinking_switch
from diag.run.rendering import parse
from diag.zoo.tokenizer import THINKING_CHAT_TEMPLATE

# Kimi-K2.5's generation-prompt switch, verbatim; Qwen3's reads enable_thinking.
KIMI_SWITCH = ("{%- if thinking is defined and thinking is false -%}<think></think>"
               "{%- else -%}<think>{%- endif -%}")
QWEN_SWITCH = "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>{%- endif %}"


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    """The zoo's Kimi-style template (llama-tiny-think's) as a user-supplied file: (path, source)."""
    path = tmp_path_factory.mktemp("tpl") / "kimi-style.jinja"
    path.write_text(THINKING_CHAT_TEMPLATE)
    return str(path), THINKING_CHAT_TEMPLATE


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer
    d = tmp_path_factory.mktemp("tok")
    tiny.make_tokenizer(d)
    t = AutoTokenizer.from_pretrained(str(d))
    t.bos_token = "<|pad|>"            # a bos the template can print
    return t


CHAT = Prompt("c1", "chat", None, (("system", "Be brief."), ("user", "def f(x):")))
TEXT = Prompt("t1", "code", "def f(x):", None)


@pytest.mark.parametrize("text, name, base, thinking, system", [
    ("chat", "chat", "chat", None, None),
    ("chat+nothink", "chat+nothink", "chat", False, None),
    ("train+system+think", "train+think+system", "train", True, True),
    ("auto+nosystem", "auto+nosystem", "auto", None, False),
])
def test_names_parse_to_one_canonical_spelling(text, name, base, thinking, system):
    r = parse(text, ("train",))
    assert (r.name, r.base, r.thinking, r.system) == (name, base, thinking, system)
    assert parse(r.name, ("train",)) == r


@pytest.mark.parametrize("text, message", [
    ("train", "unknown rendering base"), ("chat+fast", "unknown rendering modifier"),
    ("chat+think+nothink", "switches the same thing twice"), ("raw+nothink", "raw text has no template"),
])
def test_bad_names_are_errors(text, message):
    with pytest.raises(DiagError, match=message):
        parse(text, ())


def test_thinking_switch_is_read_from_the_template_source(kimi):
    assert thinking_switch(KIMI_SWITCH) == "thinking"
    assert thinking_switch(QWEN_SWITCH) == "enable_thinking"
    assert thinking_switch("{{ messages[0]['content'] }} {# thinking is off #}") is None
    assert thinking_switch(kimi[1]) == "thinking"


def test_kimi_style_thinking_on_and_off_differ_only_at_the_generation_prompt(tok, kimi):
    r = Renderer(tok, {"kimi": kimi})
    on, off, default = (r.ids(CHAT, parse(n, ("kimi",))) for n in ("kimi+think", "kimi+nothink", "kimi"))
    assert on == default                                    # Kimi thinks unless told not to
    k = first_difference(on, off)
    assert on[:k] == off[:k] and tok.decode(on[k:]) == "" and tok.decode(off[k:]) == "</think>"
    assert tok.decode(on).endswith("<|assistant|>\n<think>")


def test_system_prompt_on_and_off(tok, kimi):
    r = Renderer(tok, {"kimi": kimi}, system_prompt="You are Kimi.")
    text = lambda p, n: tok.decode(r.ids(p, parse(n, ("kimi",))))
    assert "Be brief." in text(CHAT, "kimi") and "Be brief." not in text(CHAT, "kimi+nosystem")
    assert "You are a tiny model." in text(CHAT, "kimi+nosystem")     # the template's own default
    assert "You are Kimi." in text(TEXT, "kimi+system") and "You are Kimi." not in text(CHAT, "kimi+system")


def test_raw_and_auto(tok):
    r = Renderer(tok)
    assert r.ids(CHAT, parse("raw")) == list(tok("Be brief.\ndef f(x):")["input_ids"])
    assert r.ids(TEXT, parse("auto")) == r.ids(TEXT, parse("raw")) == tokenize(TEXT, tok)
    # auto without a chat template: diag's old "role: content" fallback, unchanged
    assert tok.decode(r.ids(CHAT, parse("auto"))).endswith("user: def f(x):\nassistant:")


def test_failures_before_any_weight(tok, kimi):
    r = Renderer(tok, {"kimi": kimi, "plain": ("p.jinja", "{{ messages[0].content }}")})
    with pytest.raises(DiagError, match="no chat template") as e:
        r.check(parse("chat"), field_name="rendering")
    assert e.value.file == "tokenizer_config.json"
    with pytest.raises(DiagError, match="no thinking switch") as e:
        r.check(parse("plain+nothink", ("plain",)), field_name="rendering")
    assert e.value.file == "p.jinja"
    with pytest.raises(DiagError, match="needs a system prompt"):
        r.check(parse("kimi+system", ("kimi",)), field_name="rendering")


def test_template_files(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": KIMI_SWITCH}))
    assert load_template(tmp_path / "tokenizer_config.json", field_name="t") == KIMI_SWITCH
    (tmp_path / "bad.json").write_text(json.dumps({"eos_token": "x"}))
    with pytest.raises(DiagError, match="no chat_template"):
        load_template(tmp_path / "bad.json", field_name="t")
    with pytest.raises(DiagError, match="not found"):
        load_template(tmp_path / "missing.jinja", field_name="rendering.templates.train")
