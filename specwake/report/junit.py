"""JUnit XML of scenario results for CI dashboards (GitHub, Jenkins, Buildkite, GitLab).

testsuites > testsuite per scenario > testcase per variant; built with ElementTree, written atomically.

A variant whose outcome matches its expectation passes. A measured outcome that does not match is a
<failure> ("expected recover, got collapse") carrying the AL chain and per-stage tok/s medians. A
variant that never became ready (`error`), crashed unexpectedly, or is unfinished is an <error>
whose `type` is its crash class. Characters XML 1.0 cannot hold (ANSI escapes in logs) are shown
as `\\xNN`.
"""

from __future__ import annotations

import datetime as dt
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from specwake.errors import ResultsUnwritable
from specwake.files import write_atomic
from specwake.judge.verdict import NOT_TESTED, outcome_matches, recorded_tolerance
from specwake.report.columns import junit_line
from specwake.report.explain import explain
from specwake.report.nights import moment
from specwake.results import INCOMPLETE, ScenarioResult, VariantResult

MESSAGE_MAX = 300  # characters of an attribute message; the full text goes in the element body
# Characters outside XML 1.0's Char production (controls other than tab/newline/CR, surrogates, U+FFFE/F).
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_safe(text: str) -> str:
    """Text any XML parser accepts: invalid characters become a visible `\\xNN` / `\\uNNNN`."""

    def escape(match: re.Match[str]) -> str:
        code = ord(match.group())
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return _INVALID_XML.sub(escape, text)


def _seconds(value: float) -> str:
    return f"{max(value, 0.0):.3f}"


def _body(variant: VariantResult, tolerance: float, *, with_log: bool) -> str:
    lines = [f"{variant.name}: {variant.outcome} (expected {variant.expected})", explain(variant, tolerance)]
    lines += [junit_line(s) for s in variant.stages] or ["no stage measured"]
    if variant.error:
        lines += ["", "error:", variant.error.rstrip("\n")]
    if with_log and variant.log_excerpt:
        lines += ["", f"log excerpt ({variant.log_path or 'log'}):", variant.log_excerpt.rstrip("\n")]
    return _xml_safe("\n".join(lines) + "\n")


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MESSAGE_MAX else line[: MESSAGE_MAX - 1] + "…"


def _error_class(variant: VariantResult) -> str:
    if variant.outcome == INCOMPLETE:
        return "incomplete"
    default = {"error": "startup_failed", "untested": "sleep_ignored"}.get(variant.outcome, "unknown")
    return variant.crash_class or default


def passed(variant: VariantResult) -> bool:
    """A variant passes when it met its expectation with no finding, and was tested and finished."""
    return variant.matched and variant.outcome not in (*NOT_TESTED, INCOMPLETE)


def variant_text(variant: VariantResult, tolerance: float) -> str:
    """What a failed variant says in CI: its verdict line, why, its stages, its error and log excerpt."""
    return _body(variant, tolerance, with_log=True)


def _problem(variant: VariantResult, tolerance: float) -> ET.Element | None:
    """The <failure>, <error> or <skipped> child of a variant's testcase; None when it passed."""
    if passed(variant):
        return None
    if variant.outcome == INCOMPLETE:  # the run was interrupted (or is still going) before this variant finished
        element = ET.Element("skipped", type="not_run" if variant.not_run else "incomplete")
        measured = f"; {len(variant.stages)} stage(s) measured before it stopped" if variant.stages else ""
        if variant.not_run:
            element.set("message", "not run: nothing recorded before the run was interrupted")
        else:
            element.set("message", f"not run to the end: the run was interrupted{measured}")
        element.text = _body(variant, tolerance, with_log=False)
        return element
    if variant.outcome in (*NOT_TESTED, "crash"):
        cls = _error_class(variant)
        element = ET.Element("error", type=cls)
        element.set("message", _xml_safe(_short(f"{variant.outcome} ({cls}): {explain(variant, tolerance)}")))
        element.text = _body(variant, tolerance, with_log=True)
        return element
    if variant.findings and outcome_matches(variant.outcome, variant.expected):
        element = ET.Element("failure", type="finding")
        element.set("message", _xml_safe(_short(variant.findings[0])))
    else:
        element = ET.Element("failure", type="outcome_mismatch")
        element.set("message", _xml_safe(_short(f"expected {variant.expected}, got {variant.outcome}")))
    element.text = _body(variant, tolerance, with_log=False)
    return element


def _testcase(result: ScenarioResult, variant: VariantResult, tolerance: float) -> ET.Element:
    case = ET.Element("testcase", classname=f"specwake.{_xml_safe(result.name)}")
    case.set("name", _xml_safe(variant.name))
    case.set("time", _seconds(variant.seconds))
    problem = _problem(variant, tolerance)
    if problem is not None:
        case.append(problem)  # its text carries the details
    else:
        out = ET.SubElement(case, "system-out")
        out.text = _body(variant, tolerance, with_log=False)
    return case


def _properties(result: ScenarioResult) -> ET.Element:
    props = ET.Element("properties")
    values = {
        "verdict": result.verdict,
        "scenario_sha256": result.scenario.get("sha256"),
        "scenario_file": result.scenario.get("file"),
        "specwake_version": result.specwake_version,
        "complete": str(result.complete).lower(),
    }
    for variant in result.variants:
        values[f"{variant.name}.vllm_version"] = variant.vllm_version
        values[f"{variant.name}.l2_discard"] = variant.l2_discard
    for name, value in values.items():
        if value is not None:
            ET.SubElement(props, "property", name=_xml_safe(name), value=_xml_safe(str(value)))
    return props


def _count(cases: Sequence[ET.Element], tag: str) -> int:
    return sum(1 for case in cases if case.find(tag) is not None)


def _set_counts(element: ET.Element, cases: Sequence[ET.Element], seconds: float) -> None:
    element.set("tests", str(len(cases)))
    element.set("failures", str(_count(cases, "failure")))
    element.set("errors", str(_count(cases, "error")))
    element.set("skipped", str(_count(cases, "skipped")))
    element.set("time", _seconds(seconds))


def _wall(results: Sequence[ScenarioResult]) -> float:
    """Seconds from the first scenario's start to the last one's end (now, for one still unfinished): a suite's
    time is the wall time of its run, not the sum of its variants, which ran side by side or packed."""
    starts = [m for m in (moment(r.started_at) for r in results) if m is not None]
    now = dt.datetime.now(dt.timezone.utc)
    ends = [moment(r.finished_at) or now for r in results]
    if not starts:
        return sum(v.seconds for r in results for v in r.variants)
    return max((max(ends) - min(starts)).total_seconds(), 0.0)


def _testsuite(result: ScenarioResult) -> tuple[ET.Element, list[ET.Element]]:
    tolerance = recorded_tolerance(result)
    suite = ET.Element("testsuite", name=_xml_safe(result.name))
    cases = [_testcase(result, v, tolerance) for v in result.variants]
    _set_counts(suite, cases, _wall([result]))
    suite.set("timestamp", _xml_safe(result.started_at))
    hostname = result.host.get("hostname")
    if hostname:
        suite.set("hostname", _xml_safe(str(hostname)))
    suite.append(_properties(result))
    suite.extend(cases)
    return suite, cases


def render_junit(results: Sequence[ScenarioResult]) -> str:
    """The JUnit XML document (with its XML declaration) for one or more scenario results."""
    root = ET.Element("testsuites", name="specwake")
    all_cases: list[ET.Element] = []
    for result in results:
        suite, cases = _testsuite(result)
        root.append(suite)
        all_cases += cases
    _set_counts(root, all_cases, _wall(results))
    del root.attrib["skipped"]  # not part of the <testsuites> element in the common schema
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True).decode("utf-8") + "\n"


def write_junit(path: Path, results: Sequence[ScenarioResult]) -> None:
    """Write render_junit(results) to `path` atomically (temp file + rename; parents created).

    Raises ResultsUnwritable naming the path when it cannot be written.
    """
    try:
        write_atomic(Path(path), render_junit(results))
    except OSError as exc:
        raise ResultsUnwritable(f"{path}: cannot write JUnit XML: {exc}") from exc
