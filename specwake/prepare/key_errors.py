"""What pydantic found wrong in a scenario file, as the one line specwake prints (``file: key.path: reason``): the
key as the user wrote it (not the tag pydantic adds for a union's member), "unknown key" with the nearest allowed
one, one error for a value that fits no member of a union, and the other problems after the first.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from specwake.errors import ScenarioError
from specwake.prepare.scenario_file import allowed_keys, did_you_mean


def error_from_validation(file: str, exc: ValidationError) -> ScenarioError:
    """Every problem pydantic found, the first as the key of the one line, the others after it."""
    problems = [_problem(err) for err in _one_per_union(exc.errors())]
    (loc, msg), rest = problems[0], problems[1:]
    return ScenarioError(file, loc, msg + "".join(f"; {key}: {text}" if key else f"; {text}" for key, text in rest))


def _one_per_union(errors: list[Any]) -> list[Any]:
    """A value that fits no member of a union (`level: 1 | 2 | list of them`) gets one error, not one per member:
    that of the member its shape is (a list, or a single value), and a single value that is no list says a list
    is allowed too — not "Input should be a valid list" beside "Input should be 1 or 2"."""
    kept: list[Any] = []
    for err in errors:
        loc = [str(part) for part in err["loc"]]
        tag = next((i for i, part in enumerate(loc) if _union_tag(part, err)), None)
        if tag is None:
            kept.append(err)
            continue
        siblings = [e for e in errors if [str(p) for p in e["loc"]][:tag] == loc[:tag]]
        inner = [e for e in siblings if len(e["loc"]) > tag + 1]  # inside a list member: the value was a list
        chosen = inner or [e for e in siblings if not e["type"].endswith("_type")] or siblings[:1]
        if err is not chosen[0]:
            continue
        if not inner and any(e["type"] == "list_type" for e in siblings) and err["type"] != "list_type":
            err = {**err, "msg": f"{err['msg']} (or a list of them)"}
        kept += [_as_item(e, tag) for e in (err, *chosen[1:])]
    return kept


def _as_item(err: Any, tag: int) -> Any:
    """An error inside a list member, keyed by the list the user wrote: `cycle.level: item 1: …`."""
    inside = err["loc"][tag + 1 :]
    if not inside or not isinstance(inside[0], int):
        return err
    return {**err, "loc": err["loc"][: tag + 1] + inside[1:], "msg": f"item {inside[0] + 1}: {err['msg']}"}


def _union_tag(part: str, err: Any) -> bool:
    """Whether a part of an error's location is the tag a union adds for its member ("literal[1,2]", "str")."""
    return err["type"] != "extra_forbidden" and ("[" in part or part in ("str", "int", "float", "bool"))


def _problem(err: Any) -> tuple[str, str]:
    # A union adds its member's tag to the location ("cycle.level.literal[1,2]"): the key is what users wrote.
    loc = ".".join(str(part) for part in err["loc"] if not _union_tag(str(part), err))
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        *parent, key = [str(p) for p in err["loc"]]
        allowed = allowed_keys(parent)
        msg = f"unknown key{did_you_mean(key, allowed)}"
    elif err["type"] == "missing":
        msg = "is required"
    if msg.startswith(("expect.", "cycle.", "variants.", "server.")):  # a model-level check already carries its key
        loc, msg = msg.split(": ", 1)
    return loc, msg
