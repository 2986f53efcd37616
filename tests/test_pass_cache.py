"""The target-pass cache answers only for the same content, and never from a corrupt entry
(issue 16.2). Each test reproduces a case where the old header-only key gave a previous
run's numbers: retrained weights of the same shapes, NaN-corrupted weights, another
tokenizer, and a cache file with flipped bytes."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import tiny
from diag.run.case import read_case
from diag.checkpoint.identity import checkpoint_identity, file_digest
from diag.errors import DiagError
from diag.run.pipeline import run_case


@pytest.fixture()
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    target = tiny.make_target(tmp_path / "t")
    case = tiny.write_case(tmp_path / "case.toml", target, tiny.make_drafter(tmp_path / "d"),
                           tiny.make_prompts(tmp_path / "p.jsonl", n=2))
    return tmp_path, target, case


def run(case):
    return run_case(read_case(case), progress=False)


def numbers(r) -> list:
    return [(e.key, e.accept_length, e.trajectory_rounds) for e in r.evaluations]


def cached(r) -> bool:
    return all(m["cached"] for m in r.target_pass["regimes"].values())


def test_second_run_is_served_from_the_cache_with_the_same_numbers(setup):
    _, _, case = setup
    first, second = run(case), run(case)
    assert not cached(first) and cached(second)
    assert numbers(first) == numbers(second)


def _rewrite_weights(target: Path, change) -> None:
    f = target / "model.safetensors"
    tensors = load_file(str(f))
    change(tensors)
    save_file(tensors, str(f), metadata={"format": "pt"})


def test_retrained_weights_with_the_same_shapes_miss_the_cache(setup):
    _, target, case = setup
    run(case)
    _rewrite_weights(target, lambda t: t.__setitem__("model.norm.weight", t["model.norm.weight"] * 0.5))
    again = run(case)
    assert not cached(again)


def test_nan_corrupted_weights_miss_the_cache(setup):
    _, target, case = setup
    run(case)

    def poison(t):
        w = t["model.layers.0.mlp.up_proj.weight"]
        w[0, 0] = float("nan")
    before = checkpoint_identity(target)
    _rewrite_weights(target, poison)
    assert checkpoint_identity(target) != before
    with pytest.raises(DiagError) as err:          # the key misses; loading it is an error (16.3)
        run(case)
    assert "model.layers.0.mlp.up_proj.weight" in str(err.value) and "NaN" in str(err.value)


def test_another_tokenizer_misses_the_cache(setup):
    tmp, target, case = setup
    run(case)
    cfg = json.loads((target / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = 123
    (target / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert not cached(run(case))


def test_flipped_bytes_in_a_cache_entry_are_recomputed_with_a_note(setup):
    tmp, _, case = setup
    first = run(case)
    entry = next((tmp / "cache" / "passes").glob("*.safetensors"))
    raw = bytearray(entry.read_bytes())
    for i in range(len(raw) - 64, len(raw)):      # 64 flipped bytes inside the tensor data
        raw[i] ^= 0xFF
    entry.write_bytes(bytes(raw))
    again = run(case)
    assert not cached(again)
    assert any("integrity" in n for n in again.notes), again.notes
    assert numbers(again) == numbers(first)
    assert cached(run(case))                       # the entry was rewritten whole


def test_a_torn_cache_entry_is_a_miss_with_a_note(setup):
    tmp, _, case = setup
    run(case)
    entry = next((tmp / "cache" / "passes").glob("*.safetensors"))
    entry.write_bytes(entry.read_bytes()[:100])
    again = run(case)
    assert not cached(again) and any("unreadable" in n for n in again.notes)


def test_digest_memo_follows_the_file_not_the_name(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 1000)
    d1 = file_digest(f)
    st = f.stat()
    f.write_bytes(b"b" * 1000)                      # same size
    import os
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime restored, ctime cannot be
    assert file_digest(f) != d1
    assert file_digest(f) == file_digest(f)


def test_identity_counts_weights_configs_and_tokenizer_but_not_prose(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "ck"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"x")
    base = checkpoint_identity(d)
    (d / "README.md").write_text("prose")
    assert checkpoint_identity(d) == base
    (d / "tiktoken.model").write_text("ranks")
    assert checkpoint_identity(d) != base


def test_an_empty_cache_dir_variable_means_the_default_never_the_cwd(monkeypatch, tmp_path):
    """DIAG_CACHE_DIR='' once put passes/ and digests/ into the working directory."""
    from diag.checkpoint.identity import cache_root
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("DIAG_CACHE_DIR", "")
    assert cache_root() == tmp_path / ".cache" / "diag"


def test_a_digest_memo_from_another_version_is_recomputed_with_a_note_and_still_hits(setup):
    """The weights' memo rewritten as the sha256 memos of earlier diag versions were: the
    digest is recomputed (same bytes -> same key -> a correct cache hit) and the report says why."""
    from diag.checkpoint import memo
    from diag.checkpoint.identity import cache_root, stat_key

    _, target, case = setup
    first = run(case)
    f = target / "model.safetensors"
    record = memo.record_file(cache_root(), stat_key(f))
    record.write_text(json.dumps({**stat_key(f), "sha256": "ab" * 32}))
    again = run(case)
    assert cached(again) and numbers(again) == numbers(first)
    assert any("another diag version" in n and "model.safetensors" in n for n in again.notes), again.notes
    assert not any("another diag version" in n for n in run(case).notes)     # the memo was rewritten
