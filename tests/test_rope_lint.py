"""RoPE lint on published configs (issue 14.5): every spelling of theta / scaling / YaRN reads
into one RopeSpec, and real drafter/target pairs get the findings their configs imply, with
a matching pair as the control."""

from types import SimpleNamespace

from diag.checks.lint.rope import DEFAULT_THETA, check_rope, rope_spec
from diag.engines import DEFAULT_ENGINE

# The RoPE keys of published config.json files, verbatim (the rest left out); drafters under
# their SpecForge / TorchSpec names, targets under the model's.
CONFIGS = {'kimi-k2.5': {'text_config': {'max_position_embeddings': 262144,
                               'rope_parameters': {'beta_fast': 32.0,
                                                   'beta_slow': 1.0,
                                                   'factor': 64.0,
                                                   'mscale': 1.0,
                                                   'mscale_all_dim': 1.0,
                                                   'original_max_position_embeddings': 4096,
                                                   'rope_theta': 50000.0,
                                                   'rope_type': 'yarn',
                                                   'type': 'yarn'},
                               'rope_theta': 50000.0}},
 'kimi-k2.5-rawstyle': {'text_config': {'max_position_embeddings': 262144,
                                        'rope_theta': 50000.0,
                                        'rope_scaling': {'beta_fast': 32.0,
                                                         'beta_slow': 1.0,
                                                         'factor': 64.0,
                                                         'mscale': 1.0,
                                                         'mscale_all_dim': 1.0,
                                                         'original_max_position_embeddings': 4096,
                                                         'type': 'yarn'}}},
 'llama-3.1-8b-instruct': {'max_position_embeddings': 131072,
                           'rope_scaling': {'factor': 8.0,
                                            'low_freq_factor': 1.0,
                                            'high_freq_factor': 4.0,
                                            'original_max_position_embeddings': 8192,
                                            'rope_type': 'llama3'},
                           'rope_theta': 500000.0},
 'qwen3-8b': {'max_position_embeddings': 40960, 'rope_scaling': None, 'rope_theta': 1000000},
 'specforge-llama3-8B-eagle3': {'max_position_embeddings': 2048},
 'specforge-kimi-k25-eagle3': {'max_position_embeddings': 131072,
                               'rope_scaling': None,
                               'rope_theta': 1000000.0},
 'torchspec-kimi-k25-eagle3-mla': {'rope_theta': 50000.0,
                                   'rope_scaling': {'beta_fast': 1.0,
                                                    'beta_slow': 1.0,
                                                    'factor': 64.0,
                                                    'mscale': 1.0,
                                                    'mscale_all_dim': 1.0,
                                                    'original_max_position_embeddings': 4096,
                                                    'type': 'yarn'}},
 'torchspec-kimi-k25-eagle3': {'max_position_embeddings': 262144,
                               'rope_scaling': {'beta_fast': 32.0,
                                                'beta_slow': 1.0,
                                                'factor': 64.0,
                                                'mscale': 1.0,
                                                'mscale_all_dim': 1.0,
                                                'original_max_position_embeddings': 4096,
                                                'type': 'yarn'},
                               'rope_theta': 50000.0},
 'specforge-qwen3-8b-eagle3': {'max_position_embeddings': 40960, 'rope_scaling': None, 'rope_theta': 1000000}}


def cfg(name: str) -> dict:
    return CONFIGS[name]


def findings(drafter: str, target: str) -> dict[str, str]:
    pair = SimpleNamespace(drafter=cfg(drafter), target=cfg(target), drafter_file=f"{drafter}/config.json",
                           engine=DEFAULT_ENGINE)
    return {f.code: f.message for f in check_rope(pair)}


def test_kimi_k25_spellings_read_the_same():
    # transformers 5 dump: rope_parameters {rope_theta, rope_type, type, ...};
    # raw HF: rope_theta + rope_scaling {"type": "yarn", original_max_position_embeddings: 4096 (an int)}
    new, raw = rope_spec(cfg("kimi-k2.5")), rope_spec(cfg("kimi-k2.5-rawstyle"))
    assert new == raw
    assert (new.theta, new.kind, new.param("factor"), new.max_positions) == (50000.0, "yarn", 64.0, 262144)
    assert new.param("original_max_position_embeddings") == 4096.0


def test_llama3_and_default_spellings():
    llama = rope_spec(cfg("llama-3.1-8b-instruct"))              # rope_scaling {"rope_type": "llama3"}
    assert (llama.theta, llama.kind, llama.param("factor")) == (500000.0, "llama3", 8.0)
    qwen = rope_spec(cfg("qwen3-8b"))                              # rope_scaling null
    assert (qwen.kind, qwen.params) == ("default", ())
    unset = rope_spec(cfg("specforge-llama3-8B-eagle3"))           # no rope_theta at all
    assert (unset.theta, unset.theta_given) == (DEFAULT_THETA, False)


def test_a_drafter_trained_without_the_targets_yarn_is_flagged():
    found = findings("specforge-kimi-k25-eagle3", "kimi-k2.5")
    assert set(found) == {"ROPE_THETA", "ROPE_SCALING", "MAX_POSITIONS"}
    assert "1e+06" in found["ROPE_THETA"] and "50000" in found["ROPE_THETA"]
    assert "type default vs yarn" in found["ROPE_SCALING"]
    assert "131072 < target 262144" in found["MAX_POSITIONS"]


def test_a_yarn_parameter_differing_is_named():
    found = findings("torchspec-kimi-k25-eagle3-mla", "kimi-k2.5")
    assert "beta_fast 1.0 vs 32.0" in found["ROPE_SCALING"] and "ROPE_THETA" not in found
    assert "sets no max_position_embeddings" in found["MAX_POSITIONS"]


def test_unset_theta_is_named_as_the_default():
    found = findings("specforge-llama3-8B-eagle3", "llama-3.1-8b-instruct")
    assert "not set: the default 10000 applies" in found["ROPE_THETA"]
    assert "type default vs llama3" in found["ROPE_SCALING"]


def test_control_a_matching_pair_has_no_rope_finding():
    assert findings("torchspec-kimi-k25-eagle3", "kimi-k2.5") == {}
    assert findings("specforge-qwen3-8b-eagle3", "qwen3-8b") == {}


def test_precedence_as_sglang_reads_it():
    # SGLang 0.5.23 models/llama.py: rope_parameters wins over a top-level rope_theta, and a
    # top-level original_max_position_embeddings replaces the scaling's own
    both = {"rope_theta": 1000000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}}
    assert rope_spec(both).theta == 50000.0
    assert rope_spec({"rope_parameters": {"rope_type": "default"}, "rope_theta": 5.0}).theta == DEFAULT_THETA
    top = {"rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 4096},
           "original_max_position_embeddings": 8192}
    assert rope_spec(top).param("original_max_position_embeddings") == 8192.0
