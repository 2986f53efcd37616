"""Prompt sets across processes (issue 34.4, 34.5): two ranks on gloo/CPU write the report one
process writes, byte for byte once the times and the command line are set aside; a rank that
dies, a world that disagrees, more ranks than prompts each stop with a message naming it."""

import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from diag.errors import DiagError
from diag.run.distributed import gpu_slice, launch_of
from diag.run.ranks import Group
from diag.run.shards import World, assemble, capture_share, check_world, generation_share
from diag.target.passes import budget_batches

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "diag" / "cases" / "prompts" / "mixed-48.jsonl"

# 5 prompts over 2 ranks; a token budget of 512 makes capture groups of 2 sequences and sampled
# batches of 2 rows (uneven shares; the generation is one chunk of 16 on CPU, so rank 1's share of
# it is empty); two regimes (the regime section's drift reads every state); a sampled decoding
# (rows decoded on both ranks); the user's step costs (measured ones vary from run to run).
CASE = f"""
version = 1
name = "demo-shards"
[target]
path = "zoo:llama-tiny"
dtype = "float32"
[drafter]
path = "zoo:llama-tiny-eagle3-embed-vllm-ids"
dtype = "float32"
[prompts]
file = "{PROMPTS}"
max_new_tokens = 24
limit = 5
[evaluate]
layouts = ["embed+L2+L4", "L1+L3+L5"]
modes = ["eagle3", "eagle"]
trees = ["chain-3", "s2-k2-d4"]
regimes = ["as-loaded", "w4a16-g128"]
token_budget = 512
[decoding]
temperature = 1.0
top_p = 0.95
seeds = 2
[speedup]
t_decode_ms = 20.0
t_draft_ms = 1.5
t_verify_ms = {{"3" = 21.0, "4" = 21.5}}
[serving]
engine = "sglang-0.5.23"
"""


def _diag(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env = {**base, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "diag.cli", "run", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _normal_json(path: Path) -> str:
    rep = json.loads(path.read_text())
    rep["created"] = rep["provenance"]["command"] = rep["timings"] = None
    for section in (rep["target_pass"]["regimes"], rep["target_pass"]["extra_passes"]):
        for entry in section.values():
            entry["seconds"] = None
    return json.dumps(rep, indent=1)


def _normal_md(path: Path) -> str:
    text = re.sub(r"command: `[^`]*`", "command: <argv>", path.read_text())
    return re.sub(r"- timings: .*", "- timings: <times>", text)


def test_two_ranks_write_the_report_one_process_writes(tmp_path):
    case = tmp_path / "shards.toml"
    case.write_text(CASE)
    one = _diag(str(case), "--no-cache", "--quiet", "--out", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr[-3000:]
    two = _diag(str(case), "--no-cache", "--quiet", "--nproc", "2", "--out", str(tmp_path / "two"))
    assert two.returncode == 0, two.stderr[-3000:]
    rep = json.loads((tmp_path / "two" / "report.json").read_text())
    assert "--nproc" in rep["provenance"]["command"] and rep["prompts"]["count"] == 5
    assert any(e["axes"]["decoding"] != "greedy" for e in rep["evaluations"])
    assert _normal_json(tmp_path / "two" / "report.json") == _normal_json(tmp_path / "one" / "report.json")
    assert _normal_md(tmp_path / "two" / "report.md") == _normal_md(tmp_path / "one" / "report.md")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "shards.toml", "two"]   # nothing half-written


# 17 prompts: two generation chunks on CPU (batch 16 -> chunks of 9 and 8), one to each rank; the
# pass cache on (each run its own fresh cache), so the report's keys are compared too.
GREEDY = """
version = 1
name = "demo-chunks"
[target]
path = "{target}"
dtype = "float32"
[drafter]
path = "{drafter}"
dtype = "float32"
[prompts]
file = "{prompts}"
max_new_tokens = 8
limit = 17
[evaluate]
layouts = ["embed+L2+L4"]
trees = ["chain-3"]
[speedup]
t_decode_ms = 20.0
t_draft_ms = 1.5
t_verify_ms = {{"3" = 21.0}}
"""


def test_two_ranks_generate_a_chunk_each_and_share_the_pass_cache(tmp_path):
    from diag.zoo import zoo_path
    case = tmp_path / "chunks.toml"
    case.write_text(GREEDY.format(target=zoo_path("llama-tiny", progress=False), prompts=PROMPTS,
                                  drafter=zoo_path("llama-tiny-eagle3-embed-vllm-ids", progress=False)))
    for name, extra in (("one", ()), ("two", ("--nproc", "2"))):
        got = _diag(str(case), "--quiet", "--out", str(tmp_path / name), *extra,
                    env={"DIAG_CACHE_DIR": str(tmp_path / f"cache-{name}")})
        assert got.returncode == 0, got.stderr[-3000:]
    rep = json.loads((tmp_path / "two" / "report.json").read_text())
    assert rep["timings"]["target_generate_batch"] == 9 and rep["prompts"]["count"] == 17
    assert _normal_json(tmp_path / "two" / "report.json") == _normal_json(tmp_path / "one" / "report.json")
    assert _normal_md(tmp_path / "two" / "report.md") == _normal_md(tmp_path / "one" / "report.md")
    key = rep["target_pass"]["regimes"]["as-loaded"]["cache_key"]      # saved by rank 0 under the whole
    assert (tmp_path / "cache-two" / "passes" / f"{key}.safetensors").is_file()     # set's key


# ---- the shares: the single-process batches, cut between ranks -------------------------------

def test_shares_cover_every_item_once_in_the_single_process_batches():
    lengths = [5, 9, 3, 8, 2, 9, 7, 1, 4]
    for size in (1, 2, 3, 4):
        gen = [generation_share(len(lengths), 2, World(r, size)) for r in range(size)]
        assert [i for g in gen for i in g] == list(range(len(lengths)))
        assert all(g.start % 2 == 0 for g in gen if len(g))              # whole chunks of the batch
        cap = [capture_share(lengths, 18, World(r, size)) for r in range(size)]
        assert sorted(i for c in cap for i in c) == list(range(len(lengths)))
        groups = budget_batches(lengths, 18)
        for c in cap:                            # run_capture over a share regroups it exactly so
            local = budget_batches([lengths[i] for i in c], 18)
            assert [[c[j] for j in g] for g in local] == [g for g in groups if g[0] in c]
    assert World(0, 2).shard(5) == range(0, 3) and World(1, 2).shard(5) == range(3, 5)


def test_assemble_puts_shares_back_in_order_and_refuses_a_hole():
    import torch
    seqs = ["s0", "s1", "s2"]
    shares = [([0, 2], {"L1": [torch.zeros(1), torch.full((1,), 2.0)]}, [torch.tensor([0]), torch.tensor([2])]),
              ([1], {"L1": [torch.ones(1)]}, [torch.tensor([1])])]
    tp = assemble("as-loaded", seqs, shares)
    assert [int(a) for a in tp.argmax] == [0, 1, 2] and [float(t) for t in tp.states["L1"]] == [0.0, 1.0, 2.0]
    with pytest.raises(RuntimeError, match="no rank"):
        assemble("as-loaded", seqs, shares[:1])


# ---- bad input: the world ----------------------------------------------------------------------

def test_launch_of_reads_nproc_and_torchrun():
    assert launch_of(None, {}) is None and launch_of(1, {}) is None
    spawn = launch_of(3, {})
    assert (spawn.how, spawn.world) == ("spawn", World(0, 3))
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
           "TORCHELASTIC_USE_AGENT_STORE": "True"}
    run = launch_of(None, env)
    assert (run.how, run.world, run.host, run.port, run.agent_store) == ("env", World(1, 2), "10.0.0.1", 29500, True)
    assert launch_of(2, env).world == World(1, 2)                   # --nproc agreeing with torchrun


@pytest.mark.parametrize("nproc, env, field", [
    (3, {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "--nproc"),
    (None, {"RANK": "0", "WORLD_SIZE": "2"}, "environment MASTER_ADDR, MASTER_PORT"),
    (None, {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "environment RANK"),
    (None, {"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "environment RANK"),
    (0, {}, "--nproc"),
])
def test_a_world_that_cannot_be_is_refused(nproc, env, field):
    with pytest.raises(DiagError) as err:
        launch_of(nproc, env)
    assert err.value.field == field


def test_mismatched_world_sizes_fail_on_the_command_line_before_loading(tmp_path):
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    got = _diag("--nproc", "3", "--quiet", "--out", str(tmp_path / "out"), env=env, timeout=120)
    assert got.returncode != 0 and "--nproc disagrees" in got.stderr and "WORLD_SIZE" in got.stderr
    assert not (tmp_path / "out").exists()


def test_local_ranks_take_their_own_gpus():
    assert [gpu_slice(r, 4, None) for r in range(2)] == ["0,1,2,3", "4,5,6,7"]
    assert gpu_slice(1, 2, "2,3,5,7") == "5,7" and gpu_slice(0, 1, "6") == "6"


def test_more_ranks_than_prompts_names_the_flag_and_the_count():
    inp = SimpleNamespace(prompts=[("a", "c", [1])] * 3, case=SimpleNamespace(source="case.toml"))
    check_world(inp, World(0, 3), "--nproc")
    with pytest.raises(DiagError) as err:
        check_world(inp, World(0, 4), "--nproc")
    assert err.value.field == "--nproc" and "at most 3" in err.value.expected and err.value.found == 4


# ---- bad input: a rank that dies ---------------------------------------------------------------

def _rank(rank: int, port: int, how: str) -> None:
    group = Group(rank, 2, "127.0.0.1", port, stale_s=3.0)
    if how == "exit":
        os._exit(3)
    if how == "raise":
        group.fail("DiagError: the drafter file is damaged")
        raise SystemExit(1)
    group.stop_heartbeat()                   # "hang": alive, silent, never sends
    group.store.set("up/1", "1")
    time.sleep(60)


@pytest.mark.parametrize("how, children, words", [
    ("exit", True, "exit code 3"),
    ("raise", False, "the drafter file is damaged"),
    ("hang", False, "no heartbeat for 3 s"),
])
def test_a_rank_that_dies_is_named_and_nobody_hangs(how, children, words):
    ctx = multiprocessing.get_context("spawn")
    procs = {}
    root = Group(0, 2, "127.0.0.1", 0, stale_s=60.0, children=procs if children else None)
    proc = ctx.Process(target=_rank, args=(1, root.port, how), daemon=True)
    proc.start()
    if children:
        procs[1] = proc
    t0 = time.monotonic()
    try:
        if how == "hang":                    # started (a fresh interpreter takes seconds), then silent
            root.wait(["up/1"], "it started")
            root.stale_s = 3.0
        with pytest.raises(DiagError) as err:
            root.wait(["ready/1/1"], "it sent its results")
    finally:
        proc.terminate()
        proc.join(5)
        root.close()
    assert "rank 1 of 2" in str(err.value) and words in str(err.value)
    assert time.monotonic() - t0 < 60
