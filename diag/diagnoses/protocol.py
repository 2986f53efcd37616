"""What a diagnosis is to the rest of diag: one object that computes a typed section from a
finished evaluation and says what the section means (verdicts), shows (Markdown) and draws
(plots).

    name           its module's name, its verdicts' subject, its key in the registry's ORDER
    key            its key in report.json (its name unless the class sets another: a common word
                   such as "speedup" or "server", which the core also uses for a case section,
                   a flag or an axis, keeps its report key under a distinctive name)
    Section        a frozen dataclass (typed.py reads report.json and the schema from it)
    needs          what it asks of the target pass beyond the run's own: NEEDS_LONG_PROMPTS
                   (a ladder of long prompts: run/inputs.py cuts them only when a registered
                   diagnosis needs them, hooks.needed(); run/target_passes.py passes them), or nothing
    place          where report.md and the verdict list show it among the core's sections:
                   PROMPT_SIDE (after acceptance by dataset; its verdicts after the decoding
                   verdicts) or SERVING (after the prompt side; its verdicts after the engines');
                   the order within a place is the registry's (diag/diagnoses/__init__.py)
    prepare(inp)   -> (inp, state): before any weight is loaded, after the case is checked; may
                   add to the inputs (a tree the server runs); `state` reaches the later steps
                   as ctx.prepared[name] (None by default)
    with_model(state, regime, model, loaded)
                   while a regime's target model is loaded (step costs measured on it); `loaded`
                   is a Loaded (drafter, embedding, head, use_cache, the final inputs, and a
                   timings dict for the seconds it spends there); nothing by default
    validate_lines(case, prompt_ids, target_config)
                   what `diag validate` prints of its own input files, read as run reads them
    check_case(case)  raises DiagError naming the file and key when its case section is wrong,
                   before anything loads (run/case.check_case calls it)
    add_flags(p), apply_flags(case, args), flag_of
                   its `diag run` flags, what they set in the case, and the case field each sets
                   (a check of the case names the flag: cli/run.py); none by default
    compute(ctx)   -> Section, or None when it has nothing to say
    verdicts(sec, others)  -> [Verdict]; never called with None. `others` (Offered) answers what
                   the other sections offer by attribute name (a section offering a server-
                   calibrated speedup), never by diagnosis name
    leading(sec)   -> [Verdict] that lead their severity in the whole list (an engine defect)
    markdown(sec, rep) -> report.md lines; `sec` is read back from report.json (Markdown is a
                   rendering of the JSON, never a second computation), `rep` the whole report
                   (for plot links)
    plots(sec, rep, folder) -> [{"file", "title"}] of the PNGs drawn; a pure function of its
                   section and the report keys in `plot_reads` (report/plot_cache.py keys the PNGs
                   on them and on the module's source, so a repeat run copies them)

Context is what every diagnosis may read: the run's inputs, the trained layout, the greedy
reference axes, the evaluations, the target passes (and extra passes), the drafter and the
target's embedding and head. The prompt side is read greedily on the trained (best eagle3)
layout and the primary tree. This module knows the shape of a diagnosis; it knows no
diagnosis and nothing about files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from diag.diagnoses.typed import from_json, json_schema, to_json
from diag.replay.evaluation import Axes, Evaluation, one

NEEDS_LONG_PROMPTS = "long-prompts"
PROMPT_SIDE = "prompt-side"
SERVING = "serving"
PLACES = (SERVING, PROMPT_SIDE)


@dataclass(frozen=True)
class Loaded:
    """What is in memory while the target pass runs: the drafter, the target's embedding and
    head (target/tables.py), whether the run may read and write diag's caches, and the run's
    inputs as every prepare() left them (a tree a later diagnosis added is among its shapes). `timings`:
    seconds a diagnosis spent while a target was loaded (e.g. {"target_costs_s": 1.2}); the
    pipeline adds them to the run's timings after the pass's phases (inside target_s)."""
    drafter: Any
    embed: Any
    head: Any
    use_cache: bool = True
    inp: Any = None
    timings: dict = field(default_factory=dict)


class Offered:
    """The computed sections seen from another diagnosis: `get(attr)` is the first non-None
    value of that attribute on any section (registry order), None when none offers it. A
    diagnosis reads another's result through what that section offers, never its name."""

    def __init__(self, sections: dict):
        self._sections = [s for s in sections.values() if s is not None]

    def get(self, attr: str):
        return next((v for s in self._sections if (v := getattr(s, attr, None)) is not None), None)


@dataclass(frozen=True)
class Context:
    inp: Any                          # run/inputs.Inputs
    reference: Axes                   # the run's reference axes at greedy decoding
    layout: str | None                # the trained (best eagle3) layout, None when nothing was evaluated
    evaluations: list[Evaluation]
    passes: dict                      # regime -> TargetPass; passes[inp.regimes[0]] is the reference pass
    extra: dict                       # extra passes by role (run/target_passes.py)
    drafter: Any
    embed: Any
    head: Any
    progress: bool = False
    cache: Any = None                 # the run's eval_cache.EvalCache (replays answered from it), or None
    prepared: dict = field(default_factory=dict)   # name -> what its prepare() returned
    notes: list = field(default_factory=list)      # the run's notes: compute may add a sentence
    timings: dict = field(default_factory=dict)    # the run's timings: compute may add its seconds

    @property
    def reference_pass(self):
        return self.passes[self.inp.regimes[0]]

    def served(self) -> Evaluation | None:
        """The trained layout at the reference axes (primary tree, greedy), or None."""
        return None if self.layout is None else one(self.evaluations, self.reference, layout=self.layout)

    def trained(self) -> tuple[str | None, list[Evaluation]]:
        """The trained (best eagle3) layout at the run's own reference axes (decoding included:
        RunResult.best_layout) and its evaluations there on every tree; (None, []) when none."""
        from diag.replay.evaluation import ANY, select
        from diag.run.evaluate import reference_axes, trained_lead
        ref = reference_axes(self.inp)
        top = trained_lead(self.evaluations, ref, self.inp.case, self.inp.candidates)
        return (None, []) if top is None else (top.layout, select(self.evaluations, ref, layout=top.layout, tree=ANY))

    def served_eagle3(self) -> Evaluation | None:
        """The same, only when it runs in eagle3 mode (the drafter's own vocabulary and states)."""
        e = self.served()
        return e if e is not None and e.mode == "eagle3" else None


class Diagnosis:
    """Subclass per diagnosis (one module each under diag/diagnoses/), registered in
    diag/diagnoses/__init__.py. Defaults: no needs, no verdicts, no Markdown, no plots."""

    name: ClassVar[str]
    key: ClassVar[str]
    Section: ClassVar[type]
    needs: ClassVar[frozenset[str]] = frozenset()
    place: ClassVar[str] = PROMPT_SIDE
    plot_reads: ClassVar[tuple[str, ...]] = ()    # report keys its plots read besides its own section
    flag_of: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "key" not in cls.__dict__ and "name" in cls.__dict__:
            cls.key = cls.name

    def check_case(self, case) -> None:
        """Its case section's values, checked before anything loads; nothing by default."""

    def add_flags(self, parser) -> None:
        """Its `diag run` flags on an argparse parser."""

    def apply_flags(self, case, args):
        """The case with what its flags set on top (unchecked), else the case as it is."""
        return case

    def prepare(self, inp):
        """Before any weight is loaded: (the inputs, possibly with more to evaluate, its state)."""
        return inp, None

    def with_model(self, state, regime: str, model, loaded: Loaded) -> None:
        """While `regime`'s target model is loaded."""

    def validate_lines(self, case, prompt_ids: list[str], target_config: dict | None) -> list[str]:
        """What `diag validate` prints of this diagnosis's own inputs (its files), read and checked
        as `diag run` reads them, no weight loaded; a DiagError as run would raise it. None by default."""
        return []

    def compute(self, ctx: Context):
        raise NotImplementedError

    def verdicts(self, section, others: Offered | None = None) -> list:
        return []

    def leading(self, section) -> list:
        return []

    def markdown(self, section, rep: dict) -> list[str]:
        return []

    def plots(self, section, rep: dict, folder: Path) -> list[dict]:
        return []

    # ---- from the Section type -----------------------------------------------------------
    def to_json(self, section) -> dict | None:
        return None if section is None else to_json(section)

    def read(self, rep: dict):
        """This diagnosis's section out of a report dict, typed; None when absent or null."""
        return from_json(self.Section, rep.get(self.key))

    def schema(self) -> dict:
        return json_schema(self.Section)
