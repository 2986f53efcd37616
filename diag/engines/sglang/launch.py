"""SGLang launch command lines: parse the flags, then say what the server runs.

A launch line such as
  python -m sglang.launch_server --model-path T --speculative-algorithm EAGLE3 \
      --speculative-draft-model-path D --speculative-num-steps 1 \
      --speculative-eagle-topk 1 --speculative-num-draft-tokens 16
is parsed into `LaunchFlags` (also `sglang serve ...` and `--flag=value`), and
`effective_config` applies the chosen SGLang version's ServerArgs post-processing
(python/sglang/srt/server_args.py `_handle_speculative_decoding`, since 0.5.13
arg_groups/speculative_hook.py; these rules hold in every release 0.5.6-0.5.23):
- NEXTN is an alias: rewritten to EAGLE before anything else.
- In EAGLE-family speculative mode an omitted --max-running-requests becomes 48
  ("Max running requests is reset to 48 for speculative decoding"); with
  --enable-dp-attention each DP worker gets 48 // dp_size request slots.
- Omitted tree flags take `auto_choose_speculative_params`, keyed by the target
  config's `architectures[0]` and the version. The tree rules themselves live in
  tree_rules.py, the algorithm names in algorithms.py.
- --disable-cuda-graph is kept: up to 0.5.10.post1 it decides what decode rounds capture
  (capture.py).

This module knows command-line syntax and server-args rules; it reads no files
(the caller passes the target's config dict) and knows nothing about weights.
"""

from __future__ import annotations

import shlex

from diag.engines.common import EffectiveConfig, LaunchFlags
from diag.engines.sglang.algorithms import EAGLE_WORKERS, canonical, is_alias
from diag.engines.sglang.architectures import auto_defaults_key
from diag.engines.sglang.flag_parser import read_argv, table_for
from diag.engines.sglang.tree_rules import auto_defaults, resolve_sglang_shape
from diag.engines.sglang.versions import DEFAULT_ENGINE, engine
from diag.errors import DiagError

# Canonical flag -> every spelling SGLang's argparse accepts for it.
FLAG_ALIASES: dict[str, tuple[str, ...]] = {
    "model_path": ("--model-path", "--model"),
    "draft_model_path": ("--speculative-draft-model-path", "--speculative-draft-model"),
    "algorithm": ("--speculative-algorithm",),
    "num_steps": ("--speculative-num-steps",),
    "topk": ("--speculative-eagle-topk",),
    "num_draft_tokens": ("--speculative-num-draft-tokens",),
    "max_running_requests": ("--max-running-requests",),
    "tp_size": ("--tp-size", "--tp"),
    "dp_size": ("--dp-size", "--dp"),
    "enable_dp_attention": ("--enable-dp-attention",),
    "token_map": ("--speculative-token-map",),
    "disable_cuda_graph": ("--disable-cuda-graph",),
    "accept_threshold_single": ("--speculative-accept-threshold-single",),
    "accept_threshold_acc": ("--speculative-accept-threshold-acc",),
    "use_rejection_sampling": ("--speculative-use-rejection-sampling",),
    "sampling_defaults": ("--sampling-defaults",),
}
_INT_FIELDS = ("num_steps", "topk", "num_draft_tokens", "max_running_requests", "tp_size",
               "dp_size")
_BOOL_FIELDS = ("enable_dp_attention", "disable_cuda_graph", "use_rejection_sampling")
_FLOAT_FIELDS = ("accept_threshold_single", "accept_threshold_acc")
_BY_SPELLING = {s: name for name, spellings in FLAG_ALIASES.items() for s in spellings}

SPEC_MAX_RUNNING_REQUESTS = 48


def _tokens(command: str | list[str]) -> list[str]:
    if isinstance(command, str):
        try:
            return shlex.split(command.replace("\\\n", " "))
        except ValueError as exc:
            raise DiagError("launch command does not parse as a shell line", field="--launch",
                            expected="a quoted command line", found=str(exc)) from exc
    return list(command)


def _program_end(tokens: list[str]) -> tuple[str, int]:
    """Index just past the program words. Examples: ['python', '-m',
    'sglang.launch_server', '--tp', '8'] -> ('sglang.launch_server', 3);
    ['sglang', 'serve', '--model-path', 'M'] -> ('sglang serve', 2)."""
    for i, tok in enumerate(tokens):
        if tok.endswith("sglang.launch_server"):
            return "sglang.launch_server", i + 1
        if tok.rsplit("/", 1)[-1] == "sglang" and i + 1 < len(tokens) and tokens[i + 1] == "serve":
            return "sglang serve", i + 2
    raise DiagError("not an SGLang launch command", field="--launch",
                    expected="python -m sglang.launch_server ... or sglang serve ...",
                    found=" ".join(tokens)[:200])


def _pairs(args: list[str], engine_name: str | None) -> list[tuple[str, str | None]]:
    """(option, value) as the engine's argparse reads them (flag_parser.py): abbreviations
    resolved, each option taking the values its nargs says.
    ['--tp', '8', '--trust-remote-code', '--x=1', '--speculative-num-step', '3'] ->
    [('--tp-size', '8'), ('--trust-remote-code', None), ('--x', '1'), ('--speculative-num-steps', '3')]
    (0.5.23; --tp is an abbreviation of --tp-size there)."""
    table = table_for(engine(engine_name).version)
    if table is None:
        raise DiagError("no launch-flag table for this engine version", field="engine",
                        expected="a release at or above the oldest in diag/engines/sglang/server_flags.json",
                        found=engine_name)
    out: list[tuple[str, str | None]] = []
    for w in read_argv(args, table):
        if w.kind == "stray":
            raise DiagError("unexpected word in the launch command", field="--launch",
                            expected="--flag value pairs (SGLang's argparse would refuse it)", found=w.written)
        out.append((w.option if w.kind in ("exact", "prefix") else w.written, w.value))
    return out


def _typed(name: str, flag: str, value: str | None) -> object:
    if name in _BOOL_FIELDS:
        return value is None or value.lower() in ("1", "true", "yes")
    if value is None:
        raise DiagError("flag needs a value", field=flag, expected="a value", found="nothing")
    for fields, kind, what in ((_INT_FIELDS, int, "an integer"), (_FLOAT_FIELDS, float, "a number")):
        if name in fields:
            try:
                return kind(value)
            except ValueError:
                raise DiagError(f"flag needs {what}", field=flag, expected=what, found=repr(value)) from None
    return value


def parse_launch(command: str | list[str], engine_name: str | None = None) -> LaunchFlags:
    """Parse an SGLang launch line (a string, or argv words) into LaunchFlags, reading the
    words as the engine version's argparse does. A repeated flag keeps its last value."""
    tokens = _tokens(command)
    program, start = _program_end(tokens)
    known: dict[str, object] = {}
    other: list[tuple[str, str | None]] = []
    for flag, value in _pairs(tokens[start:], engine_name):
        name = _BY_SPELLING.get(flag)
        if name is None:
            other.append((flag, value))
        else:
            known[name] = _typed(name, flag, value)
    return LaunchFlags(program=program, other=tuple(other), **known)


def server_argv(command: str | list[str]) -> list[str]:
    """The words after the program, as ServerArgs parses them:
    'python -m sglang.launch_server --tp 8' -> ['--tp', '8']."""
    tokens = _tokens(command)
    return tokens[_program_end(tokens)[1]:]


def _algorithm(flags: LaunchFlags) -> tuple[str | None, list[str]]:
    if flags.algorithm is None:
        return None, []
    raw = flags.algorithm.upper()
    algo = canonical(raw)
    notes = [f"--speculative-algorithm {raw} is an alias: SGLang runs {algo}"] if is_alias(raw) else []
    if algo == "EAGLE":
        notes.append("EAGLE feeds the drafter the final-normed last hidden state: an EAGLE-3 "
                     "drafter needs --speculative-algorithm EAGLE3")
    return algo, notes


def _max_running(flags: LaunchFlags) -> tuple[int | None, list[str]]:
    if flags.max_running_requests is not None:
        return flags.max_running_requests, []
    notes = [f"--max-running-requests omitted: SGLang resets it to {SPEC_MAX_RUNNING_REQUESTS} "
             "in speculative mode, capping concurrency"]
    dp = flags.dp_size or 1
    if flags.enable_dp_attention and dp > 1:
        notes.append(f"with --enable-dp-attention each of the {dp} DP workers gets "
                     f"{SPEC_MAX_RUNNING_REQUESTS} // {dp} = {SPEC_MAX_RUNNING_REQUESTS // dp} "
                     "request slots")
    return SPEC_MAX_RUNNING_REQUESTS, notes


def effective_config(flags: LaunchFlags, target_config: dict | None, *,
                     engine_name: str = DEFAULT_ENGINE) -> EffectiveConfig:
    """What this SGLang version will run for these flags on this target."""
    eng = engine(engine_name)
    arch = auto_defaults_key(target_config)
    algo, notes = _algorithm(flags)
    if algo is None or algo not in EAGLE_WORKERS:
        if algo is not None:
            notes.append(f"{algo} is not an EAGLE-family algorithm: no tree rules applied")
        return EffectiveConfig(flags, algo, arch, eng.name, None, flags.max_running_requests,
                               tuple(notes), None)
    if target_config is None and flags.num_steps is None:
        shape, _ = auto_defaults("Unknown", eng, algo)
        notes.append(f"target config unknown: {eng.label}'s auto defaults depend on its "
                     f"architectures[0]; assumed {shape}, its value for an architecture in no list")
    tree = resolve_sglang_shape(flags.num_steps, flags.topk, flags.num_draft_tokens, arch,
                                eng=eng, algorithm=algo)
    mrr, mrr_notes = _max_running(flags)
    if flags.draft_model_path is None and algo != "EAGLE":
        notes.append(f"no --speculative-draft-model-path given for {algo}")
    return EffectiveConfig(flags, algo, arch, eng.name, tree, mrr,
                           tuple(notes + list(tree.notes) + mrr_notes), tree.crash)
