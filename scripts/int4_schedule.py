"""The grouped INT4 kernels' schedules on Hopper, read without a GPU: each kernel compiled for
sm_90a (Triton's own compiler and ptxas, no driver), specialised as the JIT specialises a
launch at Kimi's widths (an int argument that is a multiple of 16 is marked so, 1 becomes a
constant), then summarised from its TTGIR and PTX:

  regs / smem    registers per thread (cuobjdump) and shared memory per CTA
  wgmma          wgmma.mma_async instructions; waits: each wgmma.wait_group's count, in
                 order ("0000": every MMA waited for at once; "1111": one left in flight)
  loop           the K loop's order of events: W<n> wait for copies (<n> groups may stay
                 in flight), c a copy issued, d<n> an MMA wait, L words read from shared

This is how the Triton kernel's schedule was found to issue the next K step's copies after
the step's last MMA and to wait for every MMA (NOTES.md, "wgmma_kernel").

Usage: python scripts/int4_schedule.py    (Triton >= 3.5 for Gluon; neither CUDA nor torch needed,
       e.g. python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0, then that python)
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

POINTERS = {"a_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*bf16", "out_ptr": "*bf16", "sorted_ids_ptr": "*i32",
            "block_expert_ptr": "*i32", "route_w_ptr": "*fp32"}
# Kimi at 8k tokens: gate_up [E, 4096, 7168 / 8] words over x [8192, 7168]; down [E, 7168,
# 2048 / 8] over h [65536, 2048]; scales group major (stride 1 along N)
WIDTHS = {"gate_up": dict(N=4096, K=7168, num_pairs=65536, a_div=8, stride_am=7168, stride_we=4096 * 896,
                          stride_wn=896, stride_se=224 * 4096, stride_sn=1, stride_sg=4096, stride_om=4096),
          "down": dict(N=7168, K=2048, num_pairs=65536, a_div=1, stride_am=2048, stride_we=7168 * 256,
                       stride_wn=256, stride_se=64 * 7168, stride_sn=1, stride_sg=7168, stride_om=7168)}


def compile_sm90(fn, consts: dict, values: dict, num_warps: int, num_stages: int | None = None, gluon=False):
    """fn (a triton or gluon jit function) compiled for sm_90a as a launch with these int
    values would be."""
    sig, cx, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name], cx[(i,)] = "constexpr", consts[name]
        elif name in POINTERS:
            sig[name], attrs[(i,)] = POINTERS[name], [["tt.divisibility", 16]]
        elif values.get(name) == 1:
            sig[name], cx[(i,)] = "constexpr", 1
        else:
            sig[name] = "i32"
            if values.get(name, 1) % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        Source = ASTSource
    options = {"num_warps": num_warps, **({"num_stages": num_stages} if num_stages else {})}
    return triton.compile(Source(fn, sig, constexprs=cx, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                          options=options)


def registers(kernel) -> int | None:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+)", out)
    return int(m.group(1)) if m else None


def loop_events(ttgir: str) -> str:
    body = ttgir[ttgir.find("scf.for"):]
    body = body[:body.find("scf.yield")]
    events = []
    for line in body.splitlines():
        if "async_wait" in line:
            events.append("W" + re.search(r"num = (\d+)", line).group(1))
        elif "async_copy_global_to_local" in line:
            events.append("c")
        elif "warp_group_dot_wait" in line:
            events.append("d" + re.search(r"pendings = (\d+)", line).group(1))
        elif "ttg.local_load" in line:
            events.append("L")
    return " ".join(events)


def summary(kernel) -> dict:
    ptx = kernel.asm["ptx"]
    return {"regs": registers(kernel), "smem": kernel.metadata.shared,
            "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
            "waits": "".join(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)),
            "loop": loop_events(kernel.asm["ttgir"])}


def _kernel_module(name: str):
    """diag/int4/<name>.py by path, registered under its own name, so that one kernel module
    imports another without the diag.int4 package (which needs torch): this runs where only
    a Triton >= 3.5 is installed."""
    path = Path(__file__).resolve().parents[1] / "diag" / "int4" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"diag.int4.{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main():
    fast_kernel, wgmma_kernel = _kernel_module("fast_kernel"), _kernel_module("wgmma_kernel")
    base = dict(GROUP=32, PIECE=32, BLOCK_N=128, BLOCK_M=64)
    rows = [("triton one block, 2 stages (gate_up before)", fast_kernel.moe_int4_gemm_grouped,
             {**base, "DEQUANT": 3, "UPCAST": False, "MUL_ROUTE": False, "WIDE": False, "GLU": False}, "gate_up", 2, False),
            ("triton split 3, 2 stages (down before)", fast_kernel.moe_int4_gemm_split,
             {**base, "DEQUANT": 3, "UPCAST": False, "MUL_ROUTE": True, "GLU": False, "SPLIT": 3}, "down", 2, False),
            ("wgmma split 3, 2 stages, drain (both now)", wgmma_kernel.moe_int4_gemm_wgmma,
             {**base, "MUL_ROUTE": False, "SPLIT": 3, "STAGES": 2, "DRAIN": True}, "gate_up", None, True)]
    for name, fn, consts, which, stages, gluon in rows:
        k = compile_sm90(fn, consts, WIDTHS[which], 8, stages, gluon)
        print(f"{name}: {summary(k)}")


if __name__ == "__main__":
    main()
