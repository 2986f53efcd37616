"""`diag lint --engine vllm-…` speaks vLLM's language (issue 32 deliverable 3, issue 33 deliverable 2):
the drafter checks go through EngineRules (drafter_support, draft_tables), not SGLang's modules, and
the declared layout honours the config's diag_layer_id_convention marker (the zoo writes it)."""

import json
import shutil

import pytest

from diag.checks.lint import lint
from diag.engines.drafter_ids import declared_layouts
from diag.errors import DiagError
from diag.zoo import zoo_path

IDS = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 4]}}


def test_the_convention_marker_decides_the_declared_layout():
    assert str(declared_layouts(IDS, 6)[0].layout) == "L1+L3+L5"                     # SpecForge by default
    assert str(declared_layouts({**IDS, "diag_layer_id_convention": "vllm"}, 6)[0].layout) == "embed+L2+L4"
    with pytest.raises(DiagError) as err:
        declared_layouts({**IDS, "diag_layer_id_convention": "vllm-ish"}, 6, file="c.json")
    assert err.value.field == "diag_layer_id_convention" and err.value.file == "c.json"


def _pair(tmp_path, **changes):
    """The demo pair's configs (config-only lint: the weights are never read)."""
    d, t = tmp_path / "drafter", tmp_path / "target"
    d.mkdir(), t.mkdir()
    cfg = json.loads((zoo_path("llama-tiny-eagle3-embed-vllm-ids", progress=False) / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))
    shutil.copyfile(zoo_path("llama-tiny", progress=False) / "config.json", t / "config.json")
    return d, t


def test_vllm_lint_has_no_sglang_errors_and_says_what_it_did_not_check(tmp_path):
    d, t = _pair(tmp_path)
    found = lint(d, t, None, engine="vllm-0.32.0")
    assert [f for f in found if f.severity == "error"] == []
    assert all(f.engine == "vllm-0.32.0" for f in found)
    assert not any("SGLang" in f.message or "sglang" in f.fix for f in found)
    cls = next(f for f in found if f.code == "DRAFTER_CLASS_NOT_CHECKED")
    assert "vLLM 0.32.0" in cls.message


def test_sglang_lint_finds_the_demo_mismatch_from_the_marker(tmp_path):
    d, t = _pair(tmp_path)
    err = [f for f in lint(d, t, None, engine="sglang-0.5.23") if f.severity == "error"]
    assert [f.code for f in err] == ["LAYOUT_MISMATCH"]
    assert err[0].message.startswith("drafter trained on embed+L2+L4") and "[-1, 1, 3]" in err[0].fix


def test_use_aux_hidden_state_false_is_worded_per_engine(tmp_path):
    d, t = _pair(tmp_path, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 2, 4], "use_aux_hidden_state": False})
    v = next(f for f in lint(d, t, None, engine="vllm-0.32.0") if f.code == "USE_AUX_HIDDEN_STATE")
    s = next(f for f in lint(d, t, None, engine="sglang-0.5.23") if f.code == "USE_AUX_HIDDEN_STATE")
    assert "vLLM 0.32.0" in v.message and "SGLang 0.5.23" in s.message
