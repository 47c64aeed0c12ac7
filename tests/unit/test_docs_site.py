"""The docs build as a site, and a link that leads nowhere fails the build."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `mkdocs build --strict` makes it; the build must not warn."""
    site = tmp_path_factory.mktemp("docs") / "site"
    result = build(ROOT, site)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "WARNING" not in output, output
    return site


def test_the_docs_build_without_a_warning(site: Path) -> None:
    assert (site / "commands" / "worker" / "index.html").is_file()
    assert (site / "reference" / "index.html").is_file()


def test_the_readme_links_lead_somewhere(site: Path) -> None:
    """README.md is outside the site: its links into docs/ are checked here,
    against the pages and anchors of the built site."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in local)
    for link in local:
        target, _, anchor = link.partition("#")
        assert target, f"README.md links to #{anchor}, but its sections moved to docs/"
        assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"
        if not anchor:
            continue
        assert target.startswith("docs/") and target.endswith(".md"), link
        page = Path(target).relative_to("docs").with_suffix("")
        html = site / (page.parent if page.name == "index" else page) / "index.html"
        assert f'id="{anchor}"' in html.read_text(encoding="utf-8"), (
            f"README.md links to {link}, but {target} has no such anchor"
        )


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


# A docs page named in a message, a --help or a comment, with the section
# after it when one follows on the same line: "see docs/operating.md, Roles".
NAMED = re.compile(r"\bdocs/([\w/-]+\.md)(?:[,:] (\w[\w \"'-]*))?")


def named_pages() -> list[tuple[str, str, str]]:
    found = []
    for top in ("pgqctl", "deploy", "bench"):
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or path.suffix not in {".py", ".md", ".toml", ".yaml", ""}:
                continue
            if any(part.startswith(".") for part in path.relative_to(ROOT).parts):
                continue  # a virtualenv (bench/.venv) holds other projects' files
            text = path.read_text(encoding="utf-8", errors="replace")
            for match in NAMED.finditer(text):
                where = path.relative_to(ROOT).as_posix()
                found.append((where, match.group(1), (match.group(2) or "").strip(" \"'")))
    return found


def test_the_code_names_docs_pages_and_sections_that_exist() -> None:
    named = named_pages()
    assert named, "nothing in pgqctl/, deploy/ or bench/ names a docs page"
    for where, page, section in named:
        path = ROOT / "docs" / page
        assert path.is_file(), f"{where} names docs/{page}, which does not exist"
        if not section:
            continue
        titles = [
            line.lstrip("#").strip().lower()
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.startswith("#")
        ]
        assert any(title.startswith(section.lower()) for title in titles), (
            f"{where} names the section {section!r} of docs/{page}, which has no such heading"
        )
