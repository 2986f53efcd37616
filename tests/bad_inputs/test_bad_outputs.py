"""Bad output and cache directories, and broken cache entries (issue 16.1, 16.2, 16.6): the
user's files are never touched, an unwritable directory fails before any weight is loaded,
and a cache entry that is torn or belongs to another key is recomputed with a note."""

import os
import shutil

import pytest

from bad_catalogue import Bad, Error, Handled


def _notes_dir(ctx):
    ctx.out.mkdir()
    (ctx.out / "notes.txt").write_text("mine")
    return ctx.run()


def _kept(ctx):
    assert (ctx.out / "notes.txt").read_text() == "mine"


def _with_out(ctx, out):
    argv = ctx.run()
    argv[argv.index("--out") + 1] = str(out)
    return argv


def _out_file(ctx):
    ctx.write("report", "a file")
    return ctx.run()


def _out_link(ctx):
    real = ctx.tmp / "real"
    real.mkdir()
    os.symlink(real, ctx.out)
    return ctx.run()


def _out_checkpoint(ctx):
    return _with_out(ctx, ctx.drafter())


def _checkpoint_kept(ctx):
    assert sorted(p.name for p in (ctx.tmp / "drafter").iterdir()) == ["config.json", "model.safetensors"]


def _out_cwd(ctx):
    os.chdir(ctx.tmp)
    return _with_out(ctx, ".")


def _cache_below_file(ctx):
    ctx.write("blocker", "x")
    ctx.env["DIAG_CACHE_DIR"] = str(ctx.tmp / "blocker" / "cache")
    return ctx.run()


def _cache_passes_is_file(ctx):
    ctx.cache.mkdir()
    (ctx.cache / "passes").write_text("x")
    return ctx.run()


def _cache_read_only(ctx):
    ctx.cache.mkdir()
    ctx.cache.chmod(0o500)
    if os.access(ctx.cache, os.W_OK):
        ctx.cache.chmod(0o700)
        pytest.skip("running as a user that ignores permissions (root)")
    return ctx.run()


def _no_cache_with_blocked_cache(ctx):
    ctx.write("blocker", "x")
    ctx.env["DIAG_CACHE_DIR"] = str(ctx.tmp / "blocker" / "cache")
    return ctx.run("--no-cache")


def _report_written(ctx):
    assert ctx.report()["evaluations"]


def _garbage_entry(ctx):
    from diag.cli.main import main
    assert main(ctx.run()) == 0
    for entry in (ctx.cache / "passes").glob("*.safetensors"):
        entry.write_bytes(b"\x00" * 64)
    return ctx.run()


def _unreadable_noted(ctx):
    assert any("unreadable" in n and "recomputed" in n for n in ctx.notes()), ctx.notes()
    assert not ctx.report()["target_pass"]["regimes"]["as-loaded"]["cached"]


def _foreign_entry(ctx):
    """The entry of another run (max_new_tokens 9) copied over this run's entry."""
    from diag.cli.main import main
    assert main(ctx.run()) == 0
    mine = set((ctx.cache / "passes").glob("*.safetensors"))
    argv = ctx.run()
    argv[argv.index("--max-new-tokens") + 1] = "9"
    assert main(argv) == 0
    other = next(iter(set((ctx.cache / "passes").glob("*.safetensors")) - mine))
    shutil.copyfile(other, next(iter(mine)))
    return ctx.run()


def _foreign_noted(ctx):
    assert any("another key" in n for n in ctx.notes()), ctx.notes()


CATALOGUE = [
    Bad("out-is-a-file", _out_file, Error(("not a directory", "--out"))),
    Bad("out-is-a-symlink", _out_link, Error(("symbolic link", "--out"))),
    Bad("out-holds-user-files", _notes_dir, Error(("refusing to replace", "notes.txt"))),
    Bad("out-is-the-drafter-checkpoint", _out_checkpoint, Error(("refusing to replace", "model.safetensors"))),
    Bad("out-is-the-working-directory", _out_cwd, Error(("working directory", "--out"))),
    Bad("cache-below-a-file", _cache_below_file, Error(("cache directory cannot be written", "--no-cache"))),
    Bad("cache-passes-is-a-file", _cache_passes_is_file, Error(("cache directory cannot be written", "passes"))),
    Bad("cache-read-only", _cache_read_only, Error(("cache directory cannot be written", "read-only"))),
    Bad("cache-blocked-but-no-cache", _no_cache_with_blocked_cache, Handled(_report_written)),
    Bad("cache-entry-garbage", _garbage_entry, Handled(_unreadable_noted)),
    Bad("cache-entry-of-another-key", _foreign_entry, Handled(_foreign_noted)),
]


@pytest.mark.parametrize("bad", [b.param() for b in CATALOGUE])
def test_bad_output(bad, outcome, monkeypatch):
    monkeypatch.chdir(os.getcwd())          # restored after a build that changes directory
    ctx = outcome(bad)
    if bad.id == "out-holds-user-files":
        _kept(ctx)
    if bad.id == "out-is-the-drafter-checkpoint":
        _checkpoint_kept(ctx)
