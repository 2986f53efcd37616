"""diag.checkpoint.reader: every byte of every piece lands where it belongs (any chunk,
segment and thread count, gaps skipped or hashed), digests equal the identity digest of the file, and
the INT4 loader built on it fills every tensor exactly as safetensors' own reader does."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from diag.checkpoint.headers import read_header
from diag.checkpoint.identity import digest_bytes, is_memoised, memoised_digest
from diag.checkpoint.reader import MiB, Piece, _spans, plan, read_pieces
from diag.errors import DiagError


def _shard(path: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "a.bf16": torch.randn(37, 53, generator=g).to(torch.bfloat16),
        "b.i32": torch.randint(-2 ** 31, 2 ** 31, (301, 7), generator=g, dtype=torch.int64).to(torch.int32),
        "c.f32": torch.randn(1000, generator=g),
        "d.i64": torch.tensor([7168, 2048]),
        "e.bool": torch.rand(13, generator=g) > 0.5,
        "f.f16": torch.randn(4, 999, generator=g).to(torch.float16),
    }
    save_file(tensors, str(path))
    return tensors


def _pieces(path: Path, names, device="cpu"):
    infos = read_header(path)
    dests = {n: torch.empty(infos[n].shape, dtype=_dtype(infos[n].dtype), device=device) for n in names}
    return [Piece(path, infos[n].offset, dests[n]) for n in names], dests


def _dtype(s):
    return {"BF16": torch.bfloat16, "I32": torch.int32, "F32": torch.float32, "I64": torch.int64,
            "BOOL": torch.bool, "F16": torch.float16}[s]


def test_spans_worked_example():
    t = lambda n: torch.empty(n, dtype=torch.uint8)  # noqa: E731
    ps = [Piece(Path("f"), 0, t(4)), Piece(Path("f"), 6, t(3)), Piece(Path("f"), 30, t(10))]
    assert [(a, b, len(p)) for a, b, p in _spans(ps, 10)] == [(0, 9, 2), (30, 40, 1)]
    with pytest.raises(ValueError, match="overlapping"):
        _spans([Piece(Path("f"), 0, t(4)), Piece(Path("f"), 2, t(4))], 10)


@pytest.mark.parametrize("chunk,segment,threads", [(1000, 1 << 30, 1), (333, 2000, 3), (64, 500, 8),
                                                   (32 * MiB, 1 << 30, 2)])
def test_pieces_bit_identical_to_safetensors(tmp_path, chunk, segment, threads):
    files = [tmp_path / f"m{i}.safetensors" for i in range(3)]
    want = {f: _shard(f, i) for i, f in enumerate(files)}
    pieces, dests = [], {}
    for i, f in enumerate(files):
        names = sorted(want[f]) if i != 1 else ["b.i32", "e.bool"]        # file 1: gaps skipped
        ps, ds = _pieces(f, names)
        pieces += ps
        dests.update({(f, n): d for n, d in ds.items()})
    for d in dests.values():                                              # poison
        d.view(torch.uint8).fill_(0xA5) if d.dtype != torch.bool else d.fill_(True)
    stats = read_pieces(pieces, threads=threads, chunk_bytes=chunk, segment_bytes=segment,
                        digest_files={files[2]})
    for (f, n), d in dests.items():
        assert torch.equal(d, want[f][n]), (f.name, n)
    assert set(stats.digests) == {files[2]}
    assert stats.digests[files[2]][0] == digest_bytes(files[2].read_bytes())
    assert stats.bytes_read >= sum(p.nbytes for p in pieces)


def test_large_file_is_cut_into_segments_and_digest_reads_whole(tmp_path):
    f = tmp_path / "m.safetensors"
    _shard(f)
    ps, _ = _pieces(f, ["b.i32", "f.f16"])
    assert len(plan(ps, segment_bytes=1000)) > 2
    whole = plan(ps, digest_files={f}, segment_bytes=1000)
    assert len(whole) == 1 and (whole[0].start, whole[0].end) == (0, f.stat().st_size)


def test_truncated_shard_is_a_diag_error(tmp_path):
    f = tmp_path / "m.safetensors"
    _shard(f)
    ps, _ = _pieces(f, ["f.f16"])
    data = f.read_bytes()
    f.write_bytes(data[:-100])                     # the last tensor loses its tail
    last = max(ps, key=lambda p: p.offset)
    if last.offset + last.nbytes <= len(data) - 100:
        pytest.skip("f.f16 is not the last tensor in this safetensors layout")
    with pytest.raises(DiagError, match="ended before"):
        read_pieces(ps, threads=1, chunk_bytes=128)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pieces_to_the_gpu_through_pinned_staging(tmp_path):
    f = tmp_path / "m.safetensors"
    want = _shard(f)
    ps, dests = _pieces(f, sorted(want), device="cuda")
    read_pieces(ps, threads=4, chunk_bytes=777, segment_bytes=5000)
    for n, d in dests.items():
        assert torch.equal(d.cpu(), want[n]), n


# ---- the INT4 loader on top of it ------------------------------------------------------

def _slots_and_infos(path):
    from diag.checkpoint.headers import tensor_infos
    from diag.int4 import load as L
    from diag.int4.scheme import parse_quantization_config
    from diag.int4.skeleton import build_meta, resolve_config

    text = resolve_config(json.loads((Path(path) / "config.json").read_text()))
    scheme = parse_quantization_config(text.quantization)
    infos = tensor_infos(Path(path))
    model = build_meta(text)
    slots = L._install_packed(model, scheme, text, infos, "cpu")
    return slots + L._dense_slots(model, slots, text.prefix), infos


def _check_every_slot(model, path):
    """What the previous loader did, slot by slot: view.copy_(get_tensor(key).to(view.dtype))."""
    slots, infos = _slots_and_infos(path)
    handles, n = {}, 0
    for s in slots:
        if s.key not in infos or s.kind == "shape":
            continue
        f = infos[s.key].file
        handles.setdefault(f, safe_open(str(f), framework="pt"))
        t = handles[f].get_tensor(s.key)
        try:
            dest = model.get_parameter(s.target)
        except AttributeError:
            dest = model.get_buffer(s.target)
        view = (dest[s.index] if s.index else dest).cpu()
        assert torch.equal(view, t.to(view.dtype)), s.key
        n += 1
    return n


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_int4_loader_fills_every_tensor_as_safetensors_reads_it(dtype, tmp_path, monkeypatch):
    from diag.int4.load import load_packed_target
    from diag.zoo.kimi_shaped import kimi_shaped
    from diag.bench.cpu import SMALL

    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    ks = kimi_shaped(tmp_path / "k", layers=3, widths=SMALL, drafter=False)
    model = load_packed_target(ks.target, dtype=dtype)
    assert _check_every_slot(model, ks.target) > 100
    assert model.diag_read_stats.bytes_read >= ks.bytes_on_disk


def test_loader_primes_the_digest_memo_so_identity_reads_nothing(tmp_path, monkeypatch):
    from diag.checkpoint import identity
    from diag.int4.load import load_packed_target
    from diag.zoo.kimi_shaped import kimi_shaped
    from diag.bench.cpu import SMALL

    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    ks = kimi_shaped(tmp_path / "k", layers=2, widths=SMALL, drafter=False)
    shards = sorted(ks.target.glob("*.safetensors"))
    assert all(memoised_digest(f) is None for f in shards)
    load_packed_target(ks.target, digest=False)
    assert all(memoised_digest(f) is None for f in shards)
    model = load_packed_target(ks.target)                       # memo misses: hashed while read
    assert set(model.diag_read_stats.digests) == set(shards)
    for f in shards:
        assert memoised_digest(f) == digest_bytes(f.read_bytes())
    want = identity.checkpoint_identity(ks.target)
    real = identity.hash_file
    monkeypatch.setattr(identity, "hash_file", lambda p, **kw: pytest.fail(f"re-read {p}") if p.suffix ==
                        ".safetensors" else real(p, **kw))
    assert identity.checkpoint_identity(ks.target) == want and is_memoised(ks.target)
    assert load_packed_target(ks.target).diag_read_stats.digests == {}   # memo hits: not hashed
