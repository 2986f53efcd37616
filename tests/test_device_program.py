"""target/device_program.py on the CPU: what a `Tensor.to` asks for, `hand_off` outside a
recording, and a program's replay order (its copies). The recording itself needs CUDA graphs:
tests/test_gpu.py replays programs against the eager forward there."""

import torch

from diag.target.device_program import Program, hand_off, target_of


def test_target_of_reads_every_form_of_a_to_call():
    x, y = torch.zeros(2), torch.zeros(2, dtype=torch.float16)
    to, cuda = torch.Tensor.to, torch.Tensor.cuda
    assert target_of(to, (x, "cuda:1"), {}) == (torch.device("cuda:1"), None)
    assert target_of(to, (x, torch.half), {}) == (None, torch.float16)
    assert target_of(to, (x, "cuda:1", torch.bfloat16), {"non_blocking": True}) == (torch.device("cuda:1"), torch.bfloat16)
    assert target_of(to, (x,), {"device": "cuda:2", "copy": True}) == (torch.device("cuda:2"), None)
    assert target_of(to, (x, y), {}) == (torch.device("cpu"), torch.float16)
    assert target_of(cuda, (x,), {}) == (torch.device("cuda"), None)
    assert target_of(cuda, (x, 3), {}) == (torch.device("cuda:3"), None)


def test_hand_off_outside_a_recording_is_a_move_or_a_clone():
    t = torch.arange(4.0)
    assert hand_off(t) is t and hand_off(t, "cpu") is t
    c = hand_off(t, force=True)
    assert torch.equal(c, t) and c.data_ptr() != t.data_ptr()


def test_a_program_replays_its_steps_in_order():
    """Steps run as recorded: a graph (anything with replay()), then the copies it feeds, so a copy
    reads what the step before it wrote. Example: a -> b (graph: b += 1 in place of a kernel) ->
    c: c = a + 1."""
    a, b, c = torch.tensor([1.0, 2.0]), torch.zeros(2), torch.zeros(2)

    class Bump:
        def replay(self):
            b.add_(1)
    program = Program(steps=[("copy", (a, b)), ("graph", Bump()), ("copy", (b, c))])
    program.replay()
    assert torch.equal(c, torch.tensor([2.0, 3.0]))
    assert program.counts() == {"graphs": 1, "copies": 2}
