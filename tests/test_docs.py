"""The documentation stays true to the tree and the command line: README.md stays a newcomer's page,
every relative link and anchor of README.md, ARCHITECTURE.md and docs/ resolves, every option of every
command is documented in docs/ (and the option tables there name only options that exist), and CI
runs README's test command as written."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from amp_compiler.cli.app import build_parser
from amp_compiler.cli.compare import CompareCommand
from amp_compiler.cli.convert import ConvertCommand
from amp_compiler.cli.report import ReportCommand
from tests.support import REPO_ROOT

README_MAX_LINES = 200
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
TABLE_OPTION = re.compile(r"^\|\s*`(--[a-z0-9-]+)")


def _docs() -> list[Path]:
    return [REPO_ROOT / "README.md", REPO_ROOT / "ARCHITECTURE.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _without_code_blocks(path.read_text()).splitlines():
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def _options() -> set[str]:
    parser = build_parser([ConvertCommand(), ReportCommand(), CompareCommand()])
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    found = set()
    for sub in subparsers.values():
        found.update(o for a in sub._actions for o in a.option_strings if o.startswith("--") and o != "--help")
    return found


def test_readme_is_a_newcomers_page():
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move detail to docs/"


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for doc in _docs():
        for target in LINK.findall(_without_code_blocks(doc.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file_part, _, anchor = target.partition("#")
            linked = (doc.parent / file_part).resolve() if file_part else doc
            if not linked.exists():
                broken.append(f"{doc.relative_to(REPO_ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{doc.relative_to(REPO_ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_slug_follows_githubs_rules():
    assert slug("FP8 (`--target fp8`) vs ModelOpt 0.47's FP8 output") == "fp8---target-fp8-vs-modelopt-047s-fp8-output"
    assert slug("Graph inputs: shapes and ranges") == "graph-inputs-shapes-and-ranges"
    assert slug("`--tolerance REL_L2`") == "--tolerance-rel_l2"


def test_every_command_line_option_is_documented():
    text = "".join(p.read_text() for p in sorted((REPO_ROOT / "docs").glob("*.md")))
    missing = sorted(o for o in _options() if not re.search(re.escape(o) + r"(?![a-z0-9-])", text))
    assert missing == [], f"options no page of docs/ describes: {missing}"


def test_option_tables_name_only_options_that_exist():
    options = _options()
    unknown = []
    for page in sorted((REPO_ROOT / "docs").glob("*.md")):
        for line in page.read_text().splitlines():
            m = TABLE_OPTION.match(line)
            if m and m.group(1) not in options:
                unknown.append(f"{page.name}: {m.group(1)}")
    assert unknown == []


def test_ci_runs_the_readme_test_command():
    """``.ci/run`` runs the line after ``# 2. `` of README's set-up block, which must be the test command."""
    readme = (REPO_ROOT / "README.md").read_text().splitlines()
    marker = next(i for i, line in enumerate(readme) if line.startswith("# 2. "))
    command = readme[marker + 1]
    assert 'pip install -e ".[test]"' in command and 'python -m pytest -m "not slow"' in command
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert 'test_command="$(readme_command 2)"' in ci and 'eval "$test_command"' in ci
