"""`--out` never destroys what diag did not write, and the swap of an old report for a new one
is atomic (issue 16.1). Each test reproduces a data loss the old `shutil.rmtree(out)` caused."""

import json
import os
import signal
from pathlib import Path

import pytest

from diag.errors import DiagError
from diag.report import outdir
from diag.report.outdir import MANIFEST, check_out_dir, partial_dir, swap_into_place, write_manifest


def _report(folder: Path, text: str) -> Path:
    (folder / "plots").mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps({"text": text}))
    (folder / "report.md").write_text(text)
    (folder / "plots" / "a.png").write_bytes(b"png")
    write_manifest(folder)
    return folder


def _fill(tmp: Path, text: str) -> Path:
    (tmp / "report.json").write_text(json.dumps({"text": text}))
    write_manifest(tmp)
    return tmp


def test_user_files_are_refused_and_kept(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    with pytest.raises(DiagError) as err:
        check_out_dir(notes)
    assert "todo.txt" in str(err.value) and "refusing to replace" in str(err.value)
    assert (notes / "todo.txt").read_text() == "mine"


def test_checkpoint_directory_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(DiagError, match="config.json"):
        check_out_dir(ckpt)
    assert sorted(p.name for p in ckpt.iterdir()) == ["config.json", "model.safetensors"]


def test_working_directory_and_its_parents_are_refused(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for out in (".", "..", str(work)):
        with pytest.raises(DiagError, match="working directory"):
            check_out_dir(out)


def test_a_file_and_a_link_are_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(DiagError, match="not a directory"):
        check_out_dir(f)
    real = _report(tmp_path / "real", "old")
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(DiagError, match="symbolic link"):
        check_out_dir(link)


def test_a_file_added_to_an_old_report_protects_it(tmp_path):
    out = _report(tmp_path / "rep", "old")
    (out / "my-analysis.txt").write_text("keep")
    with pytest.raises(DiagError, match="my-analysis.txt"):
        check_out_dir(out)


def test_new_path_empty_dir_and_own_report_are_accepted(tmp_path):
    assert check_out_dir(tmp_path / "a" / "b") == (tmp_path / "a" / "b").absolute()
    (tmp_path / "empty").mkdir()
    check_out_dir(tmp_path / "empty")
    check_out_dir(_report(tmp_path / "rep", "old"))


def test_read_only_parent_fails_before_the_run(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user that ignores permissions (root)")
        with pytest.raises(DiagError, match="cannot be written"):
            check_out_dir(ro / "rep")
    finally:
        ro.chmod(0o700)


def test_swap_replaces_the_old_report(tmp_path):
    out = _report(tmp_path / "rep", "old")
    swap_into_place(_fill(partial_dir(out), "new"), out)
    assert json.loads((out / "report.json").read_text())["text"] == "new"
    assert not (out / "plots").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]


def test_swap_without_exchange_support(tmp_path, monkeypatch):
    monkeypatch.setattr(outdir, "_exchange", lambda a, b: False)
    out = _report(tmp_path / "rep", "old")
    swap_into_place(_fill(partial_dir(out), "new"), out)
    assert json.loads((out / "report.json").read_text())["text"] == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]


def test_crash_between_the_two_renames_is_recovered(tmp_path, monkeypatch):
    """The fallback path: old renamed away, then the process dies before the new rename.
    The next run puts the old report back instead of losing both."""
    monkeypatch.setattr(outdir, "_exchange", lambda a, b: False)
    out = _report(tmp_path / "rep", "old")
    real_rename, calls = os.rename, []

    def dying(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_rename(src, dst)

    monkeypatch.setattr(outdir.os, "rename", dying)
    with pytest.raises(KeyboardInterrupt):
        swap_into_place(_fill(partial_dir(out), "new"), out)
    monkeypatch.setattr(outdir.os, "rename", real_rename)
    assert not out.exists()
    check_out_dir(out)                         # the next run starts here
    assert json.loads((out / "report.json").read_text())["text"] == "old"


@pytest.mark.usefixtures("sigint_delivered")
def test_sigint_during_the_swap_is_delivered_after_it(tmp_path, monkeypatch):
    out = _report(tmp_path / "rep", "old")
    real = outdir._exchange

    def interrupted(a, b):
        os.kill(os.getpid(), signal.SIGINT)      # arrives mid-swap, must wait for its end
        return real(a, b)

    monkeypatch.setattr(outdir, "_exchange", interrupted)
    with pytest.raises(KeyboardInterrupt):
        swap_into_place(_fill(partial_dir(out), "new"), out)
    assert json.loads((out / "report.json").read_text())["text"] == "new"
    assert (out / MANIFEST).is_file()


def test_stale_partials_of_dead_runs_are_removed(tmp_path):
    out = tmp_path / "rep"
    stale = tmp_path / ".rep.partial-999999999-abc"
    stale.mkdir()
    partial_dir(out)
    assert not stale.exists()


def test_a_report_of_diag_0_1_without_manifest_is_diags(tmp_path):
    old = tmp_path / "old"
    (old / "plots").mkdir(parents=True)
    (old / "report.json").write_text(json.dumps({"kind": "diag-report",
                                                 "plots": [{"file": "plots/a.png", "title": "a"}]}))
    (old / "report.md").write_text("x")
    (old / "samples.jsonl").write_text("")
    (old / "plots" / "a.png").write_bytes(b"png")
    check_out_dir(old)
    (old / "plots" / "mine.png").write_bytes(b"png")      # a plot report.json does not name
    with pytest.raises(DiagError, match="plots/mine.png"):
        check_out_dir(old)
    (old / "plots" / "mine.png").unlink()
    (old / "mine.txt").write_text("keep")
    with pytest.raises(DiagError, match="mine.txt"):
        check_out_dir(old)
