"""The zoo's prompt-side entries (recipes_prompt_side.py) are what their summaries say:
llama-tiny-think's thinking switch changes what it writes (upper case with thinking on), its
tokenizer carries the Kimi-style template, and the prompt-side drafters declare their layout,
train on the positions their recipe gives and draft better than chance."""

import json

import pytest

from diag.layouts import layout
from diag.run.render import thinking_switch
from diag.zoo import ZOO, is_built, zoo_path
from diag.zoo.build import META_FILE
from diag.zoo.build_drafters import specforge_ids
from diag.zoo.recipes_prompt_side import ENTRIES, PromptDrafterRecipe, ThinkingRecipe
from diag.zoo.tokenizer import THINKING_CHAT_TEMPLATE

# slow while an entry still has to be built (the first run builds it), as test_zoo.py does
pytestmark = [] if all(is_built(e.name) for e in ENTRIES) else [pytest.mark.slow]


def _meta(name: str) -> dict:
    return json.loads((zoo_path(name, progress=False) / META_FILE).read_text())["metrics"]


def test_entries_are_in_the_zoo_with_their_dependencies():
    for e in ENTRIES:
        assert ZOO[e.name] is e and all(n in ZOO for n in e.needs), e.name
        if isinstance(e.recipe, PromptDrafterRecipe):
            r = e.recipe.drafter
            target = ZOO[r.target].recipe
            shape = ZOO[target.source].recipe.shape if isinstance(target, ThinkingRecipe) else target.shape
            layout(r.layout).check_against(shape.num_hidden_layers)


def test_thinking_target_writes_other_text_with_thinking_on():
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(zoo_path("llama-tiny-think", progress=False)))
    assert tok.chat_template == THINKING_CHAT_TEMPLATE and thinking_switch(tok.chat_template) == "thinking"
    m = _meta("llama-tiny-think")
    assert m["upper_share_thinking"] > 0.25 and m["upper_share_no_thinking"] < 0.1     # measured 0.42 / 0.03
    assert m["train_loss_last"] < m["train_loss_first"] - 1.0


@pytest.mark.parametrize("name, positions", [("llama-tiny-think-eagle3-nothink", None),
                                             ("llama-tiny-eagle3-short", 8 + 16 + 3)])
def test_prompt_side_drafters_declare_layout_and_positions(name, positions):
    recipe = ZOO[name].recipe.drafter
    cfg = json.loads((zoo_path(name, progress=False) / "config.json").read_text())
    assert cfg["diag_trained_layout"] == recipe.layout
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == specforge_ids(layout(recipe.layout))
    m = _meta(name)
    assert m["greedy_chain"]["accept_length"] > 1.5                       # measured 2.92 / 2.39
    assert m["positions"] == (positions or m["positions"]) and m["positions"] > recipe.budget.seq_len
