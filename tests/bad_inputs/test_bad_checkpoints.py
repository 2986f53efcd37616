"""Bad target checkpoints: missing or broken files, corrupt or truncated shards, NaN / Inf
weights, configs that disagree with their weights, formats diag cannot load (issue 16.3,
16.4, 16.6). Each entry states its outcome; none may end in a traceback or a silent answer."""

import json
import shutil
import struct

import pytest
import torch

from bad_catalogue import Bad, Error
from diag.errors import DiagError

LAYER = "model.layers.1.mlp.up_proj.weight"


def _cfg(**kv):
    return lambda c: c.update(kv)


def _poison(key, value):
    def edit(t):
        t[key] = t[key].clone()
        t[key].view(-1)[7] = value
    return edit


def _drop(path, name):
    (path / name).unlink()
    return path


def _garbage_header(ctx):
    t = ctx.target()
    f = t / "model.safetensors"
    f.write_bytes(b"\xff" * 8 + f.read_bytes()[8:])
    return ctx.run(target=t)


def _truncated(ctx):
    t = ctx.target()
    f = t / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    return ctx.run(target=t)


def _byte_range(ctx):
    """A header that says F16 where the bytes are F32: offsets no longer fit the shape."""
    t = ctx.target()
    f = t / "model.safetensors"
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header["model.norm.weight"]["dtype"] = "F16"
    new = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(new) == n
    f.write_bytes(raw[:8] + new + raw[8 + n:])
    return ctx.run(target=t)


def _extra_tensor(ctx):
    t = ctx.target(tensors=lambda t: t.__setitem__("model.extra_adapter.weight", torch.zeros(4, 4)))
    return ctx.run(target=t)


def _index_missing_shard(ctx):
    t = ctx.target()
    (t / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}))
    return ctx.run(target=t)


def _wrapper(ctx):
    def wrap(c):
        inner = dict(c)
        c.clear()
        c.update({"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                  "text_config": inner})
    return ctx.run(target=ctx.target(config=wrap))


def _tokenizer_gone(ctx):
    t = ctx.target()
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (t / f).unlink(missing_ok=True)
    return ctx.run(target=t)


def _big_tokenizer(ctx):
    t = ctx.target(config=_cfg(vocab_size=200), tensors=lambda t: t.update(
        {"model.embed_tokens.weight": t["model.embed_tokens.weight"][:200],
         "lm_head.weight": t["lm_head.weight"][:200]}))
    return ctx.run(target=t)


CATALOGUE = [
    Bad("target-dir-missing", lambda c: c.run(target=c.tmp / "nope"), Error(("does not exist", "nope"))),
    Bad("target-config-missing", lambda c: c.run(target=_drop(c.target(), "config.json")),
        Error(("no config.json",))),
    Bad("target-config-not-json", lambda c: c.run(target=c.target()) if (
        c.copy("target") / "config.json").write_text("{oops") else None, Error(("not valid JSON", "config.json"))),
    Bad("target-config-no-layers", lambda c: c.run(target=c.target(config=lambda x: x.pop("num_hidden_layers"))),
        Error(("num_hidden_layers", "missing"))),
    Bad("target-shard-garbage-header", _garbage_header, Error(("corrupt safetensors header", "model.safetensors"))),
    Bad("target-shard-truncated", _truncated, Error(("truncated safetensors shard", "model.safetensors"))),
    Bad("target-header-byte-range", _byte_range, Error(("byte range", "model.norm.weight", "F16"))),
    Bad("target-index-names-missing-shard", _index_missing_shard,
        Error(("shard named by the index is missing", "model-00002-of-00002.safetensors"))),
    Bad("target-nan-in-a-layer", lambda c: c.run(target=c.target(tensors=_poison(LAYER, float("nan")))),
        Error(("NaN or Inf", LAYER, "1 NaN"), before_weights=False)),
    Bad("target-inf-in-lm-head", lambda c: c.run(target=c.target(tensors=_poison("lm_head.weight", float("inf")))),
        Error(("NaN or Inf", "lm_head.weight", "1 Inf"), before_weights=False)),
    Bad("target-nan-in-embedding", lambda c: c.run(target=c.target(
        tensors=_poison("model.embed_tokens.weight", float("nan")))),
        Error(("NaN or Inf", "model.embed_tokens.weight"), before_weights=False)),
    Bad("target-config-fewer-layers-than-weights", lambda c: c.run(target=c.target(config=_cfg(num_hidden_layers=3))),
        Error(("more decoder layers than config.json declares", "model.layers.3.", "num_hidden_layers = 3",
               "layers 0-3"))),
    Bad("target-config-more-layers-than-weights", lambda c: c.run(target=c.target(config=_cfg(num_hidden_layers=5))),
        Error(("declares decoder layers the checkpoint has no weights for", "[4]"))),
    Bad("target-extra-unexpected-tensor", _extra_tensor,
        Error(("no place", "model.extra_adapter.weight"), before_weights=False)),
    Bad("target-unquantized-multimodal-wrapper", _wrapper, Error(("unquantized multimodal wrapper", "kimi_k25"))),
    Bad("target-fp8-quantization", lambda c: c.run(target=c.target(config=_cfg(quantization_config={
        "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}))),
        Error(("unsupported quantization format", "fp8"))),
    Bad("target-tokenizer-missing", _tokenizer_gone, Error(("cannot load the target's tokenizer",))),
    Bad("target-tokenizer-larger-than-vocab", _big_tokenizer, Error(("vocab",))),
]


@pytest.mark.parametrize("bad", [b.param() for b in CATALOGUE])
def test_bad_target(bad, outcome):
    outcome(bad)


# ---- the two loaders directly: the INT4 path, and kimi_k2 without quantization -------------

@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    from test_int4_tiny import tiny_deepseek
    return tiny_deepseek(tmp_path_factory.mktemp("ds") / "bf16")


def test_int4_config_with_fewer_layers_than_weights_is_an_error(deepseek, tmp_path):
    """16.4, INT4 path: the packed loader refuses the weights of a layer config.json drops,
    and the header check says so before any weight is read."""
    from test_int4_tiny import edit_config
    from diag.checkpoint.headers import tensor_infos
    from diag.checkpoint.layers import check_layer_count
    from diag.int4.load import load_packed_target
    from diag.int4.write import quantize_checkpoint
    q = quantize_checkpoint(deepseek, tmp_path / "int4", group_size=32)
    edit_config(q, lambda c: c.update(num_hidden_layers=2))
    cfg = json.loads((q / "config.json").read_text())
    with pytest.raises(DiagError, match="more decoder layers") as before:
        check_layer_count(tensor_infos(q), cfg, file=str(q), config_file=str(q / "config.json"))
    assert "model.layers.2." in str(before.value)
    with pytest.raises(DiagError, match="no place for") as at_load:
        load_packed_target(q)
    assert "model.layers.2." in str(at_load.value)


def test_int4_nan_scale_is_an_error_naming_the_tensor(deepseek, tmp_path):
    from test_int4_tiny import edit_tensors
    from diag.int4.load import load_packed_target
    from diag.int4.write import quantize_checkpoint
    q = quantize_checkpoint(deepseek, tmp_path / "int4", group_size=32)
    key = "model.layers.1.mlp.experts.3.down_proj.weight_scale"

    def poison(t):
        t[key] = t[key].clone()
        t[key][0, 0] = float("nan")
    edit_tensors(q, poison)
    with pytest.raises(DiagError, match="NaN or Inf") as err:
        load_packed_target(q)
    assert key in str(err.value)


def test_unquantized_kimi_k2_loads_as_deepseek_v3(deepseek, tmp_path):
    """16.6: a `kimi_k2` config without quantization (only remote code knows the type) is built
    as deepseek_v3, the same weights, as the INT4 loader does: correct handling, not a traceback."""
    from test_int4_tiny import edit_config
    from diag.target.load import load_target
    k2 = shutil.copytree(deepseek, tmp_path / "k2")
    edit_config(k2, lambda c: c.update(model_type="kimi_k2", auto_map={
        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"}))
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        ours = load_target(k2, dtype=torch.float32)[0](ids).logits
        ref = load_target(deepseek, dtype=torch.float32)[0](ids).logits
    torch.testing.assert_close(ours, ref)


def test_mtp_layer_after_the_decoder_is_not_an_extra_layer():
    """DeepSeek-V3 ships its multi-token-prediction layer as model.layers.61 (eh_proj, enorm,
    hnorm): correct handling is to accept it; a plain layer 61 is an extra layer."""
    from diag.checkpoint.layers import check_layer_count
    cfg = {"num_hidden_layers": 61, "num_nextn_predict_layers": 1}
    names = [f"model.layers.{i}.mlp.up_proj.weight" for i in range(61)]
    check_layer_count(names + ["model.layers.61.eh_proj.weight", "model.layers.61.mlp.up_proj.weight"],
                      cfg, file="ckpt", config_file="ckpt/config.json")
    with pytest.raises(DiagError, match="more decoder layers"):
        check_layer_count(names + ["model.layers.61.mlp.up_proj.weight"], cfg, file="ckpt",
                          config_file="ckpt/config.json")
