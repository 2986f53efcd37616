"""decode_rows.Rows' device copies: the roots and the finished flags reach the device once for
each value the host holds, and the commit's own sums stand in for a copy."""

import torch

from diag.replay.decode_rows import Rows


def _rows(n):
    B = len(n)
    return Rows(torch.zeros(B, 8, dtype=torch.long), torch.tensor(n), None, None, torch.zeros(B, dtype=torch.long),
                torch.arange(B), [], torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.bool))


def test_the_roots_are_copied_once_for_each_n_and_the_commits_sums_replace_the_copy(monkeypatch):
    import diag.replay.decode_rows as rows_mod
    copies = []
    real = rows_mod.to_device
    monkeypatch.setattr(rows_mod, "to_device", lambda t, dev: copies.append(t.clone()) or real(t, dev).clone())
    st = _rows([5, 7])
    first = st.root_on("cpu")
    assert torch.equal(first, torch.tensor([3, 5])) and st.root_on(torch.device("cpu")) is first
    assert len(copies) == 1                                   # draft, verify, accept, commit: one copy
    st.n = st.n + torch.tensor([2, 0])                        # the host's apply(): a new n ...
    summed = first + torch.tensor([2, 0])                     # ... and the commit's root + count
    st.roots_known(summed)
    assert st.root_on("cpu") is summed and torch.equal(summed, st.root) and len(copies) == 1
    st.n = st.n + 1                                           # a new n the device was not told of: copied
    assert torch.equal(st.root_on("cpu"), st.root) and len(copies) == 2
    done = st.done_on("cpu")
    assert st.done_on("cpu") is done and len(copies) == 3
    st.done = torch.tensor([True, False])                     # a retire check's new flags: copied again
    assert torch.equal(st.done_on("cpu"), st.done) and len(copies) == 4
