"""The docs site builds with `mkdocs build --strict` (a broken link, a missing anchor or a page left
out of the nav fails), and the README stays a front page: short, its links landing on pages that exist."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_docs_site_builds_strictly(tmp_path):
    mkdocs = Path(sys.executable).with_name("mkdocs")
    done = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # The pages a newcomer looks for first are there, built.
    for page in ("getting-started", "workers/adding-hosts", "concepts/tau", "operations/faults"):
        assert (tmp_path / "site" / page / "index.html").is_file(), page


def test_the_readme_is_a_front_page_whose_links_land():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert "docs/getting-started.md" in targets and "docs/images/run-page.png" in targets
    assert [t for t in targets if not (REPO / t).exists()] == []
