"""Shared fixtures of the bad-input catalogue: one tiny random target / drafter / prompt set
for the whole directory (built once, copied by the entries that break them)."""

import pytest

from bad_catalogue import build_pair, check


@pytest.fixture(scope="session")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("bad-pair"))


@pytest.fixture
def outcome(pair, tmp_path, monkeypatch, capsys):
    """outcome(bad) runs one catalogue entry and checks what it states."""
    return lambda bad: check(bad, pair, tmp_path, monkeypatch, capsys)
