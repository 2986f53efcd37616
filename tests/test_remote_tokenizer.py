"""A tokenizer built like Kimi's (tiktoken rank file + remote-code class + chat_template.jinja)
is refused with a clear error unless trusted, and runs when trusted from the command line, the
case, or the SGLang launch command."""

import json
from dataclasses import replace

import pytest

from diag.cli.main import main
from diag.errors import DiagError
from diag.run.case import ServingSpec
from diag.run.inputs import trusts_remote_code
from diag.run.prompts.records import Prompt
from diag.run.prompts import tokenize
from diag.target.tokenizer import load_tokenizer, remote_tokenizer_class
from tiny import make_drafter, make_target, make_tiktoken_tokenizer

pytest.importorskip("tiktoken")


@pytest.fixture(scope="module")
def kimi_like(tmp_path_factory):
    """A tiny random target whose only tokenizer is the tiktoken remote-code one."""
    root = tmp_path_factory.mktemp("remote")
    target = make_target(root / "target")
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (target / f).unlink(missing_ok=True)
    make_tiktoken_tokenizer(target)
    prompts = root / "p.jsonl"
    prompts.write_text(json.dumps({"text": "def f(x):\n    return the x"}) + "\n" +
                       json.dumps({"conversations": [{"from": "human", "value": "define it"}]}) + "\n")
    return target, make_drafter(root / "drafter"), prompts


def test_untrusted_remote_tokenizer_names_the_flag(kimi_like):
    target = kimi_like[0]
    assert remote_tokenizer_class(target) == "tokenization_tiny_kimi.TinyTikTokenTokenizer"
    with pytest.raises(DiagError, match="remote code") as err:
        load_tokenizer(target)
    e = err.value
    assert "--trust-remote-code" in e.expected and e.field == "auto_map.AutoTokenizer"
    assert e.file.endswith("tokenizer_config.json") and e.found == "tokenization_tiny_kimi.TinyTikTokenTokenizer"


def test_trusted_tiktoken_tokenizer_and_its_jinja_chat_template(kimi_like):
    tok = load_tokenizer(kimi_like[0], trust_remote_code=True)
    assert type(tok).__name__ == "TinyTikTokenTokenizer" and len(tok) == 279
    text = "def f(x):\n    return the x"
    ids = tokenize(Prompt("1", "c", text, None), tok)
    assert tok.decode(ids) == text and 259 in ids                # 259 = the "def" merge
    chat = tokenize(Prompt("2", "c", None, (("user", "hi"),)), tok)
    pieces = tok.convert_ids_to_tokens(chat)                     # chat_template.jinja applied
    assert pieces[0] == "<|im_user|>" and pieces[-1] == "<|im_middle|>" and "<|im_assistant|>" in pieces


def test_trust_from_case_flag_or_launch(tmp_path):
    from tiny import write_case
    from diag.run.case import read_case
    case = read_case(write_case(tmp_path / "c.toml", tmp_path / "t", tmp_path / "d", tmp_path / "p.jsonl"))
    assert not trusts_remote_code(case)
    assert trusts_remote_code(replace(case, target=replace(case.target, trust_remote_code=True)))
    launch = "python -m sglang.launch_server --model-path /m --trust-remote-code --tp 8"
    assert trusts_remote_code(replace(case, serving=ServingSpec(launch=launch)))
    assert not trusts_remote_code(replace(case, serving=ServingSpec(launch=launch.replace(" --trust-remote-code", ""))))


def test_drafter_trust_is_refused(tmp_path):
    from tiny import write_case
    from diag.run.case import check_case, read_case
    case = read_case(write_case(tmp_path / "c.toml", tmp_path / "t", tmp_path / "d", tmp_path / "p.jsonl"))
    with pytest.raises(DiagError, match="belongs to the target") as err:
        check_case(replace(case, drafter=replace(case.drafter, trust_remote_code=True)))
    assert err.value.field == "drafter.trust_remote_code"


def test_diag_run_refuses_then_runs_with_the_flag(kimi_like, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    target, drafter, prompts = kimi_like
    args = ["run", "--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts),
            "--layout", "embed+L2+L3", "--tree", "chain-2", "--max-new-tokens", "6", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 2
    assert "--trust-remote-code" in capsys.readouterr().err and not (tmp_path / "a").exists()
    assert main([*args, "--out", str(tmp_path / "b"), "--trust-remote-code"]) == 0
    rep = json.loads((tmp_path / "b" / "report.json").read_text())
    assert rep["case"]["spec"]["target"]["trust_remote_code"] is True
    assert rep["prompts"]["count"] == 2
