"""Zoo cache entries damaged on disk (issue 35.2, 35.3): a weights file changed after the build,
a zoo_meta.json cut short. Each entry is verified by content (the digests zoo_meta.json records)
and rebuilt, with a line saying why; none is served as it is, none ends in a traceback.

The entries are two cheap stand-ins ("c", "t") in this test's own DIAG_CACHE_DIR: the shared
cache (~/.cache/diag) is never touched, and the real builders are not run."""

import dataclasses

import pytest

from bad_catalogue import Bad, Handled
from diag.zoo import ZOO, cache

BUILDS: list[str] = []


@pytest.fixture(autouse=True)
def stub_zoo(tmp_path, monkeypatch):
    """Entries c (a corpus) and t (a target built from it); the builder writes a weights file
    whose bytes are its name, and logs each build."""
    from diag.zoo import build
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))      # what the catalogue uses too
    monkeypatch.setitem(ZOO, "c", dataclasses.replace(ZOO["stdlib-corpus"], name="c"))
    monkeypatch.setitem(ZOO, "t", dataclasses.replace(ZOO["llama-tiny"], name="t", recipe=dataclasses.replace(
        ZOO["llama-tiny"].recipe, corpus="c")))
    BUILDS.clear()

    def builder(name, out, deps):
        BUILDS.append(name)
        (out / "model.safetensors").write_bytes(f"weights of {name}".encode() * 64)
        (out / "config.json").write_text("{}")
        return {}
    monkeypatch.setattr(build, "_run_builder", builder)


def _built_then(damage):
    def build(ctx):
        from diag.zoo.build import ensure
        ensure(["t"], progress=False)
        assert BUILDS == ["c", "t"]
        damage(cache.entry_dir("t"))
        return ["zoo", "path", "t"]
    return build


def _flip_byte(entry):
    f = entry / "model.safetensors"
    raw = bytearray(f.read_bytes())
    raw[100] ^= 0xFF
    f.write_bytes(bytes(raw))


def _cut_meta(entry):
    f = entry / "zoo_meta.json"
    f.write_text(f.read_text()[:40])


def rebuilt(why):
    def check(ctx):
        assert BUILDS == ["c", "t", "t"], BUILDS                           # t alone, once more
        assert (cache.entry_dir("t") / "model.safetensors").read_bytes() == b"weights of t" * 64
        assert why in ctx.stderr and "rebuilding t" in ctx.stderr, ctx.stderr
        assert ctx.stdout.strip() == str(cache.entry_dir("t"))
    return check


CATALOGUE = [
    Bad("zoo-entry-weights-damaged-on-disk", _built_then(_flip_byte),
        Handled(rebuilt("its model.safetensors changed on disk since it was built"))),
    Bad("zoo-entry-weights-deleted", _built_then(lambda e: (e / "model.safetensors").unlink()),
        Handled(rebuilt("its model.safetensors is missing"))),
    Bad("zoo-meta-truncated", _built_then(_cut_meta), Handled(rebuilt("zoo_meta.json is missing or unreadable"))),
]


@pytest.mark.parametrize("bad", [b.param() for b in CATALOGUE])
def test_bad_zoo(bad, outcome):
    outcome(bad)


def test_an_intact_entry_is_served_without_a_rebuild(outcome):
    from diag.zoo.build import ensure, stale
    ensure(["t"], progress=False)
    assert stale("t") is None and ensure(["t"], progress=False)["t"] == cache.entry_dir("t")
    assert BUILDS == ["c", "t"]


def test_an_intact_entry_is_served_not_rebuilt():
    """The digests recorded at the build are the ones the check computes: when they were sha256
    against the identity's xxh3 digest, every entry looked damaged and was rebuilt at each use."""
    from diag.zoo.build import ensure, read_meta
    ensure(["t"], progress=False)
    ensure(["t"], progress=False)
    assert BUILDS == ["c", "t"], BUILDS
    from diag.checkpoint.identity import DIGEST_VERSION
    assert read_meta("t")["files_digest"] == DIGEST_VERSION


def test_an_entry_with_sha256_digests_is_still_verified():
    """Entries of the first diag that recorded digests (sha256, no files_digest key)."""
    import hashlib
    import json
    from diag.zoo.build import META_FILE, ensure
    ensure(["t"], progress=False)
    meta_file = cache.entry_dir("t") / META_FILE
    meta = json.loads(meta_file.read_text())
    del meta["files_digest"]
    meta["files"] = {f: hashlib.sha256((cache.entry_dir("t") / f).read_bytes()).hexdigest() for f in meta["files"]}
    meta_file.write_text(json.dumps(meta))
    ensure(["t"], progress=False)
    assert BUILDS == ["c", "t"], BUILDS                    # intact: served
    _flip_byte(cache.entry_dir("t"))
    ensure(["t"], progress=False)
    assert BUILDS == ["c", "t", "t"], BUILDS               # damaged: rebuilt
