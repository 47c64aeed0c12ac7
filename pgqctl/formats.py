"""The names of the output formats, apart from `output`, which renders them:
every listing's --format offers them, and `pgqctl --help` lists them, without
loading the renderers."""

from __future__ import annotations

FORMATS = ("auto", "table", "plain", "json", "ndjson", "csv", "tsv")
HUMAN_FORMATS = ("table", "plain")
