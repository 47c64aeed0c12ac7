"""The docs build as a site, and a link that leads nowhere fails the build."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of the project at `root`, into `site`."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_docs_build_without_a_warning(tmp_path: Path) -> None:
    result = build(ROOT, tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "WARNING" not in output, output
    assert (tmp_path / "site" / "commands" / "worker" / "index.html").is_file()


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "project"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", copy / "docs")
    for name, link in [("anchor", "../reference.md#pgqctl-no-such"), ("page", "no-such.md")]:
        page = copy / "docs" / "commands" / "worker.md"
        original = page.read_text(encoding="utf-8")
        page.write_text(original + f"\n[nowhere]({link})\n", encoding="utf-8")
        result = build(copy, tmp_path / f"site-{name}")
        page.write_text(original, encoding="utf-8")
        output = result.stdout + result.stderr
        assert result.returncode != 0, f"a broken {name} link built: {output}"
        assert link.split("#")[-1] in output, output
