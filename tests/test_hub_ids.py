"""Hub ids (org/name[@revision]) wherever a checkpoint is named: `run --target/--drafter`, case
files, ckpt: regimes, `lint` and the ids inside `--launch` (as the engine's own launch parser
reads them: model_path, draft_model_path), resolved through huggingface_hub's cache as SGLang and
vLLM resolve them (diag/checkpoint/hub.py, diag/run/checkpoints.py).

The caches are built offline from the zoo's demo pair (tests/hub_cache.py lays them out as
huggingface_hub does), with HF_HUB_OFFLINE=1; one test fetches from a local HTTP server that
speaks the hub's file endpoints, and proves that lint fetches the JSON files and nothing else."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hub_cache import FakeHub, add_to_cache
from diag.cli.main import main
from diag.errors import DiagError
from diag.run.case import read_case
from diag.run.checkpoints import locate

ROOT = Path(__file__).resolve().parents[1]
T_SHA, D_SHA = "1" * 40, "2" * 40


@pytest.fixture(scope="module")
def zoo_pair():
    from diag.zoo import zoo_path
    return zoo_path("llama-tiny"), zoo_path("llama-tiny-eagle3-embed-vllm-ids")


@pytest.fixture
def hub_cache(zoo_pair, tmp_path, monkeypatch):
    """org/tiny (main) and org/tiny-drafter (main, v1) in an offline cache; cwd is an empty folder."""
    cache = tmp_path / "hf"
    add_to_cache(cache, "org/tiny", zoo_pair[0], T_SHA)
    add_to_cache(cache, "org/tiny-drafter", zoo_pair[1], D_SHA, refs=("main", "v1"))
    for k, v in {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "DIAG_CACHE_DIR": str(tmp_path / "dc")}.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    return cache


def snap(cache: Path, repo: str, sha: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--")) / "snapshots" / sha


def test_run_with_hub_ids_end_to_end(hub_cache, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["run", "--target", "org/tiny", "--drafter", "org/tiny-drafter", "--limit", "2",
                 "--max-new-tokens", "8", "--layout", "embed+L2+L4", "--tree", "chain-2", "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    rep = json.loads((out / "report.json").read_text())
    assert rep["target"]["path"] == str(snap(hub_cache, "org/tiny", T_SHA))
    assert rep["drafter"]["path"] == str(snap(hub_cache, "org/tiny-drafter", D_SHA))
    assert any(n.startswith("target.path: org/tiny -> org/tiny@main (commit 111111111111)") for n in rep["notes"])
    assert rep["case"]["name"] == "tiny-drafter"


def test_case_file_with_hub_ids_and_revisions(hub_cache, tmp_path, capsys):
    case = tmp_path / "work" / "hub.toml"
    case.write_text(f'version = 1\nname = "hub"\n[target]\npath = "org/tiny@{T_SHA}"\n'
                    '[drafter]\npath = "org/tiny-drafter@v1"\n[prompts]\nfile = "'
                    f'{ROOT / "cases" / "prompts" / "mixed-48.jsonl"}"\n[evaluate]\nlayouts = ["embed+L2+L4"]\n')
    c = read_case(case)
    assert locate(c.target.path, c, "target.path").path == snap(hub_cache, "org/tiny", T_SHA)
    assert locate(c.drafter.path, c, "drafter.path").path == snap(hub_cache, "org/tiny-drafter", D_SHA)
    assert main(["validate", str(case)]) == 0
    out = capsys.readouterr().out
    assert f"target.path: org/tiny@{T_SHA} -> org/tiny@{T_SHA} (commit 111111111111)" in out
    assert "drafter.path: org/tiny-drafter@v1 -> org/tiny-drafter@v1 (commit 222222222222)" in out
    case.write_text(case.read_text().replace("@v1", "@v2"))
    with pytest.raises(DiagError) as err:
        locate("org/tiny-drafter@v2", read_case(case), "drafter.path")
    assert err.value.file == str(case) and err.value.field == "drafter.path"
    assert "revision v2" in err.value.expected and "main, v1" in err.value.found


def test_a_local_directory_wins_over_the_hub_id_of_the_same_spelling(hub_cache, zoo_pair, tmp_path):
    shutil.copytree(zoo_pair[0], tmp_path / "work" / "org" / "tiny")
    got = locate("org/tiny", None, "--target")
    assert got.path == (tmp_path / "work" / "org" / "tiny").resolve() and got.resolved is None
    assert "local directory" in got.note and "instead of the Hugging Face hub id" in got.note


def test_lint_reads_the_pair_the_launch_line_names(hub_cache, capsys):
    launch = ("python -m sglang.launch_server --model-path org/tiny --speculative-algorithm EAGLE3 "
              "--speculative-draft-model-path org/tiny-drafter@v1 --speculative-num-steps 1 "
              "--speculative-eagle-topk 1 --speculative-num-draft-tokens 2 --max-running-requests 8")
    code = main(["lint", "--launch", launch, "--json"])
    cap = capsys.readouterr()
    findings = json.loads(cap.out)
    assert code in (0, 1), cap.err
    assert "target: --launch (model_path): org/tiny -> org/tiny@main (commit 111111111111)" in cap.err
    assert "drafter: --launch (draft_model_path): org/tiny-drafter@v1 -> org/tiny-drafter@v1 (commit 2222" in cap.err
    assert any(str(snap(hub_cache, "org/tiny-drafter", D_SHA)) in (f["file"] or "") for f in findings)
    code = main(["lint", "--target", "org/tiny", "--launch", launch.replace("org/tiny ", "org/other ")])
    assert "--target org/tiny is linted; the launch line's model_path is org/other" in capsys.readouterr().out


def _index(src: Path, dst: Path) -> None:
    """A real model.safetensors.index.json for src's one shard (the hub's sharded layout)."""
    from safetensors import safe_open
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    size = (src / "model.safetensors").stat().st_size
    (dst / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": size}, "weight_map": {n: "model.safetensors" for n in names}}))


def _diag(*args, env):
    return subprocess.run([sys.executable, "-c", "from diag.cli.main import main; raise SystemExit(main())",
                           *args], capture_output=True, text=True, env=env, cwd=env["WORK"], timeout=300)


def test_lint_fetches_only_the_json_files_from_the_hub(zoo_pair, tmp_path):
    repo_t = tmp_path / "repo-t"
    shutil.copytree(zoo_pair[0], repo_t)
    _index(repo_t, repo_t)
    cache, work = tmp_path / "hf", tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    with FakeHub({"org/tiny": (T_SHA, repo_t), "org/tiny-drafter": (D_SHA, Path(zoo_pair[1]))}) as hub:
        env.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path / "home"), WORK=str(work),
                   DIAG_CACHE_DIR=str(tmp_path / "dc"), PYTHONPATH=str(ROOT), HF_HUB_DISABLE_TELEMETRY="1")
        first = _diag("lint", "--target", "org/tiny", "--drafter", "org/tiny-drafter", env=env)
        assert first.returncode in (0, 1), first.stderr
        assert ("target: --target: org/tiny -> org/tiny@main (commit 111111111111) from the Hugging Face cache: "
                f"{snap(cache, 'org/tiny', T_SHA)}; fetched config.json, generation_config.json, "
                "model.safetensors.index.json, tokenizer_config.json") in first.stdout
        assert "drafter: --drafter: org/tiny-drafter -> org/tiny-drafter@main (commit 222222222222)" in first.stdout
        fetched = sorted(p for m, p in hub.requests if m == "GET" and "/resolve/" in p)
        assert fetched == [f"/org/tiny-drafter/resolve/{D_SHA}/config.json",
                           *(f"/org/tiny/resolve/{T_SHA}/{f}" for f in ("config.json", "generation_config.json",
                             "model.safetensors.index.json", "tokenizer_config.json"))]
        assert sorted(p.name for p in snap(cache, "org/tiny", T_SHA).iterdir()) == [
            "config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer_config.json"]
        again = _diag("lint", "--target", "org/tiny", "--drafter", "org/tiny-drafter", env=env)
        assert "fetched" not in again.stdout and again.returncode == first.returncode
        run = _diag("run", "--target", "org/tiny", "--drafter", "org/tiny-drafter", "--out", str(tmp_path / "o"), env=env)
    assert run.returncode == 2 and "hub snapshot is incomplete" in run.stderr, run.stderr
    assert "model.safetensors" in run.stderr and "hf download org/tiny --revision main" in run.stderr
    assert not any(p.endswith((".safetensors", "tokenizer.json")) for _, p in hub.requests)


def test_a_ckpt_regime_names_a_hub_id(hub_cache, tmp_path, capsys):
    """`ckpt:org/name@revision`: validate reads its config from the cache; run loads its snapshot."""
    from types import SimpleNamespace
    from diag.run.target_passes import _checkpoint
    case = tmp_path / "work" / "regimes.toml"
    body = ('version = 1\nname = "r"\n[target]\npath = "org/tiny"\n[drafter]\npath = "org/tiny-drafter"\n'
            f'[prompts]\nfile = "{ROOT / "cases" / "prompts" / "mixed-48.jsonl"}"\n[evaluate]\n'
            'layouts = ["embed+L2+L4"]\nregimes = ["as-loaded", "ckpt:org/tiny@REV"]\n')
    case.write_text(body.replace("REV", T_SHA))
    assert main(["validate", str(case)]) == 0, capsys.readouterr().err
    inp = SimpleNamespace(case=read_case(case), target_path=None)
    assert _checkpoint(inp, f"ckpt:org/tiny@{T_SHA}") == snap(hub_cache, "org/tiny", T_SHA)
    case.write_text(body.replace("REV", "v7"))
    assert main(["validate", str(case)]) == 2
    err = capsys.readouterr().err
    assert "hub revision is not in the Hugging Face cache" in err and "evaluate.regimes" in err and "revision v7" in err


@pytest.mark.parametrize("name, message, found", [
    ("org/no-config", "hub repo has no config.json", "no file"),
    ("org/tiny@v9", "hub revision not found", "v9"),
    ("org/absent", "hub repo not found (or gated: set HF_TOKEN)", "org/absent"),
])
def test_what_the_hub_refuses_is_named(name, message, found, zoo_pair, tmp_path, monkeypatch):
    """Online (HF_HUB_OFFLINE unset) against the fake hub: each refusal is a DiagError naming the flag."""
    weights_only = tmp_path / "weights-only"
    weights_only.mkdir()
    shutil.copy(Path(zoo_pair[1]) / "model.safetensors", weights_only)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    with FakeHub({"org/tiny": (T_SHA, Path(zoo_pair[0])), "org/no-config": (D_SHA, weights_only)}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(DiagError) as err:
            locate(name, None, "--drafter", configs_only=True)
    assert err.value.message == message and err.value.field == "--drafter" and found in str(err.value.found)
    assert not any(p.endswith(".safetensors") for _, p in hub.requests)


def test_validate_before_the_weights_are_downloaded(zoo_pair, tmp_path, monkeypatch, capsys):
    """Only the JSON files cached (as lint leaves them): validate checks them and says why the
    checks run makes before loading were skipped."""
    cache = tmp_path / "hf"
    add_to_cache(cache, "org/tiny", zoo_pair[0], T_SHA, only={"config.json", "generation_config.json",
                                                               "tokenizer_config.json"}, tree=True)
    add_to_cache(cache, "org/tiny-drafter", zoo_pair[1], D_SHA)
    for k, v in {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "DIAG_CACHE_DIR": str(tmp_path / "dc")}.items():
        monkeypatch.setenv(k, v)
    case = tmp_path / "c.toml"
    case.write_text('version = 1\nname = "c"\n[target]\npath = "org/tiny"\n[drafter]\npath = "org/tiny-drafter"\n'
                    f'[prompts]\nfile = "{ROOT / "cases" / "prompts" / "mixed-48.jsonl"}"\n[evaluate]\n'
                    'layouts = ["embed+L2+L4"]\n')
    assert main(["validate", str(case)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "target.path: org/tiny -> org/tiny@main (commit 111111111111)" in out
    assert ("checks before loading: not run (org/tiny: hub snapshot is incomplete in the Hugging Face cache; "
            "only its JSON files were read)") in out
