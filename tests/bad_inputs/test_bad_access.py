"""Inputs that used to end in a traceback (issue 35.3) and paths as shells leave them (35.5):
files and directories without read permission, a cache directory that cannot be created,
chat templates that do not render, a layer count written as a
string, placement the hardware cannot honour or `validate` did not parse, `~` and `$VARS`
that reached diag unexpanded. Each entry states its outcome.

The tests run as root, which reads any file whatever its mode: an entry removes the read
permission (chmod 000, real for any other user) and also makes `os.access` answer for that
path as the kernel would for a user, which is how diag checks before it reads."""

import json
import os
from pathlib import Path

import pytest

from bad_catalogue import Bad, Error, Handled


def unreadable(ctx, path: Path) -> Path:
    """chmod 000 on `path` (a file, or a directory and what it holds) and an os.access that
    says so even to root."""
    path.chmod(0)
    ctx.env["_DIAG_TEST_UNREADABLE"] = str(path)
    return path


@pytest.fixture(autouse=True)
def _access_as_a_user(monkeypatch):
    real = os.access

    def access(p, mode, *a, **k):
        bad = os.environ.get("_DIAG_TEST_UNREADABLE")
        if bad and (str(p) == bad or str(p).startswith(bad + "/")) and mode & (os.R_OK | os.X_OK | os.W_OK):
            return False
        return real(p, mode, *a, **k)
    monkeypatch.setattr(os, "access", access)
    yield
    bad = os.environ.get("_DIAG_TEST_UNREADABLE")
    if bad and Path(bad).exists():
        Path(bad).chmod(0o755)


def _unreadable_target_file(name):
    def build(ctx):
        t = ctx.copy("target")
        unreadable(ctx, t / name)
        return ctx.run(target=t)
    return build


def _unreadable_target_dir(ctx):
    t = ctx.copy("target")
    unreadable(ctx, t)
    return ctx.run(target=t)


def _unreadable_prompts(ctx):
    p = unreadable(ctx, ctx.lines("prompts.jsonl", [{"id": "a", "text": "def f(x):"}]))
    return ctx.run(prompts=p)


def _unreadable_case(ctx):
    case = ctx.case(f'[prompts]\nfile = "{ctx.pair["prompts"]}"\nmax_new_tokens = 8\n')
    unreadable(ctx, case)
    return ["run", case, "--out", ctx.out, "--quiet"]


def _unreadable_server_log(ctx):
    log = unreadable(ctx, ctx.write("server.log", "[2026-01-01 00:00:00] Decode batch. #running-req: 1\n"))
    return ctx.run("--server-log", log)


def _cache_under_a_file(ctx):
    ctx.write("afile", "x")
    ctx.env["DIAG_CACHE_DIR"] = str(ctx.tmp / "afile" / "cache")
    return ctx.run()


def _template(text):
    def build(ctx):
        t = ctx.copy("target")
        cfg = json.loads((t / "tokenizer_config.json").read_text())
        cfg["chat_template"] = text
        (t / "tokenizer_config.json").write_text(json.dumps(cfg))
        return ctx.run(target=t)
    return build


def _layers_as_string(ctx):
    return ctx.run(target=ctx.target(config=lambda c: c.update(num_hidden_layers="4")))


def _out_as_typed(ctx, out):
    """The run's command line with `--out` as the shell hands it over, run from ctx.tmp."""
    os.chdir(ctx.tmp)
    argv = [str(a) for a in ctx.run()]
    i = argv.index("--out")
    return argv[:i] + [out] + argv[i + 2:]


def _out_tilde(ctx):
    ctx.env["HOME"] = str(ctx.tmp / "home")
    (ctx.tmp / "home").mkdir()
    return _out_as_typed(ctx, "--out=~/reports")        # bash leaves ~ after = as it is


def _in_home(ctx):
    assert (ctx.tmp / "home" / "reports" / "report.json").is_file()
    assert not (ctx.tmp / "~").exists(), "a directory named ~ was created"


def _out_unexpanded_var(ctx):
    return _out_as_typed(ctx, "--out=$HOME/reports")    # as '$HOME/reports' in single quotes


def _placement_case(value):
    def build(ctx):
        return ["validate", ctx.case(f'[prompts]\nfile = "{ctx.pair["prompts"]}"\nmax_new_tokens = 8\n'
                                     f'[evaluate]\nlayouts = ["embed+L2+L3"]\ntrees = ["chain-2"]\n'
                                     f'[placement]\n{value}\n')]
    return build


def _env(name, value):
    """A run with one of diag's environment variables set to something it cannot read: named
    before anything loads (run/case_checks.check_environment), not deep in the decode loop."""
    def build(ctx):
        ctx.env[name] = value
        return ctx.run()
    return build


def _cache_that_cannot_be_created(ctx):
    """/proc takes no new directories, even from root (whose permission bits say it may)."""
    ctx.env["DIAG_CACHE_DIR"] = "/proc/diag-cache-test"
    return ctx.run()



CATALOGUE = [
    Bad("target-config-unreadable", _unreadable_target_file("config.json"),
        Error(("cannot be read", "config.json", "read permission"))),
    Bad("target-shard-unreadable", _unreadable_target_file("model.safetensors"),
        Error(("cannot be read", "model.safetensors", "read permission"))),
    Bad("target-tokenizer-unreadable", _unreadable_target_file("tokenizer.json"),
        Error(("cannot be read", "tokenizer.json", "read permission"))),
    Bad("target-dir-unreadable", _unreadable_target_dir, Error(("cannot be read", "target", "search (x) permission"))),
    Bad("prompts-unreadable", _unreadable_prompts, Error(("cannot be read", "prompts.jsonl", "read permission"))),
    Bad("case-unreadable", _unreadable_case, Error(("cannot be read", "case.toml", "read permission"))),
    Bad("server-log-unreadable", _unreadable_server_log,
        Error(("cannot be read", "server.log", "read permission"))),
    Bad("cache-dir-under-a-file", _cache_under_a_file, Error(("cache directory", "afile"))),
    Bad("cache-dir-cannot-be-created", _cache_that_cannot_be_created,
        Error(("cache directory cannot be written", "/proc/diag-cache-test", "--no-cache"))),
    Bad("chat-template-syntax-error", _template("{% for m in messages %}{{ m.content }"),
        Error(("chat template", "tokenizer_config.json", "chat_template"))),
    Bad("chat-template-renders-nothing", _template("{% if false %}{{ messages }}{% endif %}"),
        Error(("chat template", "renders", "chat_template"))),
    Bad("target-num-hidden-layers-string", _layers_as_string,
        Error(("num_hidden_layers", "a positive integer", "'4'"))),
    Bad("flag-gpus-without-cuda", lambda c: c.run("--gpus", "2"),
        Error(("--gpus", "2", "GPU"))),
    Bad("validate-placement-gpu-memory-unparsable", _placement_case('gpu_memory = "lots"'),
        Error(("placement.gpu_memory", "lots", "case.toml"))),
    Bad("validate-placement-activation-budget-unparsable", _placement_case('activation_budget = "12 parsecs"'),
        Error(("placement.activation_budget", "12 parsecs"))),
    Bad("flag-out-tilde-after-equals", _out_tilde, Handled(_in_home)),
    Bad("flag-out-unexpanded-variable", _out_unexpanded_var, Error(("--out", "$HOME", "unexpanded"))),
    Bad("env-mix-trees-not-a-switch", _env("DIAG_MIX_TREES", "yes"), Error(("DIAG_MIX_TREES", "'yes'", '"0" or "1"'))),
    Bad("env-verify-graphs-not-a-switch", _env("DIAG_VERIFY_GRAPHS", "off"),
        Error(("DIAG_VERIFY_GRAPHS", "'off'", '"0" or "1"'))),
    Bad("env-mla-latent-not-a-switch", _env("DIAG_MLA_LATENT", "absorbed"),
        Error(("DIAG_MLA_LATENT", "'absorbed'", '"0" or "1"'))),
    Bad("env-load-threads-not-a-count", _env("DIAG_LOAD_THREADS", "eight"),
        Error(("DIAG_LOAD_THREADS", "'eight'", "a whole number"))),
]


@pytest.mark.parametrize("bad", [b.param() for b in CATALOGUE])
def test_bad_access(bad, outcome, monkeypatch):
    monkeypatch.chdir(Path.cwd())          # entries that chdir are put back
    outcome(bad)



def test_gpu_memory_beyond_the_device(outcome, monkeypatch):
    """--gpu-memory past what the GPUs hold (two 80 GiB GPUs, as torch would report them):
    named before any weight, not an out-of-memory error at the load."""
    import types

    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=80 * 2**30))
    outcome(Bad("flag-gpu-memory-beyond-the-device", lambda c: c.run("--gpus", "2", "--gpu-memory", "500GiB"),
                Error(("--gpu-memory", "more than the GPU has", "80.0 GiB", "500.0 GiB"))))


def test_bf16_on_a_gpu_without_it(outcome, monkeypatch):
    """A BF16 target placed on GPUs that cannot compute in bfloat16 (a V100, as torch reports
    it): named with the checkpoint's declared dtype, before any weight."""
    import types

    import torch
    from test_bad_labels import bf16_target
    for name, value in (("is_available", lambda: True), ("device_count", lambda: 1),
                        ("get_device_properties", lambda i: types.SimpleNamespace(total_memory=32 * 2**30)),
                        ("is_bf16_supported", lambda *a, **k: False), ("get_device_name", lambda *a: "Tesla V100"),
                        ("get_device_capability", lambda *a: (7, 0))):
        monkeypatch.setattr(torch.cuda, name, value)
    outcome(Bad("gpu-without-bf16", lambda c: c.run("--gpus", "1", target=bf16_target(c)),
                Error(("cannot compute in bfloat16", "Tesla V100", "7.0", "config.json"))))
