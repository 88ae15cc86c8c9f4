"""The documents hold to the repository: every relative link and #anchor resolves, every repository path quoted
in backticks exists, every `python -m ... --flag` quoted is an option of that command's own parser, every docs
page (and #anchor) that code, configuration or a comment cites exists, every result folder is listed in
docs/results/README.md, and README.md with the pages (results apart) stays short enough to read."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"
RESULTS_INDEX = RESULTS / "README.md"
MAX_PAGE_WORDS = 15_000  # README.md and docs/*.md together, results apart: what a newcomer can read in an afternoon
# a bare name with one of these is ours (a .yaml or .json may be something a command writes)
SOURCE_EXTENSIONS = (".py", ".toml", ".sh", ".cfg")
COMMANDS = {"export": "export.cli", "serving": "serving.cli", "measure": "measure.cli"}

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
COMMAND = re.compile(r"python3? -m (export|serving|measure)\b([^`#|;&()\n]*(?:\\\n[^`#|;&()\n]*)*)")
MAKE = re.compile(r"(?:^|&&|;|#)[ \t]*make ([a-z][\w-]*)", re.MULTILINE)  # a command, not "please make sure"
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_-]*(\.[a-z]+)?$|[<>{}*\[\]$]")
# Statuses a result folder disproves: (what no page may say any more, the folder that shows otherwise). A page that
# restates a status instead of linking the result goes stale when the result lands.
DISPROVED = (
    (re.compile(r"no GPU (?:path )?has (?:yet )?(?:been )?(?:run|executed)|no GPU in this session|"
                r"no session (?:so far )?has (?:had|been lent) (?:a GPU|one)|"
                r"(?:never|not yet|not) (?:been )?(?:run|ran|executed|measured) on a GPU", re.IGNORECASE),
     "docs/results/2026-11-26-gpu-check-h200"),
    (re.compile(r"(?:image|Docker) (?:was|has) never (?:been )?built|never built (?:the|an?) (?:Docker )?image",
                re.IGNORECASE), "docs/results/2026-11-26-docker-build-and-run"),
)


def documents() -> list[Path]:
    """README.md and every Markdown file under docs/, results included."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def pages() -> list[Path]:
    """docs/*.md: the pages a reader reads, results apart."""
    return sorted(DOCS.glob("*.md"))


def code_of(text: str) -> str:
    """The fenced blocks and inline code spans alone: where a command is quoted, not prose ("make sure")."""
    fenced = [match.group(0) for match in FENCE.finditer(text)]
    return "\n".join(fenced + [match.group(2) for match in INLINE_CODE.finditer(FENCE.sub("", text))])


def without_code(text: str) -> str:
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text without markup, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays, its target goes
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path) -> Iterator[str]:
    for match in LINK.finditer(without_code(path.read_text())):
        target = match.group(1) or match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            yield f"{target}: no such file"
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            yield f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}"


def tracked_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line for line in listed.splitlines() if (ROOT / line).exists()]


def quoted_paths(path: Path) -> Iterator[str]:
    """Backticked single words that name something in the repository: under a tracked top-level folder, or a bare
    source file name. Placeholders (NAME, <arch>, globs) and what commands write elsewhere are not ours."""
    text = FENCE.sub("", path.read_text())
    for match in INLINE_CODE.finditer(text):
        word = match.group(2).strip()
        if " " in word or "://" in word or word.startswith(("/", "-", "~", ".")):
            continue
        if "/" in word or word.endswith(SOURCE_EXTENSIONS):
            yield word


def ignored(path: str) -> bool:
    """What git ignores (model-store/*.mar, artifacts/): written by commands, not kept in the repository."""
    return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0


def missing_paths(path: Path, tracked: list[str]) -> Iterator[str]:
    top = {name.split("/", 1)[0] for name in tracked if "/" in name}
    names = {name.rsplit("/", 1)[-1] for name in tracked}
    for word in quoted_paths(path):
        bare = re.split(r":(?!//)", word, maxsplit=1)[0].rstrip("/")  # path:function, path:line
        parts = bare.split("/")
        if any(PLACEHOLDER.search(part) for part in parts) or "|" in bare:
            continue
        if len(parts) == 1:
            if bare.endswith(SOURCE_EXTENSIONS) and bare not in names:
                yield word
        elif parts[0] in top and not (ROOT / bare).exists() and not ignored(bare):
            yield word


def quoted_commands(path: Path) -> Iterator[tuple[str, list[str]]]:
    """(package, words) for each `python -m PKG ...` quoted in prose or in a code block."""
    for package, rest in COMMAND.findall(path.read_text()):
        rest = rest.replace("\\\n", " ")
        try:
            words = shlex.split(rest.replace("[", " ").replace("]", " "))
        except ValueError:
            words = rest.replace("[", " ").replace("]", " ").split()
        yield package, words


def help_argv(words: list[str]) -> list[str]:
    """The words that choose the parser (subcommands, --engine), then --help: that parser's options."""
    leading = []
    for word in words:
        if word.startswith("-"):
            break
        leading.append(word.split("|")[0])
    engine = []
    if "--engine" in words and words.index("--engine") + 1 < len(words):
        engine = ["--engine", words[words.index("--engine") + 1].split("|")[0]]
    return [*leading, *engine, "--help"]


class Shown(BaseException):  # not an error: run_command must let it through
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def options_of(package: str, argv: list[str]) -> set[str] | None:
    """The option strings of the parser that answers `python -m PACKAGE ARGV --help`, built by the command's own
    code (the help is caught before it prints); None when no argparse parser answers (gpu-check prints its doc)."""
    import importlib

    module = importlib.import_module(COMMANDS[package])

    def caught(parser: argparse.ArgumentParser, file=None) -> None:
        raise Shown(parser)

    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()):
        patch.setattr(argparse.ArgumentParser, "print_help", caught)
        try:
            module.main(argv)
        except Shown as shown:
            return set(shown.parser._option_string_actions)
        except SystemExit:
            pass
    return None


def choices(package: str) -> list[list[str]]:
    """The words that choose each of a package's parsers."""
    if package == "serving":
        from serving import engine

        return [["--engine", name] for name in engine.names()]
    if package == "measure":
        from measure.cli import COMMANDS as MEASUREMENTS

        return [[name] for name in MEASUREMENTS]
    from export.cli import build_parser

    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    return [[name] for name in commands.choices]


def unknown_flags(path: Path) -> Iterator[str]:
    for package, words in quoted_commands(path):
        flags = {word.split("=")[0] for word in words if re.match(r"^--?[a-zA-Z]", word)}
        if not flags:
            continue
        argv = help_argv(words)
        if any(word == "..." or PLACEHOLDER.search(word) for word in argv[:-1]):  # COMMAND, FAMILY, ...: any of them
            options = set().union(*(options_of(package, [*choice, "--help"]) or set() for choice in choices(package)))
        else:
            options = options_of(package, argv)
        quoted = f"python -m {package} {' '.join(words)}".strip()
        if options is None:
            yield f"{quoted}: no parser answers `python -m {package} {' '.join(argv)}`"
            continue
        yield from (f"{quoted}: {flag} is not an option" for flag in sorted(flags - options))


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", documents(), ids=relative)
def test_links_and_anchors_resolve(path):
    assert list(broken_links(path)) == []


def test_backticked_repository_paths_exist():
    tracked = tracked_files()
    missing = {relative(path): found for path in documents() if (found := list(missing_paths(path, tracked)))}
    assert missing == {}


def test_quoted_command_flags_exist():
    unknown = {relative(path): found for path in [ROOT / "README.md", *pages()] if (found := list(unknown_flags(path)))}
    assert unknown == {}


# A docs path as code cites it, with its #anchor when it names one: docs/PAGE.md#heading, docs/results/DATE-WHAT/.
CITED_DOC = re.compile(r"docs/[\w./-]+(?:#[\w-]+)?")


def cited_docs_in(text: str) -> Iterator[str]:
    """The docs paths (and anchors) text cites that do not resolve: no such file, or no such heading in the page."""
    for cited in CITED_DOC.findall(text):
        path, _, anchor = cited.rstrip(".,;:").partition("#")
        path = path.rstrip(".,;:")
        if any(PLACEHOLDER.search(part) for part in path.split("/")):
            continue
        if not (ROOT / path).exists():
            yield f"{cited}: no such file"
        elif anchor and path.endswith(".md") and anchor not in anchors(ROOT / path):
            yield f"{cited}: no heading #{anchor} in {path}"


def cited_docs(tracked: list[str]) -> Iterator[str]:
    """`docs/...` paths that code (its comments, docstrings and help), configuration, scripts and the Makefile cite
    (a comment's "measured: docs/X.md#section"): every tracked text file outside docs/."""
    for name in tracked:
        if name.startswith("docs/"):
            continue
        data = (ROOT / name).read_bytes()
        if b"\0" in data:  # a picture, an archive
            continue
        yield from (f"{name}: {found}" for found in cited_docs_in(data.decode(errors="replace")))


def test_docs_cited_by_code_exist():
    assert list(cited_docs(tracked_files())) == []


def test_a_cited_page_or_anchor_that_is_missing_is_caught():
    """The check above can fail: a page that is not there, and a heading a page does not have."""
    page = "docs/" + "design.md"
    assert list(cited_docs_in(f"# measured: {page}#the-packages.")) == []
    assert list(cited_docs_in(f"see {page}#{'no-such-heading'}")) == [
        f"{page}#no-such-heading: no heading #no-such-heading in {page}"]
    missing = "docs/" + "no-such-page.md"
    assert list(cited_docs_in(f"({missing})")) == [f"{missing}: no such file"]


def test_quoted_make_targets_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    quoted = {target for path in [ROOT / "README.md", *pages()] for target in MAKE.findall(code_of(path.read_text()))}
    assert quoted - targets == set()


def test_every_result_folder_is_in_the_index():
    index = RESULTS_INDEX.read_text()
    folders = sorted(folder.name for folder in RESULTS.iterdir() if folder.is_dir())
    assert [name for name in folders if f"]({name}/" not in index] == []


def test_no_page_says_what_a_result_disproves():
    said = {relative(path): " ".join(without_code(path.read_text()).split()) for path in [ROOT / "README.md", *pages()]}
    stale = [f"{name}: {found.group(0)!r}, but {evidence} shows otherwise" for name, text in said.items()
             for pattern, evidence in DISPROVED if (ROOT / evidence).is_dir() for found in pattern.finditer(text)]
    assert stale == []


def test_readme_and_pages_are_short_enough_to_read():
    words = {relative(page): len(page.read_text().split()) for page in [ROOT / "README.md", *pages()]}
    assert sum(words.values()) <= MAX_PAGE_WORDS, (sum(words.values()), sorted(words.items(), key=lambda i: -i[1]))
