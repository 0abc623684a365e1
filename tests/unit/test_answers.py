"""The check of a person's answer against its question's schema (ctx.ask), and the form built from it."""

from __future__ import annotations

import enum

import pytest

from leaseq import InvalidInput
from leaseq.core import answers

ORDER = {
    "type": "object",
    "properties": {
        "approve": {"type": "boolean"},
        "note": {"type": "string", "maxLength": 20},
        "priority": {"enum": ["low", "high"]},
        "amount": {"type": "integer", "minimum": 1},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    },
    "required": ["approve", "amount"],
    "additionalProperties": False,
}


def refused(schema: dict, value: object) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        answers.validate(schema, value)
    return info.value


def test_an_answer_that_fits_passes() -> None:
    answers.validate(ORDER, {"approve": True, "amount": 3, "priority": "low", "tags": ["a", "b"]})
    answers.validate(ORDER, {"approve": False, "amount": 3.0})  # 3.0 is an integer in JSON
    answers.validate(answers.TEXT, "yes")
    answers.validate({}, {"anything": [1, None]})


@pytest.mark.parametrize("value, field, words", [
    ({"approve": "yes", "amount": 1}, "answer.approve", "must be true or false"),
    ({"approve": True}, "answer.amount", "is required"),
    ({"approve": True, "amount": 0}, "answer.amount", "at least 1"),
    ({"approve": True, "amount": 1.5}, "answer.amount", "an integer"),
    ({"approve": True, "amount": True}, "answer.amount", "an integer"),
    ({"approve": True, "amount": 1, "priority": "urgent"}, "answer.priority", 'one of "low", "high"'),
    ({"approve": True, "amount": 1, "note": "x" * 21}, "answer.note", "at most 20 characters"),
    ({"approve": True, "amount": 1, "tags": ["a", 3]}, "answer.tags[1]", "a string"),
    ({"approve": True, "amount": 1, "tags": ["a", "a"]}, "answer.tags[1]", "unique"),
    ({"approve": True, "amount": 1, "colour": "red"}, "answer.colour", "not a field of this answer"),
    (["approve"], "answer", "an object"),
])
def test_a_bad_answer_names_its_field(value: object, field: str, words: str) -> None:
    error = refused(ORDER, value)
    assert error.field == field and words in error.problem, (error.field, error.problem)


class Level(str, enum.Enum):
    low = "low"
    high = "high"


def test_a_pydantic_models_schema_is_checked_as_pydantic_writes_it() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Reviewer(pydantic.BaseModel):
        name: str

    class Decision(pydantic.BaseModel):
        approve: bool
        level: Level = Level.low
        reviewer: Reviewer | None = None
        limit: float | None = None

    schema, model = answers.schema_of(Decision)
    assert model is Decision and answers.check_schema(schema) is schema
    answers.validate(schema, {"approve": True, "level": "high", "reviewer": {"name": "ann"}})
    answers.validate(schema, {"approve": False, "reviewer": None, "limit": 2.5})
    assert refused(schema, {"approve": True, "level": "urgent"}).field == "answer.level"
    # Optional[Model]: the error inside the model, not "must be one of ..."
    assert refused(schema, {"approve": True, "reviewer": {}}).field == "answer.reviewer.name"
    assert refused(schema, {"approve": True, "limit": "much"}).field == "answer.limit"
    assert answers.summary(schema) == 'approve: boolean, level?: "low"|"high", reviewer?: {name: string}|null, ' \
                                      'limit?: number|null'


@pytest.mark.parametrize("schema, field", [
    ({"type": "object", "propertyNames": {"maxLength": 3}}, "schema.propertyNames"),
    ({"type": "text"}, "schema.type"),
    ({"properties": {"a": {"$ref": "#/$defs/Missing"}}}, "schema.properties.a.$ref"),
    ({"$ref": "https://example.com/schema.json"}, "schema.$ref"),
    ({"type": "string", "pattern": "("}, "schema.pattern"),
    ({"type": "number", "multipleOf": 0}, "schema.multipleOf"),
    ({"required": "a"}, "schema.required"),
])
def test_a_schema_leaseq_cannot_check_is_refused_when_asked(schema: dict, field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        answers.check_schema(schema)
    assert info.value.field == field


def test_schema_of_takes_a_dict_a_model_or_nothing() -> None:
    assert answers.schema_of(None) == (answers.TEXT, None)
    assert answers.schema_of({"type": "integer"}) == ({"type": "integer"}, None)
    with pytest.raises(InvalidInput) as info:
        answers.schema_of(int)
    assert info.value.field == "schema"


def test_the_dashboard_form_follows_the_schema() -> None:
    pytest.importorskip("fastapi")
    from leaseq.service.asks import answer_from_form, form_of

    form = form_of(ORDER)
    assert form.fields is None  # an array property: a JSON text area
    simple = {k: v for k, v in ORDER.items()}
    simple["properties"] = {k: v for k, v in ORDER["properties"].items() if k != "tags"}
    form = form_of(simple)
    assert form.fields is not None
    assert [(f.name, f.kind, f.required) for f in form.fields] == [
        ("approve", "boolean", True), ("note", "text", False), ("priority", "choice", False),
        ("amount", "integer", True)]
    posted = {"field.approve": "true", "field.note": "", "field.priority": '"high"', "field.amount": "4"}
    assert answer_from_form(simple, posted) == {"approve": True, "priority": "high", "amount": 4}
    assert answer_from_form(simple, {"field.amount": "2"}) == {"approve": False, "amount": 2}
    with pytest.raises(InvalidInput) as info:
        answer_from_form(simple, {"field.amount": "four"})
    assert info.value.field == "answer.amount"
    scalar = form_of({"type": "number"})
    assert scalar.fields is not None and [f.kind for f in scalar.fields] == ["number"]
    assert answer_from_form({"type": "number"}, {"field": "2.5"}) == 2.5
    assert answer_from_form(ORDER, {"json": '{"approve": true}'}) == {"approve": True}
