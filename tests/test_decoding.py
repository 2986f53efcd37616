"""The decoding axis: SGLang's sampling parameters and thresholds (diag.engines.decoding; what a
request that sets nothing runs: diag.engines.sglang.decoding), stable names, and where a run's decodings come from (case [decoding], flags, the launch command, the
target's generation_config.json), with clear errors for bad values before anything loads."""

import json

import pytest

import tiny
from diag.cli.main import main
from diag.engines.decoding import GREEDY, Decoding, parse_decoding, sampled
from diag.engines.sglang.decoding import request_defaults
from diag.engines.sglang.launch import parse_launch
from diag.errors import DiagError
from diag.run.case import check_case, read_case
from diag.run.decodings import plan


def test_names_are_stable_and_parse_back():
    assert GREEDY.name == "greedy" and not GREEDY.lossy
    d = sampled(1.0, 0.95)
    assert d.name == "t1.0-p0.95-k-1" and not d.lossy
    lossy = sampled(0.6, 1, 20, threshold_acc=0.5)
    assert lossy.name == "t0.6-p1.0-k20-ts1.0-ta0.5" and lossy.lossy
    for x in (GREEDY, d, lossy, sampled(1e-7)):
        assert parse_decoding(x.name) == x
    with pytest.raises(DiagError, match="not a decoding name"):
        parse_decoding("sample")


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": 0.0}, "temperature"),
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": -2}, "top_k"),
    ({"threshold_single": 0.0}, "threshold_single"),
    ({"threshold_acc": 1.2}, "threshold_acc"),
])
def test_bad_values_name_the_field(kwargs, field):
    args = {"temperature": 1.0, **kwargs}
    with pytest.raises(DiagError) as err:
        sampled(**args)
    assert err.value.field == field and "expected" in str(err.value)


def test_request_defaults_follow_sglangs_sampling_defaults():
    assert request_defaults(None).values == {"temperature": 1.0, "top_p": 1.0, "top_k": -1}
    gc = {"temperature": 0.6, "top_p": 0.95, "do_sample": False, "min_p": 0.1}
    got = request_defaults(gc)
    assert got.from_generation_config and got.values == {"temperature": 0.6, "top_p": 0.95, "top_k": -1}
    assert got.unmodelled == {"min_p": 0.1}
    assert not request_defaults(gc, "openai").from_generation_config


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("dec")
    return tiny.make_target(d / "t"), tiny.make_drafter(d / "d"), tiny.make_prompts(d / "p.jsonl", n=2), d


def case_file(pair, name, decoding: str = "", serving: str = ""):
    t, dr, p, d = pair
    path = tiny.write_case(d / f"{name}.toml", t, dr, p)
    path.write_text(path.read_text() + (f"[decoding]\n{decoding}\n" if decoding else "")
                    + (f"[serving]\n{serving}\n" if serving else ""))
    return path


def test_case_sweep_first_is_served_thresholds_from_the_launch_command(pair):
    launch = ('launch = "python -m sglang.launch_server --model-path T --speculative-algorithm EAGLE3 '
              '--speculative-accept-threshold-acc 0.5"')
    case = read_case(case_file(pair, "sweep", "temperature = [1.0, 0.6]\ntop_p = 0.95\nseeds = 2", launch))
    got = plan(case, pair[0], parse_launch(case.serving.launch))
    assert [d.name for d in got.sampled] == ["t1.0-p0.95-k-1-ts1.0-ta0.5", "t0.6-p0.95-k-1-ts1.0-ta0.5"]
    assert got.served == got.sampled[0] and got.seeds == (0, 1)
    assert any("lossy" in n for n in got.notes)


def test_generation_config_sets_the_served_decoding(pair, tmp_path):
    t, dr, p, d = pair
    (t / "generation_config.json").write_text(json.dumps({"temperature": 0.7, "top_k": 40}))
    try:
        case = read_case(case_file(pair, "gc"))
        got = plan(case, t)
        assert got.served.name == "t0.7-p1.0-k40" and "generation_config.json" in got.source
        off = plan(case, t, parse_launch("python -m sglang.launch_server --sampling-defaults openai"))
        assert off.served.greedy and off.sampled == ()
        forced = read_case(case_file(pair, "forced", 'served = "greedy"'))
        assert plan(forced, t).served.greedy
    finally:
        (t / "generation_config.json").unlink()
    assert plan(read_case(case_file(pair, "none")), t).served == GREEDY


@pytest.mark.parametrize("body, field", [
    ("temperature = 0.0", "decoding.temperature"),
    ("temperature = 1.0\ntop_p = 1.5", "decoding.top_p"),
    ("top_k = 0", "decoding.top_k"),
    ("top_k = -3", "decoding.top_k"),
    ("temperature = 1.0\nthreshold_acc = 0.0", "decoding.threshold_acc"),
    ("temperature = 1.0\nthreshold_single = 2.0", "decoding.threshold_single"),
    ("seeds = 0", "decoding.seeds"),
    ('scope = "most"', "decoding.scope"),
    ("temperature = [1.0, 0.0]", "decoding.temperature"),
])
def test_bad_case_values_fail_at_parse_naming_file_and_key(pair, body, field):
    path = case_file(pair, "bad", body)
    with pytest.raises(DiagError) as err:
        check_case(read_case(path))          # case values are checked after the overrides
    assert err.value.field == field and err.value.file == str(path)


@pytest.mark.parametrize("flags, field", [
    (["--temperature", "0"], "--temperature"),
    (["--temperature", "1", "--top-p", "0"], "--top-p"),
    (["--temperature", "1", "--top-k", "0"], "--top-k"),
    (["--temperature", "1", "--speculative-accept-threshold-acc", "1.5"], "--speculative-accept-threshold-acc"),
])
def test_bad_flags_fail_before_any_weight_loads(pair, flags, field, capsys):
    path = case_file(pair, "flags")
    assert main(["run", str(path), "--out", str(pair[3] / "never"), *flags]) != 0
    err = capsys.readouterr().err
    assert "bad decoding" in err and f"field:    {field}\n" in err
    assert not (pair[3] / "never").exists()


def test_bad_launch_threshold_names_the_server_flag(pair):
    launch = 'launch = "python -m sglang.launch_server --speculative-accept-threshold-single 0"'
    case = read_case(case_file(pair, "launch", "temperature = 1.0", launch))
    with pytest.raises(DiagError) as err:
        plan(case, pair[0], parse_launch(case.serving.launch))
    assert err.value.field.startswith("--speculative-accept-threshold-single")


def test_decoding_is_frozen_and_checked_on_construction():
    with pytest.raises(DiagError):
        Decoding(temperature=1.0, top_p=0.0)
    with pytest.raises(Exception):
        sampled(1.0).temperature = 2.0
