"""The registry's hooks carry any registered diagnosis through every stage with no edit
outside its module: a throwaway diagnosis, registered for the test only, is computed, written
to report.json in registry order, given a generated schema, judged, rendered and drawn."""

import json
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest

import diag.diagnoses.hooks as hooks
from diag.diagnoses import DIAGNOSES
from diag.diagnoses.protocol import Context, Diagnosis
from diag.diagnoses.typed import COUNT, json_schema, key, meta
from diag.run.verdicts.record import Verdict

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "diag" / "schema" / "report.schema.json"


@dataclass(frozen=True)
class Span:
    start: int = key("from", schema=COUNT)
    period: int = meta(schema={"minimum": 1})


@dataclass(frozen=True)
class Toy:
    count: int = meta(schema=COUNT)
    share: float | None = meta()
    spans: tuple[Span, ...] = meta()


class ToyDiagnosis(Diagnosis):
    name = "toy"
    Section = Toy

    def compute(self, ctx):
        return Toy(len(ctx.evaluations), 0.5, (Span(3, 2),))

    def verdicts(self, sec, others=None):
        return [Verdict("toy", "info", f"{sec.count} evaluations")]

    def markdown(self, sec, rep):
        return ["## Toy", f"{sec.spans[0].start}"]


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setattr(hooks, "DIAGNOSES", (*DIAGNOSES, ToyDiagnosis()))


def test_needs_are_gathered(monkeypatch):
    from diag.diagnoses.protocol import NEEDS_LONG_PROMPTS
    assert NEEDS_LONG_PROMPTS in hooks.needed()
    monkeypatch.setattr(hooks, "DIAGNOSES", (ToyDiagnosis(),))
    assert hooks.needed() == frozenset()


def test_the_schema_is_read_from_the_types():
    s = json_schema(Toy)
    assert s["required"] == ["count", "share", "spans"] and s["additionalProperties"] is False
    assert s["properties"]["share"] == {"type": ["number", "null"]}
    assert s["properties"]["spans"]["items"]["properties"]["from"] == {"type": "integer", "minimum": 0}


def test_a_registered_diagnosis_flows_through_every_stage(registered):
    ctx = Context(None, None, None, [1, 2], {}, {}, None, None, None)
    sections = {d.name: (d.compute(ctx) if d.name == "toy" else None) for d in hooks.DIAGNOSES}
    out = hooks.sections_json(sections)
    assert list(out)[-1] == "toy" and out["toy"] == {"count": 2, "share": 0.5, "spans": [{"from": 3, "period": 2}]}
    assert [v.text for v in hooks.verdicts_all(sections)] == ["2 evaluations"]
    assert hooks.markdown_all({"toy": out["toy"]}) == ["## Toy", "3"]
    schema = hooks.report_schema(json.loads(SCHEMA_FILE.read_text()))
    assert "toy" in schema["required"] and schema["$defs"]["toy"] == json_schema(Toy)
    v = jsonschema.Draft202012Validator({"$defs": schema["$defs"], "$ref": "#/$defs/toy"})
    assert not list(v.iter_errors(out["toy"]))
    assert list(v.iter_errors({**out["toy"], "count": -1}))


class Served(Diagnosis):
    """A throwaway serving-side diagnosis: adds a tree before the load, counts the models it saw,
    offers a number to the others, and leads with an error."""
    name = "served_toy"
    Section = Toy
    place = "serving"

    def prepare(self, inp):
        return [*inp, "s1-k1-d1"], {"models": []}

    def with_model(self, state, regime, model, loaded):
        state["models"].append((regime, model, loaded.use_cache))

    def compute(self, ctx):
        return Toy(len(ctx.prepared[self.name]["models"]), 0.25, ())

    def verdicts(self, sec, others=None):
        return [Verdict("served", "info", f"saw {sec.count}")]

    def leading(self, sec):
        return [Verdict("served-defect", "error", "defect")]

    def markdown(self, sec, rep):
        return ["## Served"]


class Reader(ToyDiagnosis):
    name = "reader"

    def verdicts(self, sec, others=None):
        return [Verdict("reader", "info", f"share offered: {others.get('share')}")]


def test_places_orders_preparation_and_what_others_offer(monkeypatch):
    from diag.diagnoses.protocol import Loaded
    toy, served, reader = ToyDiagnosis(), Served(), Reader()
    monkeypatch.setattr(hooks, "DIAGNOSES", (toy, served, reader))
    monkeypatch.setattr(hooks, "ORDER", {"verdicts": ("reader", "toy")})
    inp, states = hooks.prepare_all(["chain-3"])
    assert inp == ["chain-3", "s1-k1-d1"] and states["toy"] is None
    hooks.with_model_all(states, "bf16", "M", Loaded(None, None, None, use_cache=False))
    assert states["served_toy"] == {"models": [("bf16", "M", False)]}
    ctx = Context(None, None, None, [1], {}, {}, None, None, None, prepared=states)
    sections = hooks.compute_all(ctx)
    assert list(hooks.sections_json(sections)) == ["toy", "served_toy", "reader"]      # registry order
    # the prompt side in ORDER's order; the serving side alone; the first section offering `share`
    # is toy's (0.5), registry order
    assert [v.text for v in hooks.verdicts_all(sections)] == ["share offered: 0.5", "1 evaluations"]
    assert [v.text for v in hooks.verdicts_all(sections, "serving")] == ["saw 1"]
    assert [v.kind for v in hooks.leading_all(sections)] == ["served-defect"]
    rep = hooks.sections_json(sections)
    assert hooks.markdown_all(rep, "serving") == ["## Served"]
    assert hooks.markdown_all(rep) == ["## Toy", "3", "## Toy", "3"]
    with pytest.raises(ValueError, match="unknown place"):
        hooks.markdown_all(rep, "elsewhere")


class Keyed(ToyDiagnosis):
    """A diagnosis whose report key is not its name (a common word elsewhere in diag)."""
    name = "keyed_toy"
    key = "toys"


class Renamed(Keyed):
    name = "renamed_toy"            # sets no key of its own: its key is its name, not Keyed's


def test_a_report_key_other_than_the_name(monkeypatch):
    keyed = Keyed()
    monkeypatch.setattr(hooks, "DIAGNOSES", (ToyDiagnosis(), keyed))
    assert (ToyDiagnosis.key, Keyed.key, Renamed.key) == ("toy", "toys", "renamed_toy")
    sections = hooks.compute_all(Context(None, None, None, [1], {}, {}, None, None, None))
    out = hooks.sections_json(sections)
    assert list(out) == ["toy", "toys"] and "keyed_toy" in sections          # computed by name, written by key
    assert keyed.read({"toys": out["toys"]}) == sections["keyed_toy"] and keyed.read({"keyed_toy": out["toys"]}) is None
    assert hooks.markdown_all({"toys": out["toys"]}) == ["## Toy", "3"]
    schema = hooks.report_schema(json.loads(SCHEMA_FILE.read_text()))
    assert "toys" in schema["required"] and "keyed_toy" not in schema["$defs"]


def test_a_spread_field_writes_its_entries_in_the_parents_object():
    """typed.spread(): a dict whose keys sit in the parent at the field's place, read back as the keys
    no other field claims; the schema then admits keys beyond the fields (as the dict's values)."""
    from diag.diagnoses.typed import from_json, spread, to_json

    @dataclass(frozen=True)
    class Row:
        key: str
        extra: dict[str, int] = spread()
        notes: tuple[str, ...] = meta()

    row = Row("a", {"x": 2, "y": 3}, ("n",))
    assert to_json(row) == {"key": "a", "x": 2, "y": 3, "notes": ["n"]}
    assert list(to_json(row)) == ["key", "x", "y", "notes"]
    assert from_json(Row, to_json(row)) == row
    assert to_json(Row("b", {}, ())) == {"key": "b", "notes": []}
    schema = json_schema(Row)
    assert schema["required"] == ["key", "notes"] and schema["additionalProperties"] == {"type": "integer"}
    assert not list(jsonschema.Draft202012Validator(schema).iter_errors(to_json(row)))
    assert list(jsonschema.Draft202012Validator(schema).iter_errors({"key": "a", "x": "two", "notes": []}))
    assert list(jsonschema.Draft202012Validator(schema).iter_errors({"key": "a", "x": 2}))
