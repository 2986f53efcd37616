"""Hugging Face hub ids (`org/name`, `org/name@revision`) resolved through huggingface_hub's
cache, exactly as SGLang and vLLM resolve `--model-path moonshotai/Kimi-K2.5`.

The cache is the one the engines read: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
`~/.cache/huggingface/hub` (read when called, so a test's environment counts); `HF_HUB_OFFLINE=1`
keeps every call inside it. Its layout, which huggingface_hub writes and diag only reads:

    <cache>/models--moonshotai--Kimi-K2.5/refs/main            -> "3f1c...9a0e" (a commit sha)
    <cache>/models--moonshotai--Kimi-K2.5/snapshots/3f1c...9a0e/config.json -> ../../blobs/<etag>
    <cache>/models--moonshotai--Kimi-K2.5/trees/3f1c...9a0e.json  (the commit's file list)

Two ways in:
- `snapshot(hub, ...)`: the whole snapshot, for `diag run`. Never downloads (a 550 GB target is
  the user's decision, not a side effect); a missing or partial snapshot is a DiagError that
  names the id, the revision, the cache and the `hf download` command.
- `configs(hub, ...)`: only the JSON files (CONFIG_FILES), for `lint` and `validate`; fetched when
  the network is allowed, so a pair can be linted before its weights are downloaded.

This module knows ids, revisions and the cache; it knows nothing about models, cases or flags
(the caller names the flag or key in `field`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from diag.errors import DiagError

# What lint and validate read, and all that `configs` fetches: no weights, no tokenizer model.
CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "*.safetensors.index.json")
FORM = "org/name or org/name@revision (a Hugging Face hub id), or a local directory"


@dataclass(frozen=True)
class HubId:
    """`moonshotai/Kimi-K2.5@main` -> HubId("moonshotai/Kimi-K2.5", "main", "moonshotai/Kimi-K2.5@main")."""

    repo_id: str
    revision: str           # "main" when the id names none
    spelled: str            # as the user wrote it, for messages


@dataclass(frozen=True)
class Resolved:
    """Where a hub id's files lie in the cache, and how they got there."""

    hub: HubId
    path: Path              # <cache>/models--org--name/snapshots/<commit>
    commit: str
    cache: Path
    fetched: tuple[str, ...] = ()     # files this call downloaded (configs only)

    def describe(self) -> str:
        """e.g. 'org/tiny@main (commit 5d3f0a1c2b4e) from the Hugging Face cache /c/models--org--tiny/...'."""
        got = f"; fetched {', '.join(self.fetched)}" if self.fetched else ""
        return (f"{self.hub.repo_id}@{self.hub.revision} (commit {self.commit[:12]}) from the Hugging Face "
                f"cache: {self.path}{got}")


def cache_dir() -> Path:
    """huggingface_hub's own rule (constants.py), read now rather than at import."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                              "huggingface")
    hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(hub)))


def offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in ("1", "ON", "YES", "TRUE")


def looks_like_hub_id(text: str) -> bool:
    """Hub-shaped: relative, not `./x` or `~/x`, with a `/` or an `@`. 'org/name', 'org/name@v1'
    and 'a/b/c' are (the last is malformed: parse says so); 'ckpt', './org/name', '/m/k' are not."""
    return bool(text) and text[0] not in "/.~" and ("/" in text or "@" in text)


def parse(text: str, *, field: str, file: str | None = None) -> HubId:
    """'org/name@rev' -> HubId; a malformed id is a DiagError naming `field`.
    The revision may hold '/': 'org/name@refs/pr/3' -> revision 'refs/pr/3'."""
    repo, at, revision = text.partition("@")
    if at and not revision:
        raise DiagError("hub id has an empty revision", file=file, field=field,
                        expected="org/name@REVISION (a branch, tag or commit sha) or org/name", found=text)
    if repo.count("/") != 1:
        raise DiagError("not a local directory, and not a hub id", file=file, field=field, expected=FORM,
                        found=f"{text} (no such directory; as a hub id it has {repo.count('/') + 1} "
                              "part(s), not 2: org/name)")
    from huggingface_hub.utils import HFValidationError, validate_repo_id
    try:
        validate_repo_id(repo)
    except HFValidationError as err:
        raise DiagError("malformed hub id", file=file, field=field, expected=FORM, found=f"{text} ({err})") from None
    return HubId(repo, revision or "main", text)


def _storage(hub: HubId, cache: Path) -> Path:
    return cache / ("models--" + hub.repo_id.replace("/", "--"))


def _download_hint(hub: HubId, cache: Path, configs_only: bool = False) -> str:
    """The command that puts the files where this lookup reads them."""
    what = " --include '*.json'" if configs_only else ""
    why = ", or unset HF_HUB_OFFLINE to let diag fetch them" if configs_only and offline() else (
        "" if configs_only else " (diag never downloads weights itself)")
    return f"download it first: hf download {hub.repo_id} --revision {hub.revision} --cache-dir {cache}{what}{why}"


def _not_cached(hub: HubId, cache: Path, field: str, file: str | None, configs_only=False, why="") -> DiagError:
    """Which part is missing: the repo, or this revision of it."""
    storage = _storage(hub, cache)
    if not storage.is_dir():
        found = f"{hub.spelled}: no {storage.name} in the Hugging Face cache {cache}{why}"
        return DiagError("hub id is not in the Hugging Face cache", file=file, field=field,
                         expected=f"a local directory, or {hub.repo_id} downloaded into {cache}",
                         found=found, hint=_download_hint(hub, cache, configs_only))
    have = sorted(p.name for p in (storage / "refs").glob("*")) + sorted(
        p.name[:12] for p in (storage / "snapshots").glob("*"))
    return DiagError("hub revision is not in the Hugging Face cache", file=file, field=field,
                     expected=f"revision {hub.revision} of {hub.repo_id} in {storage}",
                     found=f"only {', '.join(have) or 'nothing'} (refs, then snapshot commits){why}",
                     hint=_download_hint(hub, cache, configs_only))


def _resolved(hub: HubId, folder: str, cache: Path, field: str, file: str | None, fetched=()) -> Resolved:
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise DiagError("hub repo has no config.json", file=file, field=field,
                        expected=f"config.json in {hub.repo_id}@{hub.revision} (a transformers checkpoint)",
                        found=f"{sorted(p.name for p in path.glob('*')) or 'no file'} in {path}")
    return Resolved(hub, path, path.name, cache, tuple(fetched))


def snapshot(hub: HubId, *, field: str, file: str | None = None) -> Resolved:
    """The complete cached snapshot (weights included) for `diag run`; never downloads."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError
    cache = cache_dir()
    try:
        folder = snapshot_download(hub.repo_id, revision=hub.revision, cache_dir=cache, local_files_only=True)
    except IncompleteSnapshotError as err:
        raise DiagError("hub snapshot is incomplete in the Hugging Face cache", file=file, field=field,
                        expected=f"every file of {hub.repo_id}@{hub.revision} (the weights too)",
                        found=str(err).split(" Outgoing")[0].split(" The Hub")[0],
                        hint=_download_hint(hub, cache)) from None
    except LocalEntryNotFoundError:
        raise _not_cached(hub, cache, field, file) from None
    return _resolved(hub, folder, cache, field, file)


def configs(hub: HubId, *, field: str, file: str | None = None) -> Resolved:
    """The snapshot's JSON files (CONFIG_FILES) for lint and validate: from the cache when
    HF_HUB_OFFLINE is set, else fetched from the hub (HF_ENDPOINT), weights left behind."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)
    cache, local = cache_dir(), offline()
    before = set(_storage(hub, cache).glob("snapshots/*/*"))
    try:
        folder = snapshot_download(hub.repo_id, revision=hub.revision, cache_dir=cache, local_files_only=local,
                                   allow_patterns=list(CONFIG_FILES), endpoint=os.environ.get("HF_ENDPOINT"))
    except LocalEntryNotFoundError as err:
        why = "" if local else f"; the hub could not be reached ({str(err.__cause__ or err).splitlines()[0][:160]})"
        raise _not_cached(hub, cache, field, file, True, why) from None
    except RevisionNotFoundError:
        raise DiagError("hub revision not found", file=file, field=field,
                        expected=f"a branch, tag or commit of {hub.repo_id}", found=hub.revision) from None
    except RepositoryNotFoundError:
        raise DiagError("hub repo not found (or gated: set HF_TOKEN)", file=file, field=field,
                        expected="a model repo on the hub", found=hub.repo_id) from None
    except HfHubHTTPError as err:
        raise DiagError("the hub refused the request", file=file, field=field,
                        expected=f"{hub.repo_id}@{hub.revision} readable", found=str(err).splitlines()[0]) from None
    fetched = sorted(p.name for p in Path(folder).glob("*") if p not in before)   # none: no such folder
    return _resolved(hub, folder, cache, field, file, fetched)
