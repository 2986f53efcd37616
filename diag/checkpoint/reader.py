"""Reading checkpoint bytes straight into the tensors they fill, from several files at once.

A `Piece` says: the `dest.nbytes` bytes at absolute `offset` of `file` are exactly `dest`'s
contents (a contiguous tensor, on the CPU or any GPU; safetensors data is little-endian and
so is every machine diag runs on). `read_pieces` reads every piece once:

  plan     pieces of a file sorted by offset; runs of them with gaps below `gap_bytes`
           merge into spans; a span longer than `segment_bytes` is cut into segments, so
           one large file is still read by several threads. A file whose digest is wanted
           is read whole, cut at multiples of identity.DIGEST_CHUNK (64 MiB), and each
           digest chunk is hashed as its bytes land (identity's chunk tree: the digest does
           not depend on the segments, the threads or the order they finish in).
  read     each worker thread takes segments (ordered round-robin over destination
           devices, so every GPU's tensors are read and copied concurrently with the
           others') and reads them in `chunk_bytes` chunks with one preadv per chunk:
           bytes for CPU tensors land in the tensors themselves, bytes for GPU tensors in
           one of the worker's two pinned staging buffers, gap bytes in the staging too.
  copy     staged bytes go to their GPU with non-blocking copies on the worker's own
           stream for that GPU; the next read into the same buffer waits for its copies
           (double buffering: reading chunk i+1 overlaps copying chunk i).

Worked example, chunk 8 MiB, a 20 MiB tensor at offset 100 of a file, going to cuda:0:
chunks [100, 100+8Mi), [.., +8Mi), [.., +4Mi) -> three preadv calls into staging, three
copies into dest bytes [0, 8Mi), [8Mi, 16Mi), [16Mi, 20Mi).

No intermediate CPU copy of a shard or a tensor exists: a CPU tensor is read into, a GPU
tensor is read into pinned memory and copied once. This module knows files, bytes, threads
and streams; it knows nothing about models, names or dtypes.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from diag.checkpoint.identity import DIGEST_CHUNK, FileDigest, chunk_hasher, stat_key
from diag.errors import DiagError, env_count

MiB = 1 << 20
_IOV_MAX = 512  # iovecs per preadv (Linux allows 1024)


@dataclass(frozen=True)
class Piece:
    file: Path
    offset: int            # absolute byte offset in the file
    dest: torch.Tensor     # contiguous; receives dest.numel() * dest.element_size() bytes

    @property
    def nbytes(self) -> int:
        return self.dest.numel() * self.dest.element_size()


@dataclass
class ReadStats:
    """What one read_pieces call did. `digests`: file -> (identity digest, stat before the read)."""
    bytes_read: int = 0
    seconds: float = 0.0
    files: int = 0
    segments: int = 0
    threads: int = 0
    digests: dict = field(default_factory=dict)

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_read / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class _Segment:
    file: Path
    start: int
    end: int
    pieces: tuple[Piece, ...]     # sorted by offset, each overlapping [start, end)
    digest: bool                  # digest-chunk aligned, every byte of it hashed
    device: str                   # the main destination device (for ordering only)


def default_threads() -> int:
    """DIAG_LOAD_THREADS, else 8 (I/O threads: they wait on the disk, not on a core)."""
    n = env_count("DIAG_LOAD_THREADS")
    return 8 if n is None else max(1, n)


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's storage as uint8 [nbytes] (no copy)."""
    if not t.is_contiguous():
        raise ValueError("Piece.dest must be contiguous")
    return t.reshape(-1).view(torch.uint8)


def _spans(pieces: list[Piece], gap_bytes: int) -> list[tuple[int, int, list[Piece]]]:
    """Sorted pieces -> [(start, end, pieces)]: pieces closer than gap_bytes share a span.
    Example, gap 10: pieces [0, 4), [6, 9), [30, 40) -> spans [0, 9) and [30, 40)."""
    out: list[tuple[int, int, list[Piece]]] = []
    for p in pieces:
        if out and p.offset - out[-1][1] <= gap_bytes:
            if p.offset < out[-1][1]:
                raise ValueError(f"overlapping pieces in {p.file} at byte {p.offset}")
            out[-1] = (out[-1][0], p.offset + p.nbytes, out[-1][2] + [p])
        else:
            out.append((p.offset, p.offset + p.nbytes, [p]))
    return out


def _cut(start: int, end: int, pieces: list[Piece], size: int) -> list[tuple[int, int, list[Piece]]]:
    """[start, end) cut into parts of about `size` bytes, each with the pieces it overlaps."""
    n = max(1, -(-(end - start) // size))
    bounds = [start + (end - start) * i // n for i in range(n + 1)]
    return [(a, b, [p for p in pieces if p.offset < b and p.offset + p.nbytes > a])
            for a, b in zip(bounds, bounds[1:])]


def _device_of(pieces) -> str:
    return str(pieces[0].dest.device) if pieces else "cpu"


def plan(pieces: list[Piece], *, digest_files: set[Path] = frozenset(), gap_bytes: int = 4 * MiB,
         segment_bytes: int = 1024 * MiB) -> list[_Segment]:
    """The segments to read, round-robin over destination devices."""
    by_file: dict[Path, list[Piece]] = {}
    for p in pieces:
        if p.nbytes:
            by_file.setdefault(Path(p.file), []).append(p)
    for f in digest_files:
        by_file.setdefault(Path(f), [])
    segs: list[_Segment] = []
    for f, ps in by_file.items():
        ps.sort(key=lambda p: p.offset)
        _spans(ps, gap_bytes=sys.maxsize)                      # raises on overlaps
        if f in digest_files:        # whole file, cut at digest-chunk multiples
            step = max(1, segment_bytes // DIGEST_CHUNK) * DIGEST_CHUNK
            size = f.stat().st_size
            for a in range(0, size, step):
                b = min(size, a + step)
                q = tuple(p for p in ps if p.offset < b and p.offset + p.nbytes > a)
                segs.append(_Segment(f, a, b, q, True, _device_of(q or ps)))
            continue
        for a, b, sp in _spans(ps, gap_bytes):
            segs += [_Segment(f, x, y, tuple(q), False, _device_of(q))
                     for x, y, q in _cut(a, b, sp, segment_bytes)]
    queues: dict[str, list[_Segment]] = {}
    for s in sorted(segs, key=lambda s: -(s.end - s.start)):   # largest first, per device
        queues.setdefault(s.device, []).append(s)
    ordered = []
    while any(queues.values()):
        for q in queues.values():
            if q:
                ordered.append(q.pop(0))
    return ordered


class _Worker:
    """One thread's staging buffers, streams and file handles."""

    def __init__(self, chunk_bytes: int, cuda: bool):
        self.chunk = chunk_bytes
        pin = cuda and torch.cuda.is_available()
        self.bufs = [torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=pin) for _ in range(2)]
        self.views = [memoryview(b.numpy()) for b in self.bufs]
        self.events: list[list] = [[], []]      # CUDA events of copies still reading bufs[i]
        self.streams: dict[torch.device, torch.cuda.Stream] = {}
        self.turn = 0

    def stream(self, dev: torch.device):
        if dev not in self.streams:
            s = torch.cuda.Stream(device=dev)
            s.wait_stream(torch.cuda.current_stream(dev))       # dest allocations come first
            self.streams[dev] = s
        return self.streams[dev]

    def finish(self) -> None:
        for evs in self.events:
            for e in evs:
                e.synchronize()
        for s in self.streams.values():
            s.synchronize()


def _chunk_iovecs(w: _Worker, seg: _Segment, c0: int, c1: int, idx: int):
    """iovecs filling file bytes [c0, c1) in order, and the GPU copies (staging slice ->
    dest slice) to issue once they are read. Returns (iovecs, copies, next piece index)."""
    buf, view = w.bufs[w.turn], w.views[w.turn]
    iov, copies, pos, used = [], [], c0, 0
    pieces = seg.pieces
    while pos < c1:
        while idx < len(pieces) and pieces[idx].offset + pieces[idx].nbytes <= pos:
            idx += 1
        p = pieces[idx] if idx < len(pieces) else None
        if p is None or p.offset >= c1 or p.offset > pos:              # a gap: read, discard
            end = min(c1, p.offset) if p is not None else c1
            iov.append(view[used:used + end - pos])
            used, pos = used + end - pos, end
            continue
        end = min(c1, p.offset + p.nbytes)
        a, b = pos - p.offset, end - p.offset                          # bytes of p.dest
        flat = _flat_bytes(p.dest)
        if flat.device.type == "cpu":
            iov.append(memoryview(flat.numpy())[a:b])
        else:
            iov.append(view[used:used + b - a])
            copies.append((flat[a:b], buf[used:used + b - a]))
            used += b - a
        pos = end
    return iov, copies, idx


def _preadv_exact(fd: int, iov: list[memoryview], offset: int, file: Path) -> None:
    """Fill every iovec from `offset` on; a short read means the file ended early."""
    for k in range(0, len(iov), _IOV_MAX):
        part = iov[k:k + _IOV_MAX]
        want = sum(len(v) for v in part)
        while want:
            got = os.preadv(fd, part, offset)
            if got == 0:
                raise DiagError("a safetensors shard ended before its tensors did (truncated?)",
                                file=str(file), expected=f"bytes up to {offset + want}",
                                found=f"end of file at {offset}")
            offset, want = offset + got, want - got
            while got and part:
                if got >= len(part[0]):
                    got -= len(part[0])
                    part = part[1:]
                else:
                    part = [part[0][got:]] + part[1:]
                    got = 0


def _read_segment(w: _Worker, seg: _Segment, stats: ReadStats, lock: threading.Lock,
                  acc: FileDigest | None) -> None:
    """Read one segment chunk by chunk; with `acc`, no chunk crosses a digest-chunk boundary
    and each digest chunk's hash goes to acc when its last byte is in.
    Example, DIGEST_CHUNK 64 MiB, w.chunk 32 MiB, segment [64Mi, 150Mi): reads [64, 96), [96, 128)
    -> chunk 1 done; [128, 150) -> chunk 2 done (the file's end)."""
    h = None
    fd = os.open(seg.file, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, seg.start, seg.end - seg.start, os.POSIX_FADV_SEQUENTIAL)
        idx, pos = 0, seg.start
        while pos < seg.end:
            c1 = min(seg.end, pos + w.chunk)
            if acc is not None:
                c1 = min(c1, (pos // DIGEST_CHUNK + 1) * DIGEST_CHUNK)
                if pos % DIGEST_CHUNK == 0:
                    h = chunk_hasher()
            for e in w.events[w.turn]:
                e.synchronize()                    # the copies out of this buffer are done
            iov, copies, idx = _chunk_iovecs(w, seg, pos, c1, idx)
            _preadv_exact(fd, iov, pos, seg.file)
            if h is not None:
                for v in iov:
                    h.update(v)
                if c1 % DIGEST_CHUNK == 0 or c1 == acc.size:
                    acc.add(pos // DIGEST_CHUNK, h.digest())
                    h = None
            w.events[w.turn] = _issue(w, copies)
            w.turn ^= 1
            pos = c1
    finally:
        os.close(fd)
    with lock:
        stats.bytes_read += seg.end - seg.start


def _issue(w: _Worker, copies) -> list:
    events = []
    by_dev: dict = {}
    for dst, src in copies:
        by_dev.setdefault(dst.device, []).append((dst, src))
    for dev, pairs in by_dev.items():
        s = w.stream(dev)
        with torch.cuda.stream(s):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(s)
        events.append(ev)
    return events


def read_pieces(pieces: list[Piece], *, threads: int | None = None, chunk_bytes: int = 32 * MiB,
                digest_files: set[Path] = frozenset(), segment_bytes: int = 1024 * MiB) -> ReadStats:
    """Fill every piece's dest from its file; the identity digest of each file in
    digest_files (read whole). Returns what was read, how fast, and the digests."""
    if sys.byteorder != "little":
        raise DiagError("diag reads safetensors bytes directly and needs a little-endian host",
                        expected="little-endian", found=sys.byteorder)
    segs = plan(pieces, digest_files={Path(f) for f in digest_files}, segment_bytes=segment_bytes)
    accs = {}
    for f in {Path(f) for f in digest_files}:      # the stat before any byte is read
        st = stat_key(f)
        accs[f] = FileDigest(st["size"], st)
    n = max(1, min(threads or default_threads(), len(segs)))
    cuda = any(p.dest.is_cuda for p in pieces)
    stats = ReadStats(files=len({s.file for s in segs}), segments=len(segs), threads=n)
    work: queue.Queue = queue.Queue()
    for s in segs:
        work.put(s)
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run() -> None:
        w = _Worker(chunk_bytes, cuda)
        try:
            while not errors:
                try:
                    seg = work.get_nowait()
                except queue.Empty:
                    break
                _read_segment(w, seg, stats, lock, accs.get(seg.file) if seg.digest else None)
        except BaseException as err:  # re-raised in the caller's thread
            errors.append(err)
        finally:
            w.finish()

    t0 = time.perf_counter()
    pool = [threading.Thread(target=run, name=f"diag-read-{i}", daemon=True) for i in range(n)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    stats.seconds = time.perf_counter() - t0
    if errors:
        raise errors[0]
    stats.digests = {f: (acc.hexdigest(), acc.stat) for f, acc in accs.items()}
    return stats
