"""`diag kimi-shaped --layers K OUT`: write a Kimi-shaped INT4 target and EAGLE-3 drafter
(real widths unless --small) for loading, placement and speed work without Kimi itself."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("kimi-shaped", help="write a K-layer Kimi-shaped INT4 checkpoint + drafter")
    p.add_argument("out", help="output directory (target/ and drafter/ inside)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (layer 0 dense, the rest MoE)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wrapper", action="store_true", help="K2.5 multimodal wrapper layout")
    p.add_argument("--no-drafter", action="store_true")
    p.add_argument("--small", action="store_true", help="shrunk widths (tests, CPU demos)")
    p.add_argument("--device", default="cpu", help="where random weights are generated (cuda is faster)")
    p.set_defaults(func=run)


def run(a) -> int:
    from diag.zoo.kimi_shaped import kimi_shaped

    widths = drafter_widths = None
    if a.small:
        from diag.bench.cpu import SMALL, SMALL_DRAFTER
        widths, drafter_widths = SMALL, SMALL_DRAFTER
    ks = kimi_shaped(a.out, layers=a.layers, seed=a.seed, widths=widths, drafter_widths=drafter_widths,
                     wrapper=a.wrapper, drafter=not a.no_drafter, device=a.device)
    print(f"target:  {ks.target} ({ks.bytes_on_disk / 1e9:.2f} GB)")
    if ks.drafter is not None:
        print(f"drafter: {ks.drafter} (trained layout claimed: {ks.layout})")
    return 0
