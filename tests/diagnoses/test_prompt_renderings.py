"""Prompt renderings compared: where two renders part (worked examples), the section's
report.json round trip, its schema, its three verdicts and its Markdown."""

import json

import jsonschema

from diag.diagnoses.prompt_renderings import (PromptRenderings, RenderingsSection, differences, first_difference,
                                              parting)
from diag.diagnoses.typed import from_json, to_json

PARTS = {"prompts": 4, "identical": 1,
         "most_common": {"serving": "<think>", "other": "<think></think>", "prompts": 3},
         "examples": [{"prompt": "p1", "index": 17, "context": "<|assistant|>\n", "serving": "<think>",
                       "other": "<think></think>", "serving_tokens": 18, "other_tokens": 19}]}
REPORT = {   # report.json's "renderings", key for key in the order it is written
    "serving": "chat+think", "trained": "chat+nothink", "layout": "embed+L2+L3", "tree": "chain-3",
    "templates": {"train": "/x/train.jinja"},
    "rows": [{"rendering": "chat+think", "roles": ["serving"], "accept_length": 2.1, "ci95": [1.9, 2.3],
              "vs_serving": None, "differs_from_serving": None},
             {"rendering": "chat+nothink", "roles": ["trained"], "accept_length": 3.05, "ci95": [2.8, 3.3],
              "vs_serving": {"difference": 0.95, "ci95": [0.7, 1.2]}, "differs_from_serving": PARTS},
             {"rendering": "raw", "roles": [], "accept_length": None, "ci95": [None, None],
              "vs_serving": None, "differs_from_serving": {**PARTS, "identical": 4, "most_common": None,
                                                           "examples": []}}],
}
R = PromptRenderings()


def test_first_difference_worked_examples():
    assert first_difference([0, 4, 9, 17, 5, 30], [0, 4, 9, 17, 5, 12, 41]) == 5
    assert first_difference([0, 4], [0, 4, 7]) == 2
    assert first_difference([1, 2], [1, 2]) is None
    dec = lambda ids: " ".join(map(str, ids))
    d = parting("p", [0, 4, 9, 17, 5, 30], [0, 4, 9, 17, 5, 12, 41], dec)
    assert (d.index, d.context, d.serving, d.other) == (5, "4 9 17 5", "30", "12 41")
    summary = differences([("a", "c", [1, 2]), ("b", "c", [1, 3])], [("a", "c", [1, 2]), ("b", "c", [1, 4])], dec)
    assert to_json(summary) == {"prompts": 2, "identical": 1, "most_common": {"serving": "3", "other": "4", "prompts": 1},
                                "examples": [{"prompt": "b", "index": 1, "context": "1", "serving": "3", "other": "4",
                                              "serving_tokens": 2, "other_tokens": 2}]}


def test_round_trip_and_schema():
    sec = from_json(RenderingsSection, REPORT)
    assert sec.row("chat+nothink").differs_from_serving.examples[0].index == 17 and sec.row(None) is None
    assert json.dumps(to_json(sec)) == json.dumps(REPORT)             # same keys, same order
    assert R.read({"renderings": REPORT}) == sec and (R.key, R.name) == ("renderings", "prompt_renderings")
    v = jsonschema.Draft202012Validator(R.schema())
    assert not list(v.iter_errors(REPORT))
    assert list(v.iter_errors({**REPORT, "serving": "chat+fast"}))
    assert list(v.iter_errors({**REPORT, "rows": [{**REPORT["rows"][0], "roles": ["server"]}] * 2}))


def test_a_mismatch_warns_with_serving_minus_trained():
    (v,) = R.verdicts(from_json(RenderingsSection, REPORT))
    assert (v.kind, v.severity) == ("rendering-mismatch", "warning")     # -0.95, CI [-1.20, -0.70] below zero
    assert "difference -0.95, 95% CI [-1.20, -0.70], paired over 4 prompts" in v.text
    assert "first differ at token 17 of prompt p1" in v.text and "(3 of 4 prompts differ)" in v.text
    assert v.evidence["ci95"] == [-1.2, -0.7] and v.evidence["differs"] == PARTS


def test_served_as_trained_and_no_trained_rendering():
    same = from_json(RenderingsSection, {**REPORT, "trained": "chat+think"})
    (v,) = R.verdicts(same)
    assert (v.kind, v.severity) == ("rendering-match", "ok") and "(chat+think): accept length 2.10" in v.text
    (v,) = R.verdicts(from_json(RenderingsSection, {**REPORT, "trained": None}))
    assert (v.kind, v.severity) == ("renderings", "info")
    assert v.text.endswith("(serving: chat+think): chat+think 2.10, chat+nothink 3.05, raw n/a.")
    assert v.evidence == {"rows": REPORT["rows"]}


def test_markdown():
    md = R.markdown(from_json(RenderingsSection, REPORT), {"renderings": REPORT})
    assert md[0] == "## Prompt renderings"
    assert ("| `chat+nothink` | trained | **3.05** | 2.80–3.30 | +0.95 [+0.70, +1.20] | 3 of 4 | "
            "`<\\|assistant\\|>\\n` → `<think>` / `<think></think>` |") in md      # | escaped in a cell
    assert "| `raw` | – | **–** | – | – | 0 of 4 | – |" in md
    assert md[-2:] == ["Templates: `train` = `/x/train.jinja`", ""]
