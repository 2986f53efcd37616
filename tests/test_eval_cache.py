"""A repeat run in seconds (issue 34.2): the drafter evaluations come from a content-keyed cache,
a new layout replays only itself, and the target's embedding and lm_head are read only as far as
a run uses them. Counts, not times: `evaluations_replayed` is how many variants the drafter ran.
Also the cache's failures (34.5): a retrained drafter, a corrupt entry, an entry of another
version each miss with a note, never answer."""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import diag
import tiny
from diag.errors import DiagError
from diag.report.writer import write_report
from diag.run import pipeline
from diag.run.case import read_case
from diag.run.pipeline import run_case
from diag.target.pass_cache import content_digest
from diag.target.tables import LazyHead, RowTable, target_tables

PROMPTS = Path(diag.__file__).parent / "cases" / "prompts" / "mixed-48.jsonl"
TREES = ["chain-3", "s2-k2-d4"]


@pytest.fixture(scope="module")
def pair() -> tuple[Path, Path]:
    """The demo pair's directories in the shared zoo cache, resolved before a test points
    DIAG_CACHE_DIR at its own folder (which would otherwise build a second copy)."""
    from diag.zoo import zoo_path
    return zoo_path("llama-tiny", progress=False), zoo_path("llama-tiny-eagle3-embed-vllm-ids", progress=False)


def demo_case(path: Path, layouts: list[str], pair: tuple[Path, Path]) -> Path:
    """The demo pair, 6 prompts, both modes (EAGLE drafts with the target's lm_head), two trees."""
    path.write_text("\n".join([
        "version = 1", 'name = "repeat"', "[target]", f'path = "{pair[0]}"', 'dtype = "float32"',
        "[drafter]", f'path = "{pair[1]}"', 'dtype = "float32"',
        "[prompts]", f'file = "{PROMPTS}"', "max_new_tokens = 24", "limit = 6", "[evaluate]",
        f"layouts = {json.dumps(layouts)}", 'modes = ["eagle3", "eagle"]', f"trees = {json.dumps(TREES)}",
        "seed = 0", "bootstrap = 200"]) + "\n")
    return path


def run(case: Path, out: Path | None = None):
    r = run_case(read_case(case), progress=False)
    if out is not None:
        write_report(r, out)
    return r


def stable(out: Path) -> dict:
    """report.json without what differs by design between a first and a repeat run: when it
    was written, the timings, whether each pass came from the cache, and the time in the
    costs' source ("measured at ... by an earlier run")."""
    rep = json.loads((out / "report.json").read_text())
    rep.pop("created")
    rep.pop("timings")
    for section in ("regimes", "extra_passes"):
        for m in rep["target_pass"][section].values():
            m.pop("cached"), m.pop("seconds")
    if rep.get("speedup"):
        rep["speedup"]["source"] = rep["speedup"]["source"].split("; measured at")[0].rstrip(")")
    return rep


def numbers(r) -> list:
    return [(e.key, e.accept_length, e.all_positions, e.per_prompt) for e in r.evaluations]


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture()
def tables(monkeypatch) -> list:
    """Every (embedding, head) pair the pipeline opens, to see what it read."""
    opened = []

    def spy(*a, **k):
        opened.append(target_tables(*a, **k))
        return opened[-1]
    monkeypatch.setattr(pipeline, "target_tables", spy)
    return opened


def test_a_repeat_run_replays_nothing_reads_no_table_and_writes_the_same_report(tmp_path, pair, cache, tables):
    case = demo_case(tmp_path / "case.toml", ["embed+L2+L4", "L1+L3+L5"], pair)
    first = run(case, tmp_path / "a")
    assert first.timings["evaluations_replayed"] == len(first.evaluations) > 0
    assert first.timings["evaluations_reused"] == 0
    again = run(case, tmp_path / "b")
    assert again.timings["evaluations_replayed"] == 0
    assert again.timings["evaluations_reused"] == len(again.evaluations)
    embed, head = tables[-1]
    assert embed.rows_read == 0 and not head.read      # nothing replayed: no table row, no head
    assert stable(tmp_path / "a") == stable(tmp_path / "b")
    assert (tmp_path / "a" / "samples.jsonl").read_bytes() == (tmp_path / "b" / "samples.jsonl").read_bytes()
    # checks_s in its parts (where a repeat run's time goes, for the bench): they make up the whole
    parts = ("checks_prepare_s", "checks_drafter_s", "checks_tables_s")
    assert sum(again.timings[k] for k in parts) == pytest.approx(again.timings["checks_s"], abs=0.01)
    phases: dict = {}
    write_report(again, tmp_path / "c", phases=phases)
    steps = ("envelope_s", "figures_s", "json_s", "samples_s", "markdown_s", "publish_s")
    assert set(steps) <= set(phases) and all(phases[k] >= 0 for k in steps)
    assert stable(tmp_path / "c") == stable(tmp_path / "b")           # timing it changes nothing written


def test_one_more_layout_replays_only_that_layout_and_matches_a_cold_run(tmp_path, pair, cache, monkeypatch):
    two = run(demo_case(tmp_path / "two.toml", ["embed+L2+L4", "L1+L3+L5"], pair))
    three = demo_case(tmp_path / "three.toml", ["embed+L2+L4", "L1+L3+L5", "L2+L3+L4"], pair)
    more = run(three, tmp_path / "more")
    new = [e for e in more.evaluations if e.layout == "L2+L3+L4"]
    assert len(new) == len(TREES)
    assert more.timings["evaluations_replayed"] == len(new)          # its 2 trees, nothing else
    assert more.timings["evaluations_reused"] == len(two.evaluations)
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cold-cache"))
    cold = run(three, tmp_path / "cold")
    assert cold.timings["evaluations_replayed"] == len(cold.evaluations)
    assert numbers(cold) == numbers(more)
    cold_rep, more_rep = stable(tmp_path / "cold"), stable(tmp_path / "more")
    for rep in (cold_rep, more_rep):             # step costs measured again in the cold cache: timings
        rep.pop("speedup", None)
    assert cold_rep == more_rep


def test_a_retrained_drafter_with_the_same_size_and_times_misses(tmp_path, pair, cache):
    case = demo_case(tmp_path / "case.toml", ["embed+L2+L4"], pair)
    first = run(case)
    src = Path(first.drafter["path"])
    drafter = tmp_path / "drafter"                       # a copy: the shared zoo entry stays as it is
    drafter.mkdir()
    for f in src.iterdir():
        (drafter / f.name).write_bytes(f.read_bytes())
    text = case.read_text().replace(f'"{src}"', f'"{drafter}"')
    case.write_text(text)
    assert run(case).timings["evaluations_replayed"] == 0   # same bytes elsewhere: same content
    f = drafter / "model.safetensors"
    st = f.stat()
    tensors = load_file(str(f))
    name = next(k for k, v in tensors.items() if v.is_floating_point() and v.ndim == 2 and "fc" in k)
    tensors[name] = tensors[name].flip(0).contiguous()  # "retrained": same shapes, other values
    save_file(tensors, str(f), metadata={"format": "pt"})
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    again = run(case)
    assert again.timings["evaluations_replayed"] == len(again.evaluations)
    assert all(m["cached"] for m in again.target_pass["regimes"].values())     # the target's pass is unchanged


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "evals").glob("*.safetensors"))


def _rewrite(entry: Path, change_meta) -> None:
    """Rewrite an entry with its metadata changed and a sha256 that matches: only the key or
    the format can then refuse it."""
    with safe_open(str(entry), framework="pt") as fh:
        meta, tensors = fh.metadata(), {k: fh.get_tensor(k) for k in fh.keys()}
    body = json.loads(meta["diag"])
    change_meta(body)
    text = json.dumps(body)
    save_file(tensors, str(entry), metadata={"diag": text, "sha256": content_digest(tensors, text)})


@pytest.mark.parametrize("damage, note", [
    (lambda p: p.write_bytes(p.read_bytes()[:-7]), "unreadable"),
    (lambda p: p.write_bytes(p.read_bytes()[:-1] + bytes([p.read_bytes()[-1] ^ 1])), "integrity check"),
    (lambda p: _rewrite(p, lambda m: m.update(format="diag-evaluation-v0")), "another diag version"),
    (lambda p: _rewrite(p, lambda m: m["key"].append(["extra", "1"])), "another key"),
])
def test_a_damaged_or_foreign_entry_is_a_miss_with_a_note(tmp_path, pair, cache, damage, note):
    case = demo_case(tmp_path / "case.toml", ["embed+L2+L4"], pair)
    first = run(case)
    entries = _entries(cache)
    assert len(entries) == len(first.evaluations)
    damage(entries[0])
    again = run(case)
    assert again.timings["evaluations_replayed"] == 1
    assert any(note in n and entries[0].name in n for n in again.notes), again.notes
    assert numbers(again) == numbers(first)
    assert run(case).timings["evaluations_replayed"] == 0            # rewritten whole
    assert not list((cache / "evals").glob("*.tmp*"))


def test_the_row_table_reads_only_the_rows_looked_up_and_equals_the_whole_table(tmp_path):
    target = tiny.make_target(tmp_path / "t")
    whole = load_file(str(target / "model.safetensors"))
    config = json.loads((target / "config.json").read_text())
    embed, head = target_tables(target, config)
    ids = torch.tensor([[5, 9, 5], [2, 9, 299]])
    assert torch.equal(embed(ids), whole["model.embed_tokens.weight"][ids])
    assert embed.rows_read == 4                          # 2, 5, 9, 299: once each
    embed(torch.tensor([9, 2]))
    assert embed.rows_read == 4
    assert not head.read
    x = torch.randn(3, tiny.HIDDEN)
    assert torch.equal(head(x), x @ whole["lm_head.weight"].T) and head.read
    with pytest.raises(DiagError, match="outside the target's embedding table"):
        embed(torch.tensor([300]))


def test_nan_in_a_row_looked_up_is_an_error_naming_the_tensor_and_file(tmp_path):
    target = tiny.make_target(tmp_path / "t")
    f = target / "model.safetensors"
    tensors = load_file(str(f))
    tensors["model.embed_tokens.weight"][7, 3] = float("nan")
    save_file(tensors, str(f), metadata={"format": "pt"})
    embed, _ = target_tables(target, json.loads((target / "config.json").read_text()))
    embed(torch.tensor([1, 2]))                          # rows without the NaN
    with pytest.raises(DiagError) as err:
        embed(torch.tensor([7]))
    assert "model.embed_tokens.weight" in str(err.value) and "NaN" in str(err.value) and str(f) in str(err.value)


def test_a_tied_head_is_the_embedding_and_a_missing_untied_one_is_an_error(tmp_path):
    target = tiny.make_target(tmp_path / "t")
    f = target / "model.safetensors"
    tensors = load_file(str(f))
    del tensors["lm_head.weight"]
    save_file(tensors, str(f), metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    with pytest.raises(DiagError, match="no lm_head"):
        target_tables(target, config)
    _, head = target_tables(target, {**config, "tie_word_embeddings": True})
    assert isinstance(head, LazyHead) and torch.equal(head.weight, tensors["model.embed_tokens.weight"])
    assert isinstance(_, RowTable)


def test_a_plot_is_copied_from_the_cache_while_the_keys_it_reads_are_unchanged(tmp_path, cache):
    from diag.report.plot_cache import cached_plot
    draws = []

    def accept_hist(rep, folder):                        # reads "evaluations" (plots.READS)
        draws.append(1)
        (folder / "plots").mkdir(parents=True, exist_ok=True)
        (folder / "plots" / "accept_hist.png").write_bytes(json.dumps(rep["evaluations"]).encode())
        return {"file": "plots/accept_hist.png", "title": "hist"}
    rep = {"evaluations": [{"layout": "a"}], "created": "t0", "timings": {"checks_s": 1.0}}
    assert cached_plot(accept_hist, rep, tmp_path / "a") == {"file": "plots/accept_hist.png", "title": "hist"}
    again = {**rep, "created": "t1", "timings": {"checks_s": 0.1}, "notes": ["other"]}
    assert cached_plot(accept_hist, again, tmp_path / "b")["title"] == "hist" and len(draws) == 1
    assert (tmp_path / "b/plots/accept_hist.png").read_bytes() == (tmp_path / "a/plots/accept_hist.png").read_bytes()
    cached_plot(accept_hist, {**rep, "evaluations": [{"layout": "b"}]}, tmp_path / "c")
    assert len(draws) == 2                               # one more layout: drawn
    for png in (cache / "plots").glob("*.png"):
        png.write_bytes(b"damaged")
    cached_plot(accept_hist, rep, tmp_path / "d")
    assert len(draws) == 3                               # a PNG that fails its sha256 is drawn again
    assert (tmp_path / "d/plots/accept_hist.png").read_bytes() == (tmp_path / "a/plots/accept_hist.png").read_bytes()


def test_a_diagnosis_plots_are_copied_while_its_section_and_declared_keys_are_unchanged(tmp_path, cache):
    """One key per diagnosis: its section and plot_reads, not the rest of the report; two PNGs
    in one entry; a damaged PNG is drawn again."""
    from dataclasses import dataclass

    from diag.diagnoses.protocol import Diagnosis
    from diag.report.plot_cache import cached_diagnosis_plots

    @dataclass(frozen=True)
    class Sec:
        n: int

    draws = []

    class Two(Diagnosis):
        name, key, Section, plot_reads = "two_plots", "two", Sec, ("reference",)

        def plots(self, sec, rep, folder):
            draws.append(1)
            (folder / "plots").mkdir(parents=True, exist_ok=True)
            out = []
            for i in range(2):
                (folder / f"plots/two-{i}.png").write_bytes(f"{sec.n} {rep['reference']} {i}".encode())
                out.append({"file": f"plots/two-{i}.png", "title": f"t{i}"})
            return out

    d = Two()
    rep = {"two": {"n": 1}, "reference": "r", "evaluations": [1]}
    first = cached_diagnosis_plots(d, Sec(1), rep, tmp_path / "a")
    again = cached_diagnosis_plots(d, Sec(1), {**rep, "evaluations": [1, 2], "notes": ["x"]}, tmp_path / "b")
    assert first == again == [{"file": "plots/two-0.png", "title": "t0"}, {"file": "plots/two-1.png", "title": "t1"}]
    assert len(draws) == 1 and (tmp_path / "b/plots/two-1.png").read_bytes() == b"1 r 1"
    cached_diagnosis_plots(d, Sec(1), {**rep, "reference": "s"}, tmp_path / "c")      # a declared key changed
    cached_diagnosis_plots(d, Sec(2), {**rep, "two": {"n": 2}}, tmp_path / "d")       # its section changed
    assert len(draws) == 3
    for png in (cache / "plots").glob("*-1.png"):
        png.write_bytes(b"damaged")
    cached_diagnosis_plots(d, Sec(1), rep, tmp_path / "e")
    assert len(draws) == 4 and (tmp_path / "e/plots/two-1.png").read_bytes() == b"1 r 1"


def test_figures_drawn_in_forked_processes_are_the_same_bytes(tmp_path, pair, cache, monkeypatch):
    from diag.report.envelope import envelope
    from diag.report.plot_cache import draw_all
    from diag.report.plots import PLOTS

    rep = envelope(run(demo_case(tmp_path / "case.toml", ["embed+L2+L4", "L1+L3+L5"], pair)), None)
    one = draw_all(PLOTS, rep, tmp_path / "one", workers=1)
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "other-cache"))      # nothing cached: all drawn
    stats: dict = {}
    forked = draw_all(PLOTS, rep, tmp_path / "forked", workers=3, stats=stats)
    assert one == forked and sum(m is not None for m in one) >= 3
    assert stats["figure_workers"] == 3 and stats["figures_drawn"] >= 3        # all missed, 3 at once
    again: dict = {}
    draw_all(PLOTS, rep, tmp_path / "again", workers=3, stats=again)
    assert again == {"figures_drawn": 0, "figure_workers": 0}                  # all copied from the cache
    flat = [p for m in one for p in (m if isinstance(m, list) else [m])]    # the diagnoses' plots: a list each
    for made in filter(None, flat):
        assert (tmp_path / "one" / made["file"]).read_bytes() == (tmp_path / "forked" / made["file"]).read_bytes()
