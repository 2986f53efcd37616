"""SGLang's launch flags, per release (issue 16.7): the generated table matches the wheels,
the resolver reads words as argparse does, and `lint` reports what SGLang's parser refuses."""

import argparse
import contextlib
import io

import pytest

from diag.engines.sglang import server_flags
from diag.engines.sglang.flag_parser import flag_problems, read_argv, resolve, table_for
from diag.engines.sglang.server_flags_gen import check, encode, extract, render

# sha256 of the tables the generated module server_flags.py held before they became
# server_flags.json (json.dumps of SOURCES, ALGORITHMS and FLAGS as ordered (option, nargs) lists,
# computed from that module's last version, commit bcabe81)
OLD_MODULE_SHA256 = "4c20df29cf383eda793f236dd8e41c4e6eacb925e53555b2cfe27cc6d8d71245"


def _argparse_of(table) -> argparse.ArgumentParser:
    """A real argparse parser with the table's option strings and nargs (as ServerArgs builds its own)."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    seen = set()
    for i, (opt, nargs) in enumerate(sorted(table.flags.items())):
        if opt in seen:
            continue
        seen.add(opt)
        if nargs == 0:
            parser.add_argument(opt, dest=f"d{i}", action="store_true")
        else:
            parser.add_argument(opt, dest=f"d{i}", nargs=None if nargs == 1 else nargs)
    return parser


def _argparse_reads(parser, word: str) -> str:
    """'ok' / 'ambiguous' / 'unknown', and the option it set, as argparse itself reports it."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args([word, "1"] if not word.endswith("=1") else [word])
    except (SystemExit, argparse.ArgumentError) as exc:
        text = err.getvalue() + str(exc)
        if "ambiguous option" in text:
            return "ambiguous"
        if "unrecognized arguments" in text and word.split("=")[0] in text:
            return "unknown"
        return "value-error"
    set_ = [k for k, v in vars(ns).items() if v not in (None, False)]
    return "ok:" + ",".join(set_)


def _dest(parser, option: str) -> str:
    return next(a.dest for a in parser._actions if option in a.option_strings)


def _words(table) -> list[str]:
    """Every flag, some of its prefixes, and the seed misspellings."""
    out = ["--speculative-algoritm", "--speculative-num-step", "--speculative-eagle-top-k",
           "--speculative-num", "--tp", "--tp=1", "--mod", "--model=1"]
    for opt in sorted(table.flags)[::7]:
        out += [opt, opt[: max(3, len(opt) // 2)], opt[:-1], opt + "x"]
    return out


@pytest.mark.parametrize("version", ["0.5.6", "0.5.23"])
def test_resolution_agrees_with_argparse(version):
    table = table_for(version)
    parser = _argparse_of(table)
    for word in _words(table):
        kind, option, _ = resolve(word, table)
        got = _argparse_reads(parser, word)
        if kind in ("exact", "prefix"):
            if table.flags[option] == 0 and not word.endswith("=1"):
                continue      # a switch followed by "1": argparse reports the stray value instead
            assert got.startswith("ok:") and _dest(parser, option) in got, (word, kind, option, got)
        else:
            assert got == kind, (word, kind, got)


def test_seed_misspellings_are_findings_with_the_resolved_flag():
    t = table_for("0.5.23")
    argv = ["--speculative-algoritm", "EAGLE3", "--speculative-num-step", "3", "--speculative-eagle-top-k",
            "4", "--speculative-num", "8", "--speculative-algorithm", "EAGEL3", "--tp-size", "8", "stray"]
    found = {(p.code, p.flag): p for p in flag_problems(argv, t)}
    assert found[("UNKNOWN_FLAG", "--speculative-algoritm")].severity == "error"
    assert "did you mean --speculative-algorithm" in found[("UNKNOWN_FLAG", "--speculative-algoritm")].fix
    assert ("UNKNOWN_FLAG", "--speculative-eagle-top-k") in found
    abbrev = found[("ABBREVIATED_FLAG", "--speculative-num-step")]
    assert abbrev.severity == "warning" and "--speculative-num-steps" in abbrev.message
    amb = found[("AMBIGUOUS_FLAG", "--speculative-num")]
    assert "--speculative-num-draft-tokens" in amb.behaviour and "--speculative-num-steps" in amb.behaviour
    assert "EAGEL3" in found[("UNKNOWN_ALGORITHM", "--speculative-algorithm")].behaviour
    assert ("STRAY_WORD", "stray") in found
    assert not any(p.flag == "--tp-size" for p in found.values())


def test_algorithm_names_follow_the_release():
    assert not flag_problems(["--speculative-algorithm", "eagle3"], table_for("0.5.23"))   # upper-cased
    old = flag_problems(["--speculative-algorithm", "eagle3"], table_for("0.5.6"))        # argparse choices
    assert [p.code for p in old] == ["UNKNOWN_ALGORITHM"] and "invalid choice" in old[0].behaviour
    assert not flag_problems(["--speculative-algorithm", "NEXTN"], table_for("0.5.14"))


def test_values_follow_nargs():
    t = table_for("0.5.23")
    words = read_argv(["--enable-dp-attention", "--speculative-num-steps", "-1", "--lora-paths", "a", "b"], t)
    assert [(w.option, w.values) for w in words] == [
        ("--enable-dp-attention", ()), ("--speculative-num-steps", ("-1",)), ("--lora-paths", ("a", "b"))]
    codes = [p.code for p in flag_problems(["--enable-dp-attention=1", "--model-path"], t)]
    assert codes == ["SWITCH_WITH_VALUE", "FLAG_NEEDS_VALUE"]


def test_a_release_between_tables_uses_the_nearest_below_and_says_so():
    t = table_for("0.5.16")
    assert t.version == "0.5.14" and not t.exact
    assert flag_problems(["--no-such-flag"], t)[0].severity == "warning"
    assert table_for("0.5.1") is None


@pytest.mark.wheel
@pytest.mark.parametrize("version", sorted(server_flags.FLAGS))
def test_table_matches_the_wheel(version):
    """Re-extract the release from its wheel (pip download, cached) and compare."""
    data = extract(version)
    assert (data["wheel"], data["server_args_sha256"]) == server_flags.SOURCES[version]
    assert {o: n for opts, n in data["flags"] for o in opts} == server_flags.FLAGS[version]
    algo = data["algorithm"]
    assert (algo["checked_by"], tuple(algo["names"])) == server_flags.ALGORITHMS[version]


def _digest(sources, algorithms, flags) -> str:
    import hashlib
    import json
    return hashlib.sha256(json.dumps({"SOURCES": sources, "ALGORITHMS": algorithms,
                                      "FLAGS": {v: list(f.items()) for v, f in flags.items()}}).encode()).hexdigest()


def test_the_data_file_rebuilds_every_release_the_generated_module_held():
    """server_flags.json, edits applied, gives exactly the old module's tables, order included."""
    assert list(server_flags.FLAGS) == ["0.5.6", "0.5.8", "0.5.10.post1", "0.5.11", "0.5.12.post1", "0.5.13",
                                        "0.5.14", "0.5.23"]
    assert [len(f) for f in server_flags.FLAGS.values()] == [296, 336, 365, 387, 402, 419, 433, 559]
    assert _digest(server_flags.SOURCES, server_flags.ALGORITHMS, server_flags.FLAGS) == OLD_MODULE_SHA256


def test_only_the_first_release_is_stored_whole():
    import json
    from importlib import resources
    data = json.loads(resources.files("diag.engines.sglang").joinpath(server_flags.DATA).read_text())
    first, *later = data["releases"]
    assert "flags" in first and all("edits" in r and "flags" not in r for r in later)
    stored = len(first["flags"]) + sum(len(items) for r in later for _, _, items in r["edits"])
    assert stored < 0.25 * sum(len(f) for f in server_flags.FLAGS.values())     # 3,197 entries held, ~700 written


def _table(version, pairs, algos=("EAGLE", "EAGLE3")):
    return {"flags": [[[o], n] for o, n in pairs], "algorithm": {"checked_by": "argparse", "names": list(algos)},
            "wheel": f"sglang-{version}.whl", "server_args_sha256": version * 3}


def test_edits_round_trip_inserts_drops_and_changed_nargs():
    """encode -> the JSON text -> releases() gives back every release: flags added in the middle
    and at the end, dropped at the start, a nargs changed, an alias moved."""
    import json
    a = [("--a", 0), ("--c", 1), ("--model-path", 1), ("--model", 1)]
    b = [("--b", "+"), ("--c", "?"), ("--model-path", 1), ("--model", 1), ("--z", 0)]
    c = [("--b", "+"), ("--model", 1), ("--model-path", 1)]
    tables = {"1.0.0": _table("1.0.0", a), "1.0.1": _table("1.0.1", b), "1.1.0": _table("1.1.0", c, ("EAGLE3",))}
    text = render(tables)
    back = server_flags.releases(json.loads(text))
    assert {v: r["flags"] for v, r in back.items()} == {"1.0.0": a, "1.0.1": b, "1.1.0": c}
    assert back["1.1.0"]["algorithms"] == ["argparse", ["EAGLE3"]]
    assert encode(tables)["releases"][1]["edits"] == [[0, 2, [["--b", "+"], ["--c", "?"]]], [4, 0, [["--z", 0]]]]


def test_apply_edits_worked_example():
    prev = [("--a", 0), ("--c", 1)]
    assert server_flags.apply_edits(prev, [[1, 0, [["--b", "+"]]], [2, 0, [["--d", 1]]]]) == \
        [("--a", 0), ("--b", "+"), ("--c", 1), ("--d", 1)]
    assert server_flags.apply_edits(prev, [[0, 1, []]]) == [("--c", 1)] and prev == [("--a", 0), ("--c", 1)]


@pytest.mark.wheel
def test_check_mode_passes_on_the_newest_release_and_names_a_difference(monkeypatch):
    """`server_flags_gen --check` against the 0.5.23 wheel: clean; with one flag dropped from the
    held table it names that flag."""
    assert check(["0.5.23"]) == []
    held = server_flags.load()
    held["0.5.23"]["flags"] = [f for f in held["0.5.23"]["flags"] if f[0] != "--speculative-num-steps"]
    monkeypatch.setattr(server_flags, "load", lambda: held)
    (problem,) = check(["0.5.23"])
    assert "0.5.23: flags differ" in problem and "--speculative-num-steps" in problem
