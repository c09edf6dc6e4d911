"""The docs are reference: every link and cited heading resolves, nothing dates the work.

Checked over README.md and docs/*.md (links, anchors, repository paths) and over every tracked
text file (citations of a doc's heading such as `docs/cpu-backend.md, "CPU linears"`, and words that
name the order or dates of the work, people's roles or issue numbers). Pure text checks: no model,
no torch.
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TEXT_SUFFIXES = (".py", ".c", ".h", ".md", ".sh", ".yaml", ".yml", ".toml", ".service", ".socket")

MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:edge_runtime|kernels|quant|tools|configs|tests|docs|systemd)/[\w./-]*\w)"
)
# `docs/cpu-backend.md, "CPU linears"` or `cpu-backend.md "CPU linears"`; the quote may wrap over comment lines.
HEADING_CITATION = re.compile(r"((?:docs/)?[\w-]+\.md),?\s+\"([^\"]+)\"")
MD_FILE_MENTION = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.md)\b")
ORDINAL_SESSION = re.compile(
    r"(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
    r"|thirteenth|fourteenth|[0-9]+(st|nd|rd|th)) session",
    re.IGNORECASE,
)
ROLE_WORDS = re.compile(r"\bengineers?\b", re.IGNORECASE)  # a part labelled with who built it
ISSUE_NUMBER = re.compile(r"\bissues? #?[0-9]+", re.IGNORECASE)
DATE_OF_WORK = re.compile(r"\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b|\b[0-2][0-9]:[0-5][0-9] UTC\b")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / n for n in names if n.endswith(TEXT_SUFFIXES) and (ROOT / n).is_file()]


def headings(markdown: Path) -> list[str]:
    """The document's headings, outside fenced code blocks."""
    found, fenced = [], False
    for line in markdown.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.append(line.lstrip("#").strip())
    return found


def github_anchor(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.lower())
    return text.replace(" ", "-")


def anchors(markdown: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for heading in headings(markdown):
        base = github_anchor(heading)
        count = seen.get(base, 0)
        result.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return result


def resolve_doc(name: str) -> Path | None:
    for candidate in (ROOT / name, ROOT / "docs" / name):
        if candidate.is_file():
            return candidate
    return None


def prose(markdown_text: str) -> str:
    """The text with fenced blocks and inline code blanked out (same offsets), where links live."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    text = re.sub(r"^```.*?^```", blank, markdown_text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", blank, text)


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def test_markdown_links_resolve_to_files_and_headings():
    broken = []
    for doc in DOCS:
        text = doc.read_text()
        for match in MARKDOWN_LINK.finditer(prose(text)):
            target = match.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path_part, _, anchor = target.partition("#")
            path = (doc.parent / path_part).resolve() if path_part else doc
            where = f"{doc.relative_to(ROOT)}:{line_of(text, match.start())}: {target}"
            if not path.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{where} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_repository_paths_named_in_docs_exist():
    missing = []
    for doc in DOCS:
        text = doc.read_text()
        for match in REPO_PATH.finditer(text):
            if text[match.end() : match.end() + 1] == "*":
                continue  # a glob such as tests/test_engine*.py
            if not (ROOT / match.group(1)).exists():
                where = f"{doc.relative_to(ROOT)}:{line_of(text, match.start())}"
                missing.append(f"{where}: {match.group(1)}")
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def test_cited_doc_headings_exist():
    """A citation names a heading, or the start of one, of a doc in the repository."""
    broken = []
    for path in tracked_text_files():
        text = path.read_text(errors="replace")
        for match in HEADING_CITATION.finditer(text):
            doc = resolve_doc(match.group(1))
            cited = re.sub(r"[\s*#/]+", " ", match.group(2)).strip().rstrip(".").lower()
            where = f"{path.relative_to(ROOT)}:{line_of(text, match.start())}"
            if doc is None:
                broken.append(f'{where}: {match.group(1)} (no such doc)')
            elif not any(h.lower().startswith(cited) for h in headings(doc)):
                broken.append(f'{where}: {match.group(1)} "{cited}" (no such heading)')
    assert not broken, "citations of missing doc headings:\n" + "\n".join(broken)


def test_cited_docs_exist():
    missing = []
    for path in tracked_text_files():
        text = path.read_text(errors="replace")
        for match in MD_FILE_MENTION.finditer(text):
            name = match.group(1)
            if name.startswith("research/") or resolve_doc(name) is not None:
                continue
            if path.parent != ROOT and (path.parent / name).is_file():
                continue
            missing.append(f"{path.relative_to(ROOT)}:{line_of(text, match.start())}: {name}")
    assert not missing, "docs cited that are not in the repository:\n" + "\n".join(missing)


@pytest.mark.parametrize("pattern", [ORDINAL_SESSION, ROLE_WORDS, ISSUE_NUMBER, DATE_OF_WORK],
                         ids=["ordinal-session", "role-words", "issue-number", "date"])
def test_nothing_names_the_order_of_the_work_or_who_did_it(pattern):
    hits = []
    for path in tracked_text_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not hits, "words that name the order of the work, a role or an issue:\n" + "\n".join(hits)


def test_perf_doc_holds_current_numbers_not_a_log():
    """One table per benchmark, the newest measurement of each; the history is git's."""
    lines = (ROOT / "docs" / "perf.md").read_text().splitlines()
    assert len(lines) < 400, f"docs/perf.md has {len(lines)} lines: replace old numbers, do not add"
    assert not list((ROOT / "docs").glob("*.json")), "raw results belong outside docs/"
