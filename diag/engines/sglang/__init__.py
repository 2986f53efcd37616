"""What a serving engine decides, per version: layer-id conventions, serving plans, launch flags
and their rewrites, tree defaults, metric formulas. Reads config dicts; loads nothing."""
