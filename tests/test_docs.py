"""The docs as `make docs` builds them: mkdocs --strict with no warning (a broken link or #anchor
between pages fails it), and the links mkdocs does not see, in the Markdown files outside docs/
(README.md, ARCHITECTURE.md, ...), resolve on GitHub: the file is there, and so is the heading an
#anchor names. Paths in `code` on the pages name files of the repository that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO

DOCS = REPO / "docs"
# Read on GitHub, not by mkdocs.
OUTSIDE = ["README.md", "ARCHITECTURE.md", "SECURITY.md", "jobs/README.md"]
FENCED = re.compile(r"^ *(`{3,}).*?^ *\1", re.S | re.M)
CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)
# The first word of a fenced block that was not read as one: its language, left in an inline <code>.
LANGUAGE = re.compile(r"(?:text|yaml|yml|bash|sh|shell|console|python|json|toml|ini|promql)\s*\n")
REPO_PATH = re.compile(r"(?<![\w/$~.-])(?:orchestrator|tests|jobs|bench|inventory|docker|docs)/(?:[\w-]+[./]?)*")


def prose(text: str) -> str:
    """The text without its code blocks and code spans, where brackets are not links."""
    return CODE.sub("", FENCED.sub("", text))


def github_anchors(path: Path) -> set[str]:
    """The #anchors GitHub gives a Markdown file's headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    for heading in HEADING.findall(FENCED.sub("", path.read_text(encoding="utf-8"))):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def broken_links(path: Path) -> list[str]:
    """The relative links of a Markdown file whose file or #anchor is not there."""
    broken = []
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue
        name, _, anchor = target.partition("#")
        dest = (path.parent / name).resolve() if name else path
        if not dest.exists() or (anchor and (dest.suffix != ".md" or anchor not in github_anchors(dest))):
            broken.append(f"{path.name}: {target}")
    return broken


def markdown_outside_docs() -> list[Path]:
    return [REPO / name for name in OUTSIDE if (REPO / name).exists()]


def test_the_docs_build_with_strict_and_no_warning(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)

    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr
    assert {page.stem for page in DOCS.glob("*.md")} <= {page.stem for page in site.glob("*.html")}


class CodeSpans(HTMLParser):
    """A page's <code> elements: the text of each, and whether it sits in a <pre> (a block)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list[str] = []
        self.inline: list[str] = []
        self._pre = 0
        self._code: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self._pre += tag == "pre"
        if tag == "code":
            self._code = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "code" and self._code is not None:
            (self.blocks if self._pre else self.inline).append("".join(self._code))
            self._code = None
        self._pre -= tag == "pre"

    def handle_data(self, data: str) -> None:
        if self._code is not None:
            self._code.append(data)


def fenced_blocks(page: Path) -> int:
    return len(FENCED.findall(page.read_text(encoding="utf-8")))


def test_every_fenced_block_renders_as_a_block_and_none_as_inline_code(tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=REPO,
                   capture_output=True, text=True, timeout=120, check=True)

    wrong = {}
    for page in sorted(DOCS.glob("*.md")):
        spans = CodeSpans()
        spans.feed((site / f"{page.stem}.html").read_text(encoding="utf-8"))
        as_inline = [text[:40] for text in spans.inline if LANGUAGE.match(text)]
        if as_inline or len(spans.blocks) != fenced_blocks(page):
            wrong[page.name] = (len(spans.blocks), fenced_blocks(page), as_inline)
    assert wrong == {}


def test_a_strict_build_with_our_validation_fails_on_a_link_to_a_missing_anchor(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[there](other.md#nowhere)\n")
    (docs / "other.md").write_text("# Other\n")
    ours = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    config = {key: ours[key] for key in ("site_name", "theme", "validation")}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))

    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)

    assert done.returncode != 0 and "does not contain an anchor '#nowhere'" in done.stderr, done.stderr


@pytest.mark.parametrize("path", [*markdown_outside_docs(), *sorted(DOCS.glob("*.md"))],
                         ids=lambda path: str(path.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves_on_github(path: Path) -> None:
    assert broken_links(path) == []


def test_the_link_check_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## What `sync` sends\n\n[a](#what-sync-sends) [b](#nope) [c](gone.md) "
                    "[d](https://example.org) `[e](gone.md)`\n")

    assert [line.split(": ")[1] for line in broken_links(page)] == ["#nope", "gone.md"]


def test_the_repository_paths_the_pages_name_exist() -> None:
    named = {(page.relative_to(REPO), path.split("::")[0])
             for page in [*markdown_outside_docs(), *DOCS.glob("*.md")]
             for span in CODE.findall(page.read_text(encoding="utf-8"))
             for path in REPO_PATH.findall(span) if re.fullmatch(r"[^\s<*]+", span.split("::")[0])}

    assert sorted((str(page), path) for page, path in named if not (REPO / path).exists()) == []
