"""Test support: Hugging Face hub caches and a hub built from local directories, offline.

`add_to_cache` lays a directory out exactly as huggingface_hub's file_download.py does:

    <cache>/models--org--tiny/blobs/<etag>                  the bytes (git blob sha1, sha256 for LFS)
    <cache>/models--org--tiny/snapshots/<commit>/<file>     -> ../../blobs/<etag> (relative symlink)
    <cache>/models--org--tiny/refs/main                     "<commit>" (no newline)

`FakeHub` serves such directories over HTTP on 127.0.0.1 with the endpoints huggingface_hub
calls (hf_api.py repo_info / list_repo_tree, file_download.py get_hf_file_metadata / http_get):

    GET  /api/models/{repo}/revision/{rev}    {"id", "sha", "siblings"}
    GET  /api/models/{repo}/tree/{rev}        [{"type": "file", "path", "size", "oid", "lfs"?}]
    HEAD /{repo}/resolve/{rev}/{file}         ETag, X-Repo-Commit, Content-Length
    GET  /{repo}/resolve/{rev}/{file}         the bytes
and the error codes hf_raise_for_status reads (X-Error-Code: RepoNotFound, RevisionNotFound,
EntryNotFound). Every request is recorded in `requests`, so a test can prove what was fetched.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


def etag_of(name: str, data: bytes) -> str:
    """The hub's ETag, which names the blob: sha256 for LFS files (weights), else the git blob sha1."""
    if name.endswith((".safetensors", ".bin")):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def add_to_cache(cache: Path, repo_id: str, src: Path, commit: str, refs=("main",), only=None,
                 tree: bool = False) -> Path:
    """Put src's files into the cache as commit `commit` of repo_id; refs point at it.
    only: the file names to copy (None: all); tree: also write trees/<commit>.json listing all of
    src's files, as snapshot_download does (then a snapshot missing some is known incomplete).
    Returns the snapshot directory."""
    storage = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    snap = storage / "snapshots" / commit
    snap.mkdir(parents=True)
    (storage / "blobs").mkdir(exist_ok=True)
    for f in sorted(Path(src).iterdir()):
        if only is not None and f.name not in only:
            continue
        data = f.read_bytes()
        blob = storage / "blobs" / etag_of(f.name, data)
        blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    (storage / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (storage / "refs" / ref).write_text(commit)
    if tree:
        files = {}
        for f in sorted(Path(src).iterdir()):
            e = FakeHub._entry(f)
            files[f.name] = {"size": e["size"], "blob_id": e["oid"],
                             **({"lfs_sha256": e["lfs"]["oid"], "lfs_size": e["size"]} if "lfs" in e else {})}
        (storage / "trees").mkdir()
        (storage / "trees" / f"{commit}.json").write_text(json.dumps({"format_version": 1, "files": files}))
    return snap


class FakeHub:
    """repos: {repo_id: (commit, directory)}; the revision 'main' and the commit both resolve."""

    def __init__(self, repos: dict[str, tuple[str, Path]]):
        self.repos = repos
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._serve(self, body=False)

            def do_GET(self):
                hub._serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    # -- the endpoints -----------------------------------------------------------------
    def _repo(self, parts: list[str]):
        """(repo_id, rest) when parts start with a known org/name."""
        repo = "/".join(parts[:2])
        return (repo, parts[2:]) if repo in self.repos else (None, parts[2:])

    def _commit(self, repo: str, rev: str) -> str | None:
        commit = self.repos[repo][0]
        return commit if rev in ("main", commit) else None

    def _serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = urlparse(h.path).path
        self.requests.append((h.command, path))
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] == ["api", "models"]:
            return self._api(h, parts[2:], body)
        repo, rest = self._repo(parts)
        if repo is None or rest[:1] != ["resolve"]:
            return self._error(h, 404, "RepoNotFound", body)
        commit = self._commit(repo, rest[1])
        if commit is None:
            return self._error(h, 404, "RevisionNotFound", body)
        f = self.repos[repo][1] / "/".join(rest[2:])
        if not f.is_file():
            return self._error(h, 404, "EntryNotFound", body, commit)
        data = f.read_bytes()
        self._send(h, data, body, {"ETag": f'"{etag_of(f.name, data)}"', "X-Repo-Commit": commit,
                                   "Content-Type": "application/octet-stream"})

    def _api(self, h, parts: list[str], body: bool) -> None:
        repo, rest = self._repo(parts)
        if repo is None:
            return self._error(h, 404, "RepoNotFound", body)
        commit = self._commit(repo, rest[1]) if len(rest) > 1 else None
        if commit is None:
            return self._error(h, 404, "RevisionNotFound", body)
        files = sorted(p for p in self.repos[repo][1].iterdir() if p.is_file())
        if rest[0] == "revision":
            out = {"id": repo, "sha": commit, "siblings": [{"rfilename": p.name} for p in files]}
        else:                                   # tree
            out = [self._entry(p) for p in files]
        self._send(h, json.dumps(out).encode(), body, {"Content-Type": "application/json"})

    @staticmethod
    def _entry(p: Path) -> dict:
        data = p.read_bytes()
        entry = {"type": "file", "path": p.name, "size": len(data),
                 "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
        if p.suffix == ".safetensors":
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    @staticmethod
    def _send(h, data: bytes, body: bool, headers: dict) -> None:
        h.send_response(200)
        for k, v in {**headers, "Content-Length": str(len(data))}.items():
            h.send_header(k, v)
        h.end_headers()
        if body:
            h.wfile.write(data)

    @staticmethod
    def _error(h, status: int, code: str, body: bool, commit: str | None = None) -> None:
        data = json.dumps({"error": code}).encode()
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        if commit:
            h.send_header("X-Repo-Commit", commit)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)
