"""`diag kimi-shaped --layers K OUT`: write a Kimi-shaped INT4 target and EAGLE-3 drafter
(real widths unless --small) for loading, placement and speed work without Kimi itself.

OUT is written as a whole, as a report directory is (report/outdir.py): it must be new,
empty, or an earlier `kimi-shaped` output (its manifest lists every file); the checkpoint is
written into a sibling partial directory and swapped into place, so a user's config.json or
model.safetensors in OUT is never overwritten and an interrupted write never looks whole."""

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
    import shutil

    from diag.report.outdir import KIMI_KIND, check_out_dir, partial_dir, swap_into_place, write_manifest
    from diag.zoo.kimi_shaped import kimi_shaped

    out = check_out_dir(a.out, KIMI_KIND, field="OUT")      # before a single weight is drawn
    widths = drafter_widths = None
    if a.small:
        from diag.bench.cpu import SMALL, SMALL_DRAFTER
        widths, drafter_widths = SMALL, SMALL_DRAFTER
    tmp = partial_dir(out)
    try:
        ks = kimi_shaped(tmp, layers=a.layers, seed=a.seed, widths=widths, drafter_widths=drafter_widths,
                         wrapper=a.wrapper, drafter=not a.no_drafter, device=a.device)
        write_manifest(tmp, KIMI_KIND)
        swap_into_place(tmp, out, KIMI_KIND)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"target:  {out / ks.target.name} ({ks.bytes_on_disk / 1e9:.2f} GB)")
    if ks.drafter is not None:
        print(f"drafter: {out / ks.drafter.name} (trained layout claimed: {ks.layout})")
    return 0
