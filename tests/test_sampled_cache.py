"""The sampled decode loops' cache (run/sampled_cache.py) on tests/tiny.py checkpoints: a repeat
run answers every loop from it with the same numbers and loads no target; another seed count is
another key; a damaged entry is decoded again with a note, never believed."""

import json

import pytest

import tiny
from diag.run.case import read_case
from diag.run.pipeline import run_case


def _case(tmp, decoding):
    path = tiny.write_case(tmp / "c.toml", tiny.make_target(tmp / "t"), tiny.make_drafter(tmp / "d"),
                           tiny.make_prompts(tmp / "p.jsonl", n=2), trees=["chain-2"])
    path.write_text(path.read_text() + "[decoding]\n" + decoding + "\n")
    return read_case(path)


@pytest.fixture
def counted(target_loads):
    return target_loads


def _sampled(run):
    return [e.to_json() for e in run.evaluations if e.sampled]


def test_a_repeat_run_decodes_nothing_and_gives_the_same_numbers(tmp_path, counted):
    case = _case(tmp_path, "temperature = 1.0\ntop_p = 0.9\nseeds = 2")
    first = run_case(case, progress=False)
    assert len(counted) == 1 and _sampled(first)
    again = run_case(case, progress=False)
    assert len(counted) == 1                        # neither the pass nor the loop loaded the target
    assert _sampled(again) == _sampled(first)
    assert not [n for n in again.notes if "sampled decode" in n]
    more = run_case(_case(tmp_path, "temperature = 1.0\ntop_p = 0.9\nseeds = 3"), progress=False)
    assert len(counted) == 2                        # another seed count: other lanes, decoded again
    assert _sampled(more) != _sampled(first)


def test_a_damaged_entry_is_decoded_again_with_a_note(tmp_path, counted):
    case = _case(tmp_path, "temperature = 1.0\nseeds = 1")
    first = run_case(case, progress=False)
    entries = sorted((tmp_path / "cache" / "evals").glob("sampled-*.json"))
    assert entries
    for path in entries:
        entry = json.loads(path.read_text())
        entry["rows"][0]["accepted"][0] += 1          # a changed count the check no longer covers
        path.write_text(json.dumps(entry))
    again = run_case(case, progress=False)
    assert len(counted) == 2                        # the loop needed the target again
    assert _sampled(again) == _sampled(first)
    assert any("disagrees with its check" in n for n in again.notes)
