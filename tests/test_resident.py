"""Targets kept loaded between runs (target/resident.py, `diag run --watch`): inside kept() a
run takes the model an earlier run loaded when its files, dtype, regime, placement and numerics
are unchanged, and reports exactly what a run that loads its own reports; a rewritten shard, a
new regime or the end of the block loads again; at most `capacity` models are held."""

import gc
import json
import os
import weakref

import pytest

import tiny
from diag.report.writer import write_report
from diag.run.case import read_case
from diag.run.pipeline import run_case
from diag.target import resident


class _Model:
    pass


def _key(tmp_path, regime="as-loaded"):
    return resident.Key.make(tmp_path, "torch.float32", regime, None, "transformers")


def test_a_held_model_is_taken_and_another_key_drops_the_oldest_first(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x")
    held, loads = resident.Held(1), []

    def load():
        loads.append(1)
        return _Model()

    first, was = held.take(_key(tmp_path), load)
    again, was_again = held.take(_key(tmp_path), load)
    assert (was, was_again, len(loads)) == (False, True, 1) and again is first
    gone = weakref.ref(first)
    del first, again
    other, _ = held.take(_key(tmp_path, "w4a16-g32"), load)
    gc.collect()
    assert gone() is None and len(loads) == 2          # dropped before the other one loaded
    two = resident.Held(2)
    a, _ = two.take(_key(tmp_path), load)
    b, _ = two.take(_key(tmp_path, "w4a16-g32"), load)
    assert two.take(_key(tmp_path), load)[0] is a and two.take(_key(tmp_path, "w4a16-g32"), load)[0] is b
    with pytest.raises(ValueError, match="capacity"):
        resident.Held(0)


def test_a_shard_rewritten_in_place_is_another_key(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    shard = tmp_path / "model-00001-of-00002.safetensors"
    shard.write_bytes(b"x")
    before = _key(tmp_path)
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert _key(tmp_path) != before
    assert _key(tmp_path) == _key(tmp_path)
    assert resident.Key.make(tmp_path, "torch.bfloat16", "as-loaded", None, "transformers") != _key(tmp_path)


def _case(tmp_path, name, layouts, regimes=("as-loaded",)):
    target = tmp_path / "t"
    if not target.exists():
        tiny.make_target(target), tiny.make_drafter(tmp_path / "d"), tiny.make_prompts(tmp_path / "p.jsonl", n=2)
    path = tiny.write_case(tmp_path / f"{name}.toml", target, tmp_path / "d", tmp_path / "p.jsonl",
                           layouts=list(layouts), trees=["chain-2"], regimes=list(regimes))
    path.write_text(path.read_text() + "[decoding]\ntemperature = 1.0\ntop_p = 0.9\nseeds = 2\n"
                    "[speedup]\nt_decode_ms = 20.0\nt_draft_ms = 1.5\nt_verify_ms = {\"3\" = 21.0}\n")   # measured ones vary
    return read_case(path)


def _report(run, out) -> str:
    write_report(run, out, argv=["diag", "run"])
    rep = json.loads((out / "report.json").read_text())
    rep["created"] = rep["provenance"]["command"] = rep["timings"] = None
    for entry in rep["target_pass"]["regimes"].values():
        entry["seconds"] = None
    return json.dumps(rep, indent=1)


def test_a_kept_target_reports_what_a_loaded_one_does(tmp_path, target_loads):
    loads = target_loads
    """Passes recomputed (no cache) and the sampled loop decoded on the model the first run
    loaded: the second case's report equals the same case run on its own load."""
    one = _case(tmp_path, "one", ["embed+L2+L3"])
    two = _case(tmp_path, "two", ["embed+L2+L3", "L1+L2+L3"])
    with resident.kept():
        run_case(one, progress=False, use_cache=False)
        kept = run_case(two, progress=False, use_cache=False)
    assert len(loads) == 1
    assert kept.timings["target_kept"] == 1 and "target_load_s" not in kept.timings
    assert [e for e in kept.evaluations if e.sampled]
    alone = run_case(two, progress=False, use_cache=False)
    assert len(loads) == 2 and "target_kept" not in alone.timings        # outside the block: its own load
    assert _report(kept, tmp_path / "kept") == _report(alone, tmp_path / "alone")


def test_a_rewritten_shard_or_another_regime_loads_again(tmp_path, target_loads):
    loads = target_loads
    one = _case(tmp_path, "one", ["embed+L2+L3"])
    both = _case(tmp_path, "both", ["embed+L2+L3"], regimes=("as-loaded", "w4a16-g32"))
    with resident.kept() as held:
        run_case(one, progress=False, use_cache=False)
        shard = tmp_path / "t" / "model.safetensors"
        st = shard.stat()
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        run_case(one, progress=False, use_cache=False)
        assert len(loads) == 2 and len(held.models) == 1
        run_case(both, progress=False, use_cache=False)      # as-loaded taken, w4a16 loaded in its place
        assert len(loads) == 3 and held.taken == 1
    with resident.kept(capacity=2) as held:
        run_case(both, progress=False, use_cache=False)
        again = run_case(both, progress=False, use_cache=False)
        assert len(loads) == 5 and held.taken == 2 and again.timings["target_kept"] == 2
    assert resident.current() is None and not held.models


def test_the_drafter_and_the_tokenizer_are_read_once_while_their_files_stand(tmp_path, target_loads, monkeypatch):
    """Inside kept() the second run takes the drafter and the tokenizer the first read (timings:
    drafter_kept 1), the same objects; a drafter file touched, or a tokenizer file, reads that
    one again; outside a block every run reads its own; the block's end drops them."""
    import diag.run.inputs as inputs
    import diag.run.pipeline as pipeline

    reads = {"drafter": [], "tokenizer": []}
    real_drafter, real_tok = pipeline.load_drafter, inputs.load_tokenizer

    def drafter(*a, **k):
        reads["drafter"].append(got := real_drafter(*a, **k))
        return got

    def tokenizer(*a, **k):
        reads["tokenizer"].append(got := real_tok(*a, **k))
        return got
    monkeypatch.setattr(pipeline, "load_drafter", drafter)
    monkeypatch.setattr(inputs, "load_tokenizer", tokenizer)
    one = _case(tmp_path, "one", ["embed+L2+L3"])
    with resident.kept() as held:
        first = run_case(one, progress=False)
        second = run_case(one, progress=False)
        assert [len(v) for v in reads.values()] == [1, 1]
        assert (first.timings["drafter_kept"], second.timings["drafter_kept"]) == (0, 1)
        assert {k.kind for k in held.parts} == {"drafter", "tokenizer"}
        for f in (tmp_path / "d" / "model.safetensors", tmp_path / "t" / "tokenizer.json"):
            st = f.stat()
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
            run_case(one, progress=False)
        assert [len(v) for v in reads.values()] == [2, 2] and len(held.parts) == 2     # one of each kind held
    assert not held.parts
    run_case(one, progress=False)
    run_case(one, progress=False)
    assert [len(v) for v in reads.values()] == [4, 4]
    key = resident.PartKey.tokenizer(tmp_path / "t", trust_remote_code=False)
    assert all("safetensors" not in f for f in key.files) and any("tokenizer.json" in f for f in key.files)
