"""Reports: records of every comparison, stored as JSON, rendered to Markdown and HTML.

``schema`` is the stored form, ``environment`` the provenance a report carries,
``compare`` what moved between two reports, ``markdown`` and ``html`` the renderings.
Nothing here imports a vendor package, and matplotlib loads only inside ``render_html``.
"""

from mxcheck.report.compare import (
    DEFAULT_MAX_DROP_DB,
    Change,
    Comparison,
    compare,
    compare_files,
    format_comparison,
)
from mxcheck.report.environment import collect_environment
from mxcheck.report.html import render_html
from mxcheck.report.markdown import render_markdown
from mxcheck.report.schema import DIRECTIONS, SCHEMA_VERSION, Record, Report, ReportError

__all__ = [
    "DEFAULT_MAX_DROP_DB",
    "DIRECTIONS",
    "SCHEMA_VERSION",
    "Change",
    "Comparison",
    "Record",
    "Report",
    "ReportError",
    "collect_environment",
    "compare",
    "compare_files",
    "format_comparison",
    "render_html",
    "render_markdown",
]
