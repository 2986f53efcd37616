"""A case's prompts spread over processes and machines (torch.distributed): `diag run CASE
--nproc N` on one machine, or every rank of a `torchrun` launch.

Every rank runs the same pipeline (run_case) up to the target passes: it prepares the inputs,
loads the drafter, loads its own copy of the target (placed on its node's GPUs by the case's
[placement]) and runs its share of each pass's batches (shards.py): the greedy generation's
chunks (the sequences then go to every rank) and the teacher-forced capture's groups (the
states go to rank 0 only). Rank 0 assembles each pass in prompt order, keeps the pass cache,
and goes on alone: replay, intervals, verdicts, and the one report. Sampled decodings run
inside the passes, each rank decoding its share of the batches one process would run; the
rows are shared with every rank (each picks the same best layout from them), so they
summarise as one process would. The report is the single-process report, byte for byte,
times and the command line aside (docs/distributed.md).

    rank 0:   prepare, drafter, target: generate(chunks 0) <-all-> capture(groups 0) <-recv 1..N-1
              -> assemble -> replay ... report
    rank r:   prepare, drafter, target: generate(chunks r) <-all-> capture(groups r) -send to 0->
              done (writes nothing)

Which world: RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in the environment (torchrun sets
them) make this process that rank; else --nproc N > 1 makes this process rank 0 and starts
ranks 1..N-1 as local child processes. Both at once must agree (--nproc 2 under a torchrun of
WORLD_SIZE 4 is an error naming both). More ranks than prompts is an error before any target
weight is read (shards.check_world).

This module knows the world and the pipeline's hook; the store and sockets are ranks.py's,
the cut and the merge shards.py's.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
from dataclasses import asdict, dataclass

from diag.errors import DiagError
from diag.run.inputs import Inputs
from diag.run.pipeline import run_case
from diag.run.ranks import Group, PeerFailed
from diag.run.shards import World, assemble, capture_share, check_world, generation_share
from diag.run.target_passes import special_ids, target_passes
from diag.target.pass_cache import load_pass, save_pass, token_digest
from diag.target.passes import TargetPass

ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
DEFAULT_RANK_TIMEOUT_S = 300.0
LOCAL_HOST = "127.0.0.1"


@dataclass(frozen=True)
class Launch:
    """How this process joins: `spawn` (rank 0 of --nproc, starts the others) or `env` (torchrun)."""
    world: World
    how: str                       # "spawn" | "env"
    host: str = LOCAL_HOST
    port: int = 0
    agent_store: bool = False

    @property
    def flag(self) -> str:
        return "--nproc" if self.how == "spawn" else "WORLD_SIZE (torchrun --nnodes x --nproc-per-node)"


def _int_env(env: dict, name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise DiagError("a torch.distributed variable is not an integer", field=f"environment {name}",
                        expected="an integer", found=env[name]) from None


def launch_of(nproc: int | None, env: dict) -> Launch | None:
    """The world this process belongs to, or None for a plain single-process run.
    Example: nproc 2, no RANK in env -> spawn, rank 0 of 2; env RANK 1 WORLD_SIZE 2 -> env, rank 1."""
    if nproc is not None and nproc < 1:
        raise DiagError("--nproc needs at least one process", field="--nproc", expected=">= 1", found=nproc)
    given = [k for k in ENV if k in env]
    if not given or given == ["MASTER_ADDR"] or given == ["MASTER_PORT"] or given == ["MASTER_ADDR", "MASTER_PORT"]:
        return Launch(World(0, nproc), "spawn") if nproc and nproc > 1 else None
    missing = [k for k in ENV if k not in env]
    if missing:
        raise DiagError("a torch.distributed launch sets all four variables; some are missing",
                        field="environment " + ", ".join(missing), expected=", ".join(ENV),
                        found=", ".join(f"{k}={env[k]}" for k in given), hint="launch with torchrun")
    rank, size = _int_env(env, "RANK"), _int_env(env, "WORLD_SIZE")
    if not 0 <= rank < size:
        raise DiagError("RANK must be below WORLD_SIZE", field="environment RANK", expected=f"0..{size - 1}",
                        found=rank)
    if nproc is not None and nproc != size:
        raise DiagError("--nproc disagrees with the torch.distributed launch around this process",
                        field="--nproc", expected=f"{size} (environment WORLD_SIZE) or no --nproc", found=nproc,
                        hint="under torchrun the world size is torchrun's; leave --nproc out")
    if size == 1:
        return None
    return Launch(World(rank, size), "env", env["MASTER_ADDR"], _int_env(env, "MASTER_PORT"),
                  env.get("TORCHELASTIC_USE_AGENT_STORE") == "True")


def _fingerprint(inp: Inputs, size: int, use_cache: bool) -> str:
    """What every rank must agree on: the case (its source path aside: nodes may keep it
    elsewhere), the token ids of its prompts, the world size and whether the cache is used."""
    spec = {k: v for k, v in asdict(inp.case).items() if k != "source"}
    eos, pad = special_ids(inp.tokenizer, inp.target_path)
    case = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]
    prompts = token_digest(inp.prompts, inp.recorded, eos, pad)[:16]
    return f"case {case}, prompts {prompts}, world size {size}, cache {'on' if use_cache else 'off'}"


class Shards:
    """run_case's hook (pipeline.run_case(shards=...)) for one rank of a distributed run, and
    target_passes' `spread` (target_passes.Local's four steps, over the ranks)."""

    def __init__(self, launch: Launch, group: Group):
        self.world, self.group, self.flag = launch.world, group, launch.flag

    def target_passes(self, inp: Inputs, *, progress: bool, use_cache: bool, with_model=None,
                      needs_model=frozenset()):
        """target_passes over the whole prompt set on rank 0; None on the others."""
        if self.world.rank == 0:             # the others hear of it from rank 0 (PeerFailed)
            check_world(inp, self.world, self.flag)
        self.group.join("case", _fingerprint(inp, self.world.size, use_cache))
        got = target_passes(inp, progress=progress and self.world.rank == 0, use_cache=use_cache,
                            with_model=with_model, needs_model=needs_model, spread=self)
        return got if self.world.rank == 0 else None

    # ---- target_passes' spread ------------------------------------------------------------
    def lookup(self, key, regime: str):
        """Rank 0's cache decides for every rank; on a hit the others get its sequences."""
        tp, why = load_pass(key) if self.world.rank == 0 else (None, None)
        hit = self.group.all_objects(None if tp is None else tp.sequences, "the pass cache was looked up")[0]
        if self.world.rank == 0 or hit is None:
            return tp, why
        return TargetPass(regime, hit, {}, [], cached=True), None

    def sequences(self, build, prompts, batch: int):
        """Each rank generates its chunks of rank 0's generation batch; every rank gets all."""
        batch = self.group.all_objects(batch, "it loaded the target")[0]
        share = generation_share(len(prompts), batch, self.world)
        mine = build(prompts[share.start:share.stop], batch)
        return [s for part in self.group.all_objects(mine, "it generated its continuations") for s in part]

    def capture(self, run, sequences, token_budget: int):
        """Each rank captures its groups; rank 0 assembles the pass (the others keep no states)."""
        idx = capture_share([len(s.ids) for s in sequences], token_budget, self.world)
        part = run([sequences[i] for i in idx])
        if self.world.rank:
            self.group.send_to_root((idx, part.states, part.argmax))
            return TargetPass(part.regime, sequences, {}, [])
        shares = [(idx, part.states, part.argmax)] + [self.group.receive(r) for r in range(1, self.world.size)]
        return assemble(part.regime, sequences, shares)

    def save(self, key, tp) -> None:
        if self.world.rank == 0:
            save_pass(key, tp)

    # ---- the sampled loop's spread (run/sampled.py) ---------------------------------------
    def own_batches(self, batches: list[list]) -> list[list]:
        """The sampled loop's batches this rank decodes: a contiguous share of the batches one
        process would run (the same rows together, so every row decodes bit for bit as there;
        a row's numbers depend on its batch's padding). Example: 5 batches, 2 ranks -> 0-2, 3-4."""
        return [batches[i] for i in self.world.shard(len(batches))]

    def all_rows(self, rows: list[tuple[int, int]], decoded: list) -> list:
        """Every rank's decoded rows, in the single-process order ((lane, prompt) ascending)."""
        pairs = [p for part in self.group.all_objects(list(zip(rows, decoded)), "it decoded its sampled rows")
                 for p in part]
        return [d for _, d in sorted(pairs, key=lambda p: p[0])]


def _rank_main(launch: Launch, case, *, progress: bool, use_cache: bool, stale_s: float, children=None):
    group = Group(launch.world.rank, launch.world.size, launch.host, launch.port, stale_s=stale_s,
                  agent_store=launch.agent_store, children=children)
    return group, lambda: run_case(case, progress=progress, use_cache=use_cache, shards=Shards(launch, group))


def _guarded(group: Group, body):
    """body(), telling the other ranks why when it raises; the group closed either way."""
    try:
        return body()
    except BaseException as err:
        group.fail(f"{type(err).__name__}: {err}")
        raise
    finally:
        group.close()


def gpu_slice(local_rank: int, gpus: int, visible: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for a local rank whose target spans `gpus` GPUs: its own run of the
    node's devices, so the ranks of one machine never share a GPU.
    Example: gpus 4, rank 1, nothing set -> "4,5,6,7"; gpus 2, rank 1, visible "2,3,5,7" -> "5,7"."""
    ids = visible.split(",") if visible else [str(i) for i in range((local_rank + 1) * gpus)]
    return ",".join(ids[local_rank * gpus:(local_rank + 1) * gpus])


def _child(rank: int, size: int, port: int, case, use_cache: bool, stale_s: float) -> None:
    """A local rank started by --nproc (multiprocessing 'spawn': a fresh interpreter, CUDA not
    initialised yet, so its slice of the GPUs is set before anything touches them)."""
    if case.placement.gpus > 0:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu_slice(rank, case.placement.gpus,
                                                       os.environ.get("CUDA_VISIBLE_DEVICES"))
    launch = Launch(World(rank, size), "spawn", LOCAL_HOST, port)
    group, body = _rank_main(launch, case, progress=False, use_cache=use_cache, stale_s=stale_s)
    try:
        _guarded(group, body)
    except PeerFailed:                       # rank 0 (this process's parent) prints the cause
        raise SystemExit(1) from None
    except DiagError as err:
        raise SystemExit(f"diag run, rank {rank} of {size}: {err}") from None


def run_distributed(launch: Launch, case, *, progress: bool, use_cache: bool,
                    stale_s: float = DEFAULT_RANK_TIMEOUT_S):
    """The RunResult on rank 0, None on the other ranks. Under --nproc this process is rank 0
    and its children are stopped on the way out, whatever happened."""
    if launch.how == "env":
        group, body = _rank_main(launch, case, progress=progress and launch.world.rank == 0,
                                 use_cache=use_cache, stale_s=stale_s)
        return _guarded(group, body)
    if case.placement.gpus > 0:            # each local rank its own GPUs: rank r takes r*g .. r*g+g-1
        from diag.target.placement import require_gpus
        require_gpus(launch.world.size * case.placement.gpus, file=case.source,
                     field=f"--nproc {launch.world.size} x placement.gpus {case.placement.gpus}")
    ctx = multiprocessing.get_context("spawn")
    children: dict = {}
    group, body = _rank_main(launch, case, progress=progress, use_cache=use_cache, stale_s=stale_s,
                             children=children)
    for r in range(1, launch.world.size):
        children[r] = ctx.Process(target=_child, args=(r, launch.world.size, group.port, case, use_cache, stale_s),
                                  name=f"diag-rank-{r}", daemon=True)
        children[r].start()
    try:
        return _guarded(group, body)
    finally:
        for proc in children.values():
            proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()
