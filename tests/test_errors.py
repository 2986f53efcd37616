"""Bad inputs fail with a message naming the file and field, what was expected and what was
found, and never leave a report directory behind."""

import json

import pytest

from diag.cli.main import main
from tiny import make_drafter, make_prompts, make_target, write_case


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    return make_target(root / "target"), make_drafter(root / "drafter"), make_prompts(root / "prompts.jsonl")


def run_cli(args, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    code = main(args)
    return code, capsys.readouterr().err


def check(err: str, *needles: str):
    for n in needles:
        assert n in err, f"{n!r} not in error message:\n{err}"


def test_missing_target_directory(tmp_path, pair, capsys, monkeypatch):
    _, drafter, prompts = pair
    case = write_case(tmp_path / "c.toml", tmp_path / "nope", drafter, prompts)
    out = tmp_path / "report"
    code, err = run_cli(["run", str(case), "--out", str(out), "--quiet"], capsys, monkeypatch, tmp_path)
    assert code == 2
    check(err, str(tmp_path / "nope"), "expected:", "found:", "does not exist")
    assert not out.exists()


def test_fc_width_does_not_match_layout(tmp_path, pair, capsys, monkeypatch):
    target, _, prompts = pair
    drafter = make_drafter(tmp_path / "d2", num_aux=2, ids=[1, 2], trained="L1+L2")
    case = write_case(tmp_path / "c.toml", target, drafter, prompts, layouts=["embed+L2+L3"])
    out = tmp_path / "report"
    code, err = run_cli(["run", str(case), "--out", str(out), "--quiet"], capsys, monkeypatch, tmp_path)
    assert code == 2
    check(err, "evaluate.layouts", "fc.weight", "2 capture points", "embed+L2+L3 (3 points)", str(case))
    assert not out.exists()


def test_vocabulary_mismatch(tmp_path, pair, capsys, monkeypatch):
    target, _, prompts = pair
    drafter = make_drafter(tmp_path / "d3", vocab=400)
    case = write_case(tmp_path / "c.toml", target, drafter, prompts)
    code, err = run_cli(["run", str(case), "--out", str(tmp_path / "r"), "--quiet"], capsys, monkeypatch, tmp_path)
    assert code == 2
    check(err, "vocabularies differ", str(drafter / "config.json"), "vocab_size", "expected: 300", "found:    400")


def test_drafter_built_for_another_width(tmp_path, pair, capsys, monkeypatch):
    target, _, prompts = pair
    drafter = make_drafter(tmp_path / "d4", target_hidden=64)
    case = write_case(tmp_path / "c.toml", target, drafter, prompts)
    code, err = run_cli(["run", str(case), "--out", str(tmp_path / "r"), "--quiet"], capsys, monkeypatch, tmp_path)
    assert code == 2
    check(err, "target_hidden_size", "32", "64")


@pytest.mark.parametrize("text,needles", [
    ('version = 1\nname = "x"\n[target]\npath = "a"\n[drafter]\npath = "b"\n', ["prompts", "missing"]),
    ('version = 2\nname = "x"\n', ["version", "expected: 1", "found:    2"]),
    ('version = 1\nname = "x"\nlayuots = []\n', ["layuots", "unknown key"]),
    ('version = 1\nname = "x"\n[target]\npath = 3\n[drafter]\npath = "b"\n[prompts]\nfile = "p"\n',
     ["target.path", "str", "3"]),
    ('version = 1\nname = [\n', ["not valid TOML"]),
    ('version = 1\nname = "x"\n[target]\npath = "a"\n[drafter]\npath = "b"\n[prompts]\nfile = "p"\n'
     '[evaluate]\nlayouts = ["embed+L2+Q7"]\n', ["evaluate.layouts", "Q7"]),
    ('version = 1\nname = "x"\n[target]\npath = "a"\n[drafter]\npath = "b"\n[prompts]\nfile = "p"\n'
     '[evaluate]\nlayouts = ["L1+L2+L3"]\ntrees = ["s3-k0-d5"]\n', ["evaluate.trees", "s3-k0-d5"]),
])
def test_malformed_case(tmp_path, capsys, monkeypatch, text, needles):
    case = tmp_path / "bad.toml"
    case.write_text(text)
    code, err = run_cli(["validate", str(case)], capsys, monkeypatch, tmp_path)
    assert code == 2
    check(err, str(case), *needles)


def test_missing_drafter_weight_is_an_error_not_random_init(tmp_path, pair, capsys, monkeypatch):
    from safetensors.torch import load_file, save_file
    target, _, prompts = pair
    drafter = make_drafter(tmp_path / "d5")
    state = load_file(str(drafter / "model.safetensors"))
    del state["midlayer.self_attn.q_proj.weight"]
    save_file(state, str(drafter / "model.safetensors"))
    case = write_case(tmp_path / "c.toml", target, drafter, prompts)
    out = tmp_path / "report"
    code, err = run_cli(["run", str(case), "--out", str(out), "--quiet"], capsys, monkeypatch, tmp_path)
    assert code == 2
    check(err, "midlayer.self_attn.q_proj.weight", "randomly initialised", str(drafter))
    assert not out.exists()


def test_missing_target_weight_is_an_error(tmp_path, pair, capsys, monkeypatch):
    from safetensors.torch import load_file, save_file
    import shutil
    _, drafter, prompts = pair
    target = tmp_path / "t"
    shutil.copytree(pair[0], target)
    state = load_file(str(target / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
    case = write_case(tmp_path / "c.toml", target, drafter, prompts)
    code, err = run_cli(["run", str(case), "--out", str(tmp_path / "r"), "--quiet"], capsys, monkeypatch, tmp_path)
    assert code == 2
    check(err, "model.layers.1.mlp.up_proj.weight", str(target), "missing")


def test_tokenizer_larger_than_embedding(tmp_path, pair, capsys, monkeypatch):
    import shutil
    _, drafter, prompts = pair
    target = tmp_path / "t"
    shutil.copytree(pair[0], target)
    cfg = json.loads((target / "config.json").read_text())
    cfg["vocab_size"] = 100
    (target / "config.json").write_text(json.dumps(cfg))
    case = write_case(tmp_path / "c.toml", target, drafter, prompts)
    code, err = run_cli(["run", str(case), "--out", str(tmp_path / "r"), "--quiet"], capsys, monkeypatch, tmp_path)
    assert code == 2
    assert "vocab" in err and str(target) in err


def test_prompt_file_errors(tmp_path, pair, capsys, monkeypatch):
    target, drafter, _ = pair
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"id": "a", "text": "x"}\n{"id": "b"}\n')
    case = write_case(tmp_path / "c.toml", target, drafter, bad)
    code, err = run_cli(["validate", str(case)], capsys, monkeypatch, tmp_path)
    assert code == 2
    check(err, f"{bad}:2", "exactly one of text / messages")
