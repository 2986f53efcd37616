"""The live server: what a running server reported (its files, or the case's [server] numbers),
which of diag's evaluated candidates explains it, whether its sampled runs are sane, the speedup
calibrated from its rates, what its running-request cap costs (report key `server`).

    inputs.py       the case's [server] files read and checked before any weight is loaded
    observation.py  the server's numbers as one record, and how several sources combine
    text_match.py   responses paired with prompts by their text when no request id matches
    sampled.py      the sampled runs ([server] sampled) and the engine-sanity check they feed
    reconcile.py    which candidate explains the server's accept length
    calibrate.py    the speedup model calibrated from the server's rates
    section.py      the typed section (report.json's `server`), offering `calibrated_speedup`
    verdicts.py     match, concurrency and calibrated-speedup verdicts; ENGINE DEFECT leads
    markdown.py     "The live server"

prepare() reads the server before any weight is loaded and adds the tree it ran to the evaluated
trees (with a note), so the candidates are compared on that tree too. Worked example (the seed
run): --server-baseline-tps 90 --server-tps 82.3 --server-accept-length 2.2 --server-tree s3-k4-d5
-> s3-k4-d5 evaluated beside the case's trees; a round costs 26.73 ms, break-even 2.41.
"""

from __future__ import annotations

from dataclasses import replace

from diag.diagnoses.live_serving.inputs import read_server
from diag.diagnoses.live_serving.markdown import markdown
from diag.diagnoses.live_serving.section import ServerSection, server_section
from diag.diagnoses.live_serving.verdicts import sanity_verdicts, server_verdicts
from diag.diagnoses.protocol import SERVING, Context, Diagnosis
from diag.engines import families, family_rules
from diag.run.evaluate import reference_axes


class LiveServing(Diagnosis):
    name = "live_serving"
    key = "server"
    Section = ServerSection
    place = SERVING

    def prepare(self, inp):
        """The server's observation, read and checked before any weight is loaded; the tree it ran
        joins the evaluated trees."""
        case = inp.case
        obs = read_server(case, [p[0] for p in inp.prompts], inp.target_config, seed=case.evaluate.seed,
                          n_boot=case.evaluate.bootstrap)
        if obs is not None and obs.shape is not None and obs.shape not in inp.shapes:
            inp = replace(inp, shapes=[*inp.shapes, obs.shape],
                          notes=[*inp.notes, f"the server's tree {obs.shape.name} ({obs.shape_source}) was added "
                                             "to the evaluated trees"])
        return inp, obs

    def validate_lines(self, case, prompt_ids: list[str], target_config: dict | None) -> list[str]:
        """The [server] files read and checked exactly as `diag run` reads them (no weights)."""
        obs = read_server(case, prompt_ids, target_config)
        if obs is None:
            return []
        files = ", ".join(f"{k} {p}" for k, p in obs.files) or "no file"
        al = f"accept length {obs.accept_length.value:.2f}" if obs.accept_length else "no accept length"
        tree = obs.shape.name if obs.shape else "tree not named"
        return [f"server: {obs.engine_label}; {files}; {al}; {tree}"]

    def compute(self, ctx: Context) -> ServerSection | None:
        obs = ctx.prepared.get(self.name)
        if obs is None:
            return None
        ev = ctx.inp.case.evaluate
        served = tuple(c.label for c in ctx.inp.candidates if "serving" in c.roles)
        return server_section(obs, ctx.evaluations, reference_axes(ctx.inp), ctx.trained()[0], seed=ev.seed,
                              n_boot=ev.bootstrap, served_layout=served[0] if served else None, served=served)

    def verdicts(self, sec: ServerSection, others=None) -> list:
        return server_verdicts(sec)

    def leading(self, sec: ServerSection) -> list:
        return sanity_verdicts(sec)

    def markdown(self, sec: ServerSection, rep: dict) -> list[str]:
        return markdown(sec)

    def schema(self) -> dict:
        """The section's schema from its types, a `simulate` row's engine fields checked by each
        registered engine's own schema (EngineRules.simulation_schema; parts.SimulateRow)."""
        out = super().schema()
        row = out["properties"]["simulate"]["items"]
        engines = {k: v for f in families() for k, v in family_rules(f).simulation_schema().items()}
        row["properties"].update(engines)
        row["required"] = [*row["required"], *engines]
        row["additionalProperties"] = False
        return out
