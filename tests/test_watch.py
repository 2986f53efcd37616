"""`diag run CASE --watch` (cli/watch.py): the edited case runs again on the target the first
run loaded, each run's report written whole; an edit diag refuses prints its error and the watch
goes on; what a watch cannot do is refused before anything loads."""

import json

import pytest

import tiny
from diag.cli import watch as watch_mod
from diag.cli.main import main

SPEEDUP = '[speedup]\nt_decode_ms = 20.0\nt_draft_ms = 1.5\nt_verify_ms = {"3" = 21.0}\n'


@pytest.fixture
def setup(tmp_path, target_loads):
    case = tiny.write_case(tmp_path / "c.toml", tiny.make_target(tmp_path / "t"), tiny.make_drafter(tmp_path / "d"),
                           tiny.make_prompts(tmp_path / "p.jsonl", n=2), layouts=["embed+L2+L3"])
    case.write_text(case.read_text() + "[decoding]\ntemperature = 1.0\nseeds = 1\n" + SPEEDUP)
    return case, target_loads


def _layouts(out):
    rep = json.loads((out / "report.json").read_text())
    return sorted({e["layout"] for e in rep["evaluations"] if e["decoding"] != "greedy"}), rep["timings"]


def test_an_edited_case_runs_again_on_the_loaded_target(tmp_path, setup, monkeypatch, capsys):
    case, loads = setup
    out = tmp_path / "r"
    seen = []

    def edits(files, before):
        seen.append(_layouts(out))
        step = len(seen)
        if step == 1:              # one more layout: its sampled loop needs the target
            case.write_text(case.read_text().replace('layouts = ["embed+L2+L3"]', 'layouts = ["embed+L2+L3", "embed+L1+L3"]'))
        elif step == 2:            # a layout the target cannot have: refused, the watch goes on
            case.write_text(case.read_text().replace('"embed+L1+L3"]', '"embed+L1+L9"]'))
        elif step == 3:
            case.write_text(case.read_text().replace('"embed+L1+L9"]', '"L1+L3+L2"]'))
        else:
            raise KeyboardInterrupt
        assert watch_mod.stamps(files) != before
        return [case]

    monkeypatch.setattr(watch_mod, "wait_for_change", edits)
    code = main(["run", str(case), "--watch", "--out", str(out), "--quiet"])
    text = capsys.readouterr()
    assert code == 0 and len(loads) == 1
    first, second = set(seen[0][0]), set(seen[1][0])    # the case's layouts and the engines' defaults
    assert second - first == {"embed+L1+L3"} and "target_load_s" in seen[0][1]
    assert seen[1][1]["target_kept"] == 1 and "target_load_s" not in seen[1][1]
    assert seen[2] == seen[1]                             # the refused edit left the last report
    assert "embed+L1+L9" in text.err and "the last report stays" in text.out
    assert set(_layouts(out)[0]) - first == {"L1+L3+L2"}
    assert text.out.count("c.toml changed: running again (1 target kept loaded)") == 3
    assert "[watch] stopped" in text.out


@pytest.mark.parametrize("flags, found", [
    (["--target", "T", "--drafter", "D"], "--target/--drafter"),
    (["CASE", "--nproc", "2"], "2 ranks"),
    (["CASE", "--server", "http://localhost:1"], "--server"),
    (["CASE", "--keep-targets", "0"], "0"),
])
def test_what_a_watch_cannot_do_is_refused_before_anything_loads(tmp_path, setup, capsys, flags, found):
    case, loads = setup
    args = [str(case) if f == "CASE" else f for f in flags]
    assert main(["run", *args, "--watch", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "--watch" in err or "--keep-targets" in err
    assert found in err and not loads and not (tmp_path / "r").exists()


def test_stopped_during_a_run_says_the_report_is_the_last_complete_one(tmp_path, capsys):
    from diag.run.case import read_case

    case = tiny.write_case(tmp_path / "c.toml", tmp_path / "t", tmp_path / "d", tiny.make_prompts(tmp_path / "p.jsonl"))
    runs = []

    def once(c):
        runs.append(c)
        if len(runs) == 2:
            raise KeyboardInterrupt            # Ctrl-C in the second run
        return 0

    code = watch_mod.watch(read_case(case), lambda: read_case(case), once, wait=lambda files, before: files[:1])
    out = capsys.readouterr().out
    assert code == 0 and len(runs) == 2
    assert "[watch] stopped during a run: the report is the last complete run's" in out


def test_a_change_is_seen_once_the_file_is_back(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("a")
    before = watch_mod.stamps([f])
    f.unlink()
    assert watch_mod.stamps([f]) == (None,)
    f.write_text("ab")
    assert watch_mod.wait_for_change([f], before, poll_s=0.01) == [f]
