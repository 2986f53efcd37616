"""The bad-input catalogue's machinery (issue 16): each entry builds one bad input from tiny
random checkpoints (tests/tiny.py), runs `diag` in-process, and checks the outcome it states:

  Error(needles)   a clear error: exit 2, the message names each needle (the file, key or flag,
                   and what was found), carries "expected:" and "found:", and no traceback;
                   with before_weights (the default) no target weight may have been read:
                   the target loaders are replaced by ones that fail the test.
  Handled(check)   correct handling: exit 0 (or the command's own code), then `check(ctx)` on
                   what the run left (report.json, notes, files).

A traceback (any exception but DiagError) fails the entry, and so does a report directory
left behind by an error.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
from safetensors.torch import load_file, save_file

import tiny
from diag.cli.main import main

TINY_ARGS = ("--max-new-tokens", "8", "--layout", "embed+L2+L3", "--tree", "chain-2", "--quiet")


@dataclass(frozen=True)
class Error:
    needles: tuple[str, ...]
    before_weights: bool = True
    code: int = 2


@dataclass(frozen=True)
class Handled:
    check: Callable
    code: int = 0


@dataclass(frozen=True)
class Bad:
    """One bad input: `build(ctx)` returns the command line; `expect` says what must happen."""
    id: str
    build: Callable
    expect: Error | Handled
    marks: tuple = field(default=())

    def param(self):
        return pytest.param(self, id=self.id, marks=list(self.marks))


class Ctx:
    """A test's view of the shared tiny pair, with helpers to copy and break parts of it."""

    def __init__(self, pair: dict, tmp: Path):
        self.pair, self.tmp = pair, tmp
        self.out = tmp / "report"
        self.cache = tmp / "cache"
        self.stderr = ""
        self.stdout = ""
        self.env: dict[str, str] = {}         # set by a build, applied before the command runs

    # -- copies that may be broken --------------------------------------------------------
    def copy(self, what: str) -> Path:
        dst = self.tmp / what
        if not dst.exists():
            shutil.copytree(self.pair[what], dst)
        return dst

    def target(self, *, config=None, tensors=None) -> Path:
        return self._edit(self.copy("target"), config, tensors)

    def drafter(self, *, config=None, tensors=None) -> Path:
        return self._edit(self.copy("drafter"), config, tensors)

    @staticmethod
    def _edit(path: Path, config, tensors) -> Path:
        if config is not None:
            cfg = json.loads((path / "config.json").read_text())
            config(cfg)
            (path / "config.json").write_text(json.dumps(cfg))
        if tensors is not None:
            f = path / "model.safetensors"
            t = load_file(str(f))
            tensors(t)
            save_file(t, str(f), metadata={"format": "pt"})
        return path

    def write(self, name: str, text: str | bytes) -> Path:
        p = self.tmp / name
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        return p

    def lines(self, name: str, rows: list) -> Path:
        return self.write(name, "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")

    # -- command lines -------------------------------------------------------------------
    def run(self, *extra: str, target=None, drafter=None, prompts=None, tiny_args=TINY_ARGS) -> list[str]:
        return ["run", "--target", str(target or self.pair["target"]), "--drafter",
                str(drafter or self.pair["drafter"]), "--prompts", str(prompts or self.pair["prompts"]),
                "--out", str(self.out), *tiny_args, *extra]

    def case(self, body: str, name: str = "case.toml", **paths) -> Path:
        p = {"target": self.pair["target"], "drafter": self.pair["drafter"], "prompts": self.pair["prompts"],
             **paths}
        head = (f'version = 1\nname = "bad"\n[target]\npath = "{p["target"]}"\n[drafter]\n'
                f'path = "{p["drafter"]}"\n')
        return self.write(name, head + body)

    def report(self) -> dict:
        return json.loads((self.out / "report.json").read_text())

    def notes(self) -> list[str]:
        return self.report()["notes"]


def build_pair(root: Path) -> dict:
    return {"target": tiny.make_target(root / "target"), "drafter": tiny.make_drafter(root / "drafter"),
            "prompts": tiny.make_prompts(root / "prompts.jsonl", n=3)}


def _no_weights(*a, **k):
    raise AssertionError("a target weight was loaded before the error: the check comes too late")


def check(bad: Bad, pair: dict, tmp: Path, monkeypatch, capsys) -> Ctx:
    """Run one catalogue entry and assert the outcome it states."""
    ctx = Ctx(pair, tmp)
    monkeypatch.setenv("DIAG_CACHE_DIR", str(ctx.cache))
    argv = bad.build(ctx)
    for k, v in ctx.env.items():
        monkeypatch.setenv(k, v)
    if isinstance(bad.expect, Error) and bad.expect.before_weights:
        import diag.run.target_passes as tp
        monkeypatch.setattr(tp, "load_target", _no_weights)
        monkeypatch.setattr("diag.run.pipeline.target_tables", _no_weights)
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    ctx.stdout, ctx.stderr = captured.out, captured.err
    if isinstance(bad.expect, Error):
        err = ctx.stderr
        assert code == bad.expect.code, f"exit {code}, expected {bad.expect.code}\n{err}\n{ctx.stdout}"
        assert "Traceback" not in err, err
        for needle in (*bad.expect.needles, "expected:", "found:"):
            assert needle in err, f"{needle!r} not in the error:\n{err}"
        assert not (ctx.out / "report.json").exists(), "an error left a report behind"
    else:
        assert code == bad.expect.code, f"exit {code}, expected {bad.expect.code}\n{ctx.stderr}"
        bad.expect.check(ctx)
    return ctx
