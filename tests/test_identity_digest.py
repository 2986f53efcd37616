"""The content digest (checkpoint.identity, checkpoint.memo): one definition whatever reads
the bytes (any chunk, segment and thread count, the loader's read or a standalone hash), a
changed byte always misses, and a memo that disagrees with the file or comes from another
version is recomputed with a note, never answered. DIGEST_CHUNK is shrunk to 4 KiB so that
small files span many digest chunks."""

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from diag.checkpoint import identity, memo, reader
from diag.checkpoint.headers import read_header
from diag.checkpoint.identity import (digest_bytes, drain_notes, file_digest, hash_file, memoised_digest,
                                      prime_digest, stat_key)
from diag.checkpoint.reader import Piece, read_pieces

SMALL_CHUNK = 4096


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch, tmp_path):
    monkeypatch.setattr(identity, "DIGEST_CHUNK", SMALL_CHUNK)
    monkeypatch.setattr(reader, "DIGEST_CHUNK", SMALL_CHUNK)
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    drain_notes()


def _bytes(n: int, seed: int = 0) -> bytes:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).numpy().tobytes()


@pytest.mark.parametrize("size", [0, 1, SMALL_CHUNK, 5 * SMALL_CHUNK + 123])
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_standalone_hash_does_not_depend_on_threads(tmp_path, size, threads):
    f = tmp_path / "w.bin"
    f.write_bytes(_bytes(size))
    assert hash_file(f, threads=threads)[0] == digest_bytes(f.read_bytes())


def test_digest_is_a_tree_of_fixed_chunks():
    """Worked: 2 chunks + 10 bytes -> 3 chunk digests under the version and size."""
    import xxhash
    data = _bytes(2 * SMALL_CHUNK + 10)
    top = xxhash.xxh3_128(f"{identity.DIGEST_VERSION}\0{len(data)}\0".encode())
    for i in range(3):
        top.update(xxhash.xxh3_128(data[i * SMALL_CHUNK:(i + 1) * SMALL_CHUNK]).digest())
    assert digest_bytes(data) == top.hexdigest()
    assert digest_bytes(data) != digest_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert digest_bytes(b"") != digest_bytes(b"\0")


def _shard(path):
    g = torch.Generator().manual_seed(3)
    tensors = {f"t{i}": torch.randn(300 * (i + 1), generator=g) for i in range(6)}
    save_file(tensors, str(path))
    return tensors


@pytest.mark.parametrize("chunk,segment,threads", [(1000, 3000, 1), (4096, 10000, 3), (333, 1 << 30, 8),
                                                   (1 << 20, 1, 2)])
def test_loader_digest_equals_the_digest_after_the_fact(tmp_path, chunk, segment, threads):
    """The reader hashes while it fills tensors (pieces with gaps between them), in
    segments and threads of any size: the same digest as hashing the file alone."""
    f = tmp_path / "m.safetensors"
    want = _shard(f)
    infos = read_header(f)
    names = ["t1", "t4"]                                  # gaps: the others are read, not kept
    dests = {n: torch.empty_like(want[n]) for n in names}
    pieces = [Piece(f, infos[n].offset, dests[n]) for n in names]
    assert f.stat().st_size > 3 * SMALL_CHUNK
    stats = read_pieces(pieces, threads=threads, chunk_bytes=chunk, segment_bytes=segment, digest_files={f})
    assert all(torch.equal(dests[n], want[n]) for n in names)
    digest, stat = stats.digests[f]
    assert digest == digest_bytes(f.read_bytes()) == hash_file(f, threads=threads)[0]
    assert stat == stat_key(f)


def test_a_changed_byte_with_the_same_size_and_mtime_misses(tmp_path):
    f = tmp_path / "w.safetensors"
    data = _bytes(3 * SMALL_CHUNK)
    f.write_bytes(data)
    before = file_digest(f)
    st = f.stat()
    f.write_bytes(data[:5000] + bytes([data[5000] ^ 1]) + data[5001:])    # a retrained weight
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    after = file_digest(f)
    assert after != before and after == digest_bytes(f.read_bytes())


def _record(f):
    return memo.record_file(identity.cache_root(), stat_key(f))


def test_a_memo_that_disagrees_with_the_file_under_the_same_stat_is_recomputed(tmp_path):
    """The bytes change while the stat stays (forged here by rewriting the record's stat):
    the spot check sees it, the digest is recomputed, and a note says why."""
    f = tmp_path / "w.safetensors"
    data = _bytes(4 * SMALL_CHUNK)
    f.write_bytes(data)
    stale = file_digest(f)
    f.write_bytes(bytes([data[0] ^ 1]) + data[1:])       # the header's first byte
    rec = json.loads(_record(f).read_text())
    rec.update(stat_key(f))                              # the memo claims the current stat
    rec["check"] = memo._check(rec)
    _record(f).write_text(json.dumps(rec))
    assert memoised_digest(f) is None
    notes = drain_notes()
    assert len(notes) == 1 and "disagree with the digest memoised under the same stat" in notes[0]
    assert str(f) in notes[0]
    fresh = file_digest(f)
    assert fresh != stale and fresh == digest_bytes(f.read_bytes()) and memoised_digest(f) == fresh


def test_a_full_hash_that_disagrees_with_the_memo_replaces_it_with_a_note(tmp_path):
    f = tmp_path / "w.bin"
    f.write_bytes(_bytes(SMALL_CHUNK + 1))
    st = stat_key(f)
    assert prime_digest(f, st, "0" * 32)                # a wrong digest slipped in
    drain_notes()
    assert prime_digest(f, st, digest_bytes(f.read_bytes()))
    assert any("disagree" in n and "replaced" in n for n in drain_notes())
    assert memoised_digest(f) == digest_bytes(f.read_bytes())


@pytest.mark.parametrize("record,why", [
    (lambda st: {**st, "sha256": "ab" * 32}, "another diag version (digest sha256"),
    (lambda st: {**st, "version": "xxh3-128-tree-1MiB-v0", "digest": "00"}, "another diag version"),
    (lambda st: "not json {", "damaged"),
    (lambda st: {**st, "version": identity.DIGEST_VERSION, "digest": "11" * 16, "probe": "x", "check": "y"},
     "damaged"),
])
def test_a_memo_from_another_version_or_damaged_is_recomputed_with_a_note(tmp_path, record, why):
    f = tmp_path / "w.bin"
    f.write_bytes(_bytes(2 * SMALL_CHUNK))
    file_digest(f)
    rec = record(stat_key(f))
    _record(f).write_text(rec if isinstance(rec, str) else json.dumps(rec))
    assert memoised_digest(f) is None
    assert any(why in n and str(f) in n for n in drain_notes())
    assert file_digest(f) == digest_bytes(f.read_bytes())
    drain_notes()
    assert memoised_digest(f) == digest_bytes(f.read_bytes()) and drain_notes() == []   # rewritten


def test_an_interrupted_memo_write_leaves_the_old_record_and_no_temporary(tmp_path, monkeypatch):
    f = tmp_path / "w.bin"
    f.write_bytes(_bytes(100))
    want = file_digest(f)
    old = _record(f).read_text()

    def interrupted(a, b):
        raise KeyboardInterrupt
    monkeypatch.setattr(memo.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prime_digest(f, stat_key(f), "22" * 16)
    assert _record(f).read_text() == old and memoised_digest(f) == want
    assert [p.name for p in _record(f).parent.iterdir()] == [_record(f).name]


def test_a_repeat_lookup_reads_only_the_spot_check(tmp_path, monkeypatch):
    f = tmp_path / "w.bin"
    f.write_bytes(_bytes(20 * SMALL_CHUNK))
    want = file_digest(f)
    monkeypatch.setattr(identity, "hash_file", lambda *a, **k: pytest.fail("hashed again"))
    assert file_digest(f) == want


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_the_one_reduction_finite_check_finds_every_nan_and_inf(dtype):
    """check_finite's fast path (aminmax, the loader's check beside the digested read): a NaN,
    +Inf or -Inf at the first, a middle or the last place of a chunk is an error; none is not."""
    from diag.checkpoint.finite import _CHUNK, check_finite
    from diag.errors import DiagError

    n = _CHUNK + 5                                       # two chunks: the second 5 values long
    base = torch.randn(n, generator=torch.Generator().manual_seed(1)).to(dtype)
    check_finite("w", base, "f")
    for pos in (0, n // 3, _CHUNK - 1, _CHUNK, n - 1):
        for bad in (float("nan"), float("inf"), float("-inf")):
            x = base.clone()
            x[pos] = bad
            with pytest.raises(DiagError, match=r"first at \[%d\]" % pos):
                check_finite("w", x, "f")
