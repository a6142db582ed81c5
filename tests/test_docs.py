"""The README and the pages it links: short, linked right, and in step with the code.

A newcomer reads the README's first screen; the reference lives in docs/.
These stories check what can drift silently: a link to a page or heading
that is gone, a record field no page explains, a README grown past a few
screens, a paragraph said twice, a picture that is missing or heavy.
"""

from __future__ import annotations

import re

import pytest

from helpers import REPO
from jupyter_traincontrol.protocol.record import FIELDS

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        words = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower())
        found.add(words.strip().replace(" ", "-"))
    return found


def test_the_readme_is_a_few_screens_and_links_the_reference():
    text = README.read_text()
    assert len(text.splitlines()) < 400
    linked = {target.split("#")[0] for target in LINK.findall(text)}
    assert {f"docs/{page.name}" for page in DOCS} <= linked, "every docs/ page is linked from the README"
    for heading in ("## Install", "## Quickstart", "## What is supported", "## Troubleshooting"):
        assert heading in text
    # The first screen: the two commands, then the picture.
    first_screen = "\n".join(text.splitlines()[:40])
    assert "make lab" in first_screen and "make test" in first_screen and "docs/images/panel.png" in first_screen


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_link_points_at_a_page_and_heading_that_exist(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name} links {target}: no such file"
        if anchor:
            assert anchor in anchors(file.read_text()), f"{page.name} links {target}: no such heading"


def test_the_reference_explains_every_field_of_a_record():
    reference = (REPO / "docs" / "reference.md").read_text()
    table = reference[reference.index("### The record's fields"):]
    explained = set(re.findall(r"^\| `([a-z_]+)`", table, re.M)) | set(re.findall(r"`([a-z_]+)`, `", table))
    missing = set(FIELDS) - explained
    assert not missing, f"record fields docs/reference.md does not explain: {sorted(missing)}"


def test_nothing_is_said_twice_in_the_readme():
    paragraphs = [p.strip() for p in README.read_text().split("\n\n") if len(p.strip()) > 120]
    repeated = {p[:80] for p in paragraphs if paragraphs.count(p) > 1}
    assert not repeated
    assert README.read_text().count("Anything else written to the FIFO") == 1


def test_the_readme_picture_is_a_small_png():
    picture = REPO / "docs" / "images" / "panel.png"
    data = picture.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 200_000
