"""The long_context diagnosis (diag/diagnoses/long_context.py): the ladder's worked example,
the prompts it cuts, the marks, the typed section through report.json and its schema, the
verdict, the Markdown and the plot."""

import json

import jsonschema
import pytest

from diag.diagnoses.long_context import LongContext, LongContextSection, ladder, long_context_section, rung_lengths
from diag.diagnoses.typed import from_json, to_json
from diag.errors import DiagError
from diag.replay.evaluation import PromptRounds
from test_prompt_side import evaluation


def test_rung_lengths_worked_example():
    assert rung_lengths(1024, 64, 4) == [16, 320, 640, 960]


def test_ladder_cuts_prompts_of_each_length(tmp_path):
    import tiny
    from transformers import AutoTokenizer
    tiny.make_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    text = " ".join(f"word{i}" for i in range(400))
    rows = ladder(tok, text, "t.txt", length=200, max_new_tokens=20, rungs=3, per_rung=2)
    assert [(pid, len(ids)) for pid, _, ids in rows] == \
        [("long-16-0", 16), ("long-16-1", 16), ("long-90-0", 90), ("long-90-1", 90), ("long-180-0", 180),
         ("long-180-1", 180)]
    assert rows[0][2] != rows[1][2]                      # other offsets of the text
    with pytest.raises(DiagError, match="too short") as err:
        ladder(tok, "word " * 10, "t.txt", length=200, max_new_tokens=20, rungs=3, per_rung=2)
    assert err.value.file == "t.txt"


def test_long_context_marks_rungs_below_half_of_the_short_one():
    e = evaluation([PromptRounds("long-16-0", (2, 2, 2)), PromptRounds("long-500-0", (1, 1, 0)),
                    PromptRounds("long-900-0", (0, 1, 0, 0))])
    sec = long_context_section(e, length=1000, source="t.txt", seed=0, n_boot=100)
    assert [r.accepted_drafts for r in sec.rungs] == pytest.approx([2.0, 2 / 3, 0.25])
    assert sec.half_of_short == 1.0 and sec.short_context == sec.rungs[0]
    assert [r.below_half for r in sec.rungs] == [False, True, True] and sec.falls_below_half_at == 500
    back = json.loads(json.dumps(to_json(sec)))
    assert back["rungs"][1]["position"] == 500 and from_json(LongContextSection, back) == sec
    assert not list(jsonschema.Draft202012Validator(LongContext().schema()).iter_errors(back))
    (v,) = LongContext().verdicts(sec)
    assert v.severity == "warning" and v.text.startswith("LONG CONTEXT: from position 500")
    md = LongContext().markdown(sec, {"plots": [{"file": "plots/long_context.png", "title": "T"}]})
    assert "| 500 | 1 | 3 | 1.67 | 1.67–1.67 | 0.67 | ▼ |" in md and "![T](plots/long_context.png)" in md


def test_long_context_plot(tmp_path):
    e = evaluation([PromptRounds("long-16-0", (2, 2, 2)), PromptRounds("long-500-0", (1, 1, 0))])
    sec = long_context_section(e, length=1000, source="t.txt", seed=0, n_boot=100)
    (made,) = LongContext().plots(sec, {}, tmp_path)
    assert made["file"] == "plots/long_context.png" and (tmp_path / made["file"]).read_bytes()[:4] == b"\x89PNG"
