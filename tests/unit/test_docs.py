"""The docs site builds strictly (a broken link or anchor, a page missing from the nav, any warning fails), and
the README's links into docs/ name pages that exist."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_docs_site_builds_strictly_with_no_warning(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    log = proc.stdout + proc.stderr
    assert "No module named mkdocs" not in log, "mkdocs is missing: pip install -e '.[docs]' (the test extra has it)"
    assert proc.returncode == 0 and "WARNING" not in log, f"make docs fails:\n{log}"
    assert (tmp_path / "site" / "index.html").is_file()


def _relative_links(text: str) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:|#", t)]


def test_readme_links_name_files_that_exist():
    readme = (ROOT / "README.md").read_text()
    links = _relative_links(readme)
    assert any(link.startswith("docs/") for link in links), "the README links into docs/"
    missing = [link for link in links if not (ROOT / link.split("#")[0]).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert [p for p in pages if p not in nav] == [], "add the page to mkdocs.yml's nav"
