"""INT4 compressed-tensors `pack-quantized` checkpoints (Kimi's routed experts).

  format.py    nibble packing, RTN quantize / dequantize (pure torch)
  scheme.py    targets / ignore matching, the quantization_config JSON
  shards.py    safetensors headers and shards, checked
  skeleton.py  config.json -> empty transformers text model (K2.5, kimi_k2)
  write.py     quantize_checkpoint: bf16 checkpoint -> INT4 checkpoint
  packed.py    PackedExperts / PackedLinear: weights stay packed in memory
  sharded.py   ShardedExperts: a layer's experts split over N devices
  load.py      load_packed_target: INT4 checkpoint -> model with packed modules

compressed_tensors is never imported here: tests compare against it.
"""

from diag.int4.format import dequantize, fake_quantize, pack_int4, quantize_rtn, unpack_int4
from diag.int4.scheme import KIMI_IGNORE, KIMI_K25_IGNORE

__all__ = ["dequantize", "fake_quantize", "pack_int4", "quantize_rtn", "unpack_int4",
           "KIMI_IGNORE", "KIMI_K25_IGNORE"]
