"""diag.engines.simulate: every engine's benchmark settings at a chosen acceptance, merged in
registry order, with the clamp applied once."""

from diag.engines import engine, families
from diag.engines.simulate import simulated_acceptance
from diag.trees import TreeShape


def test_every_engine_contributes_its_settings_in_registry_order():
    sim = simulated_acceptance(2.4712, (0.8, 0.45, 0.5), TreeShape(3, 4, 8), engine("sglang-0.5.8"))
    out = sim.to_json()
    assert out["accept_length"] == 2.47 and list(out)[0] == "accept_length" and list(out)[-1] == "notes"
    assert len(sim.settings) == len(families())
    assert list(out)[1:-1] == [k for s in sim.settings for k in s.fields]
    assert out["sglang_env"]["SGLANG_SIMULATE_ACC_LEN"] == "2.47"
    assert out["vllm_speculative_config"]["synthetic_acceptance_rates"] == [0.8, 0.45, 0.45]
    assert any("multinomial" in n for n in out["notes"])          # 0.5.8's default method


def test_release_notes_only_for_the_served_family():
    sim = simulated_acceptance(9.0, (1.0,), TreeShape(1, 1, 2), engine("vllm-0.32.0"))
    assert sim.accept_length == 2.0 and sim.notes == ()
    newest = simulated_acceptance(2.0, (1.0,), TreeShape(1, 1, 2), engine("sglang-0.5.23"))
    assert not any("multinomial" in n for n in newest.notes)
