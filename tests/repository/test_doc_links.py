"""Every relative link and anchor in README.md, docs/ and results/*/README.md resolves.

A link's target must exist (file or directory, relative to the linking file); a ``#anchor`` must be the
GitHub slug of a heading in the target Markdown file (or in the linking file for ``#anchor`` alone). Links
inside fenced code blocks and to other schemes (``https:``, ``mailto:``) are not checked.
"""

from __future__ import annotations

import pathlib
import re

import pytest

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def markdown_files() -> list[pathlib.Path]:
  files = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]
  return files + sorted((REPOSITORY / "results").glob("*/README.md"))


def github_slug(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
  text = re.sub(r"`|\*|_(?=\w)|\[|\]\([^)]*\)", "", heading.strip().lower())
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
  text = FENCE.sub("", path.read_text(encoding="utf-8"))
  return {github_slug(heading) for heading in HEADING.findall(text)}


def test_the_slug_rule_on_headings_of_this_repository():
  assert github_slug("What a run's bits depend on") == "what-a-runs-bits-depend-on"
  assert github_slug("Claims at a glance") == "claims-at-a-glance"
  assert github_slug("On a `gs://` workdir") == "on-a-gs-workdir"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda path: str(path.relative_to(REPOSITORY)))
def test_every_relative_link_and_anchor_resolves(path):
  text = FENCE.sub("", path.read_text(encoding="utf-8"))
  broken = []
  for target in LINK.findall(text):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):
      continue
    file_part, _, anchor = target.partition("#")
    resolved = (path.parent / file_part).resolve() if file_part else path
    if not resolved.exists():
      broken.append(f"{target}: {resolved} does not exist")
    elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
      broken.append(f"{target}: no heading with anchor #{anchor} in {resolved.name}")
  assert not broken, "\n".join(broken)
