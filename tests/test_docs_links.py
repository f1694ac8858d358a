"""The project's docs point where they say: every relative Markdown link in README.md and
docs/*.md reaches a file (and, with a #fragment, a heading of it), and every `docs/NAME.md`
named in the package, the benchmarks, the configs or the docs exists. Docs get split and
renamed; a stale pointer is found here rather than by a reader."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKDOWN = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
DOC_NAME = re.compile(r"\bdocs/[\w./-]+?\.md\b")


def heading_slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation other than hyphens
    and underscores dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(path: Path) -> set[str]:
    """The anchors of `path`'s headings (lines in fenced code blocks are not headings);
    read once per file, however many links point into it."""
    in_code = False
    out = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            out.add(heading_slug(line.lstrip("#")))
    return out


def test_heading_slug_follows_githubs_rule():
    assert heading_slug(" Performance (CPU, `python benchmarks/sampler.py`)") == "performance-cpu-python-benchmarkssamplerpy"
    assert heading_slug("4. One iteration") == "4-one-iteration"


@pytest.mark.parametrize("doc", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_a_file_and_heading(doc):
    broken = []
    for link in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", link):  # http:, https:, mailto:
            continue
        path, _, fragment = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif fragment and target.suffix == ".md" and fragment not in anchors(target):
            broken.append(f"{link}: no heading #{fragment} in {target.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_named_docs_exist():
    sources = [*MARKDOWN, *ROOT.glob("sgs_jax/**/*.py"), *ROOT.glob("benchmarks/*.py"), *ROOT.glob("configs/**/*.py")]
    missing = sorted({f"{src.relative_to(ROOT)}: {name}" for src in sources
                      for name in DOC_NAME.findall(src.read_text(encoding="utf-8")) if not (ROOT / name).exists()})
    assert not missing, missing
