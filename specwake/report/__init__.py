"""Every output format of finished runs, read from results only: the PR-comment Markdown (summary, with
details and cycles), JSON and stages.csv (frames), JUnit XML (junit), run-to-run comparison (compare) and the
PNG plot (plot). Nothing here talks to a server: a ruff rule (specwake/report/ruff.toml) bans those imports.
"""

from specwake.report.frames import STAGE_COLUMNS, render_csv, render_json, stages_frame
from specwake.report.summary import provenance_line, render_markdown, verdict_line
from specwake.results import ScenarioResult, to_json
from specwake.runfolder import REPORT_FILE, RESULT_FILE, STAGES_FILE


def run_files(result: ScenarioResult) -> dict[str, str]:
    """The files of one scenario's run folder, rendered: result.json, report.md, stages.csv."""
    return {RESULT_FILE: to_json(result), REPORT_FILE: render_markdown([result]), STAGES_FILE: render_csv([result])}


__all__ = [
    "STAGE_COLUMNS",
    "provenance_line",
    "render_csv",
    "render_json",
    "render_markdown",
    "run_files",
    "stages_frame",
    "verdict_line",
]
