"""`diag bench`: measured speed and memory of diag's own passes (target capture, drafter
replay, the naive loop it replaces) on the machine at hand, written as a versioned JSON
envelope with the machine's description; markdown renders from that JSON only.

Goals (reported against, never asserted): INT4-resident target pass >= 0.8x the bf16
grouped_mm throughput at <= 0.3x its weight memory; MoE layers >= 40% of the measured bf16
matmul peak for >= 8k-token batches, dequantization included; drafter replay >= 30% of
peak; >= 30x faster than the naive loop; resident weights <= 1.15x checkpoint bytes; one
sampled evaluation (layout x tree, decode loop) <= num_draft_tokens x one greedy pass.
"""

BENCH_VERSION = 1
