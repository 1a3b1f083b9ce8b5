"""Spec documents: ``specs/<slug>.md`` parsed with markdown-it-py into items with stable ids.

A spec reads well on GitHub and in the docs site and is still machine-checkable::

    # Stale host token ids                      <- title (the first heading, level 1)

    Contract statement: any blocks up to ``## Owed``.

    ## Owed
    - **SHI-14** A promised capability ... — `tests/test_stale_host_ids_runtime.py::test_future`

    ## Paid
    - **SHI-1** Reading stale host ids is refused ... — `tests/test_contracts_items.py::test_refusal`

    ## Notes                                    <- further sections after ## Paid are not parsed

Each item is one list item: a bold id (``PREFIX-N``), one line of text, and, as its last element, a
code span naming the test that carries it — a path relative to the spec file, ``::``, and the test
(``Class::test`` inside a class). Malformed specs raise
:class:`~tokenstate.contracts.ContractDefinitionError` listing every problem as ``file:line``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from markdown_it import MarkdownIt
from markdown_it.token import Token

from tokenstate.contracts.errors import ContractDefinitionError

__all__ = [
    "ITEM_ID", "Spec", "SpecItem", "is_spec_document", "load_specs", "looks_like_spec", "parse_spec",
    "spec_documents",
]  # fmt: skip

ItemState = Literal["owed", "paid"]
ITEM_ID = re.compile(r"[A-Z][A-Z0-9]*-[1-9][0-9]*")
_TEST_REF = re.compile(r"(?P<file>[^:\s]+\.py)::(?P<name>[A-Za-z_]\w*(?:::[A-Za-z_]\w*)?)")
_SECTIONS: dict[str, ItemState] = {"owed": "owed", "paid": "paid"}
_SEPARATORS = " \t—–-:"


@dataclass(frozen=True, slots=True)
class SpecItem:
    """One owed or paid promise of a spec, bound to exactly one test."""

    id: str
    state: ItemState
    text: str
    spec: str  # the spec's slug (file name without .md)
    spec_file: Path
    line: int  # 1-based line of the item in spec_file
    test: str  # the test reference as written, relative to the spec file's folder
    test_file: Path  # resolved, absolute
    test_name: str  # "test_x" or "Class::test_x"

    @property
    def where(self) -> str:
        return f"{self.spec_file}:{self.line}"


@dataclass(frozen=True, slots=True)
class Spec:
    slug: str
    path: Path
    title: str
    contract: str  # markdown source of the contract statement
    items: tuple[SpecItem, ...]


class _Problems:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[str] = []

    def add(self, line: int, message: str) -> None:
        self.lines.append(f"{self.path}:{line}: {message}")

    def raise_if_any(self) -> None:
        if self.lines:
            raise ContractDefinitionError("malformed spec:\n  " + "\n  ".join(self.lines))


def _line(token: Token) -> int:
    return token.map[0] + 1 if token.map else 1


def _item_from_inline(
    inline: Token, state: ItemState, path: Path, slug: str, problems: _Problems
) -> SpecItem | None:
    line = _line(inline)
    children = [
        c for c in inline.children or [] if not (c.type == "text" and not c.content.strip())
    ]
    expected = "expected `- **ID** one line of text — `path/to/test_file.py::test_name``"
    if len(children) < 4 or children[0].type != "strong_open" or children[2].type != "strong_close":
        problems.add(line, f"item must start with its bold id; {expected}.")
        return None
    item_id = children[1].content
    if children[1].type != "text" or not ITEM_ID.fullmatch(item_id):
        problems.add(line, f"item id {item_id!r} is not of the form PREFIX-N (e.g. SHI-3).")
        return None
    last = children[-1]
    ref = _TEST_REF.fullmatch(last.content.strip()) if last.type == "code_inline" else None
    if ref is None:
        spaced = last.type == "code_inline" and any(ch.isspace() for ch in last.content.strip())
        problems.add(
            line,
            f"{item_id}: the test reference `{last.content.strip()}` holds whitespace, which a "
            "reference cannot: rename the folder or file without spaces."
            if spaced
            else f"{item_id}: the item must end with a code span naming its test; {expected}.",
        )
        return None
    source = inline.content.strip()
    opening = children[0].markup + item_id + children[0].markup
    closing = last.markup + last.content + last.markup
    if not (source.startswith(opening) and source.endswith(closing)):
        problems.add(
            line, f"{item_id}: cannot separate the item's text from its id and test; {expected}."
        )
        return None
    text = " ".join(source[len(opening) : len(source) - len(closing)].split()).strip(_SEPARATORS)
    if not text:
        problems.add(line, f"{item_id}: the item has no text; say in one line what is promised.")
        return None
    return SpecItem(
        id=item_id,
        state=state,
        text=text,
        spec=slug,
        spec_file=path,
        line=line,
        test=ref.group(0),
        test_file=(path.parent / ref.group("file")).resolve(),
        test_name=ref.group("name"),
    )


def _section_items(
    tokens: Sequence[Token], state: ItemState, path: Path, slug: str, problems: _Problems
) -> list[SpecItem]:
    """Items of one ``## Owed`` / ``## Paid`` section: its tokens must form one bullet list (or none)."""
    items: list[SpecItem] = []
    depth = 0
    for i, token in enumerate(tokens):
        if depth == 0 and token.type not in ("bullet_list_open", "bullet_list_close"):
            if token.nesting >= 0 and token.type != "inline":
                problems.add(
                    _line(token), f"## {state.title()} may only hold one bullet list of items."
                )
                return items
            continue
        if token.type in ("bullet_list_open", "ordered_list_open"):
            depth += 1
            if depth > 1:
                problems.add(_line(token), "items must not contain nested lists.")
                return items
        elif token.type in ("bullet_list_close", "ordered_list_close"):
            depth -= 1
        elif token.type == "list_item_open":
            body = tokens[i + 1 : i + 4]
            shape = [t.type for t in body]
            if (
                shape != ["paragraph_open", "inline", "paragraph_close"]
                or tokens[i + 4].type != "list_item_close"
            ):
                problems.add(_line(token), "each item is a single paragraph (one line of text).")
                continue
            item = _item_from_inline(body[1], state, path, slug, problems)
            if item is not None:
                items.append(item)
    return items


def parse_spec(path: Path, source: str | None = None) -> Spec:
    """Parse one spec document; raises ContractDefinitionError listing every problem as file:line."""
    path = Path(path).resolve()
    problems = _Problems(path)
    if source is None:
        source = _read(path)
    tokens = MarkdownIt("commonmark").parse(source)
    headings = _headings(tokens)
    if not headings or headings[0][1] != "h1" or headings[0][0] != 0:
        problems.add(1, "a spec starts with its title as a level-1 heading (`# Title`).")
        problems.raise_if_any()
    sections: dict[str, tuple[int, int]] = {}
    for n, (i, tag, name) in enumerate(headings):
        if tag == "h2":
            sections.setdefault(name.lower(), (i, n))
    for n, (i, tag, name) in enumerate(headings):
        if tag == "h2" and name.lower() in _SECTIONS and sections[name.lower()] != (i, n):
            problems.add(_line(tokens[i]), f"`## {name}` appears twice; keep one list per state.")
    missing = [name for name in ("Owed", "Paid") if name.lower() not in sections]
    if missing:
        problems.add(
            1, f"missing section(s) {', '.join('## ' + m for m in missing)} (both are required)."
        )
        problems.raise_if_any()
    (owed_at, _), (paid_at, paid_n) = sections["owed"], sections["paid"]
    if paid_at < owed_at:
        problems.add(_line(tokens[paid_at]), "`## Paid` must come after `## Owed`.")
    problems.raise_if_any()
    contract_lines = source.splitlines()[(tokens[0].map or [0, 1])[1] : _line(tokens[owed_at]) - 1]
    contract = "\n".join(contract_lines).strip()
    if not contract:
        problems.add(_line(tokens[0]), "state the contract between the title and `## Owed`.")
    # the Paid section runs to the next section (a `### ...` inside it is no place for items)
    paid_end = next((i for i, tag, _ in headings[paid_n + 1 :] if tag in ("h1", "h2")), len(tokens))
    slug = path.stem
    items = _section_items(tokens[owed_at + 3 : paid_at], "owed", path, slug, problems)
    items += _section_items(tokens[paid_at + 3 : paid_end], "paid", path, slug, problems)
    _check_unique(items, problems)
    problems.raise_if_any()
    return Spec(slug, path, tokens[1].content.strip(), contract, tuple(items))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")  # an editor's byte-order mark is no text
    except UnicodeDecodeError as exc:
        raise ContractDefinitionError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8.") from exc
    except OSError as exc:
        raise ContractDefinitionError(f"{path}: cannot be read ({exc.strerror or exc}).") from exc


def _headings(tokens: list[Token]) -> list[tuple[int, str, str]]:
    """(token index, tag, text) of every heading, as the markdown parser sees them (not in code)."""
    return [(i, t.tag, tokens[i + 1].content.strip()) for i, t in enumerate(tokens) if t.type == "heading_open"]


def looks_like_spec(path: Path) -> bool:
    """Whether a markdown file has an Owed or Paid section, as :func:`parse_spec` reads headings
    (any case, any heading style; a ``## Owed`` inside a code block is not one)."""
    try:
        tokens = MarkdownIt("commonmark").parse(_read(Path(path)))
    except ContractDefinitionError:
        return False
    return any(tag == "h2" and name.lower() in _SECTIONS for _, tag, name in _headings(tokens))


def _check_unique(items: Iterable[SpecItem], problems: _Problems) -> None:
    ids: dict[str, SpecItem] = {}
    tests: dict[tuple[Path, str], SpecItem] = {}
    for item in items:
        if item.id in ids:
            problems.add(
                item.line, f"{item.id} is listed twice (first at line {ids[item.id].line})."
            )
        ids.setdefault(item.id, item)
        key = (item.test_file, item.test_name)
        if key in tests:
            problems.add(
                item.line,
                f"{item.id}: test {item.test} already carries {tests[key].id}; one test carries one item.",
            )
        tests.setdefault(key, item)
        if not item.test_file.is_file():
            problems.add(item.line, f"{item.id}: test file {item.test_file} does not exist.")


def is_spec_document(path: Path) -> bool:
    """A spec folder's ``*.md`` files are its spec documents, except its README.md (folders named
    like one and dangling links are no files)."""
    return path.suffix == ".md" and path.name.lower() != "readme.md" and path.is_file()


def spec_documents(directory: Path) -> list[Path]:
    """The spec documents of one spec folder, in name order (none if the folder does not exist)."""
    return sorted(p for p in Path(directory).glob("*.md") if is_spec_document(p))


def load_specs(directories: Iterable[Path]) -> list[Spec]:
    """Every spec document in the given folders; item ids must be unique across them."""
    specs: list[Spec] = []
    errors: list[str] = []
    for directory in directories:
        for path in spec_documents(directory):
            try:
                specs.append(parse_spec(path))
            except ContractDefinitionError as exc:
                errors.append(str(exc))
    seen: dict[str, SpecItem] = {}
    for spec in specs:
        for item in spec.items:
            first = seen.setdefault(item.id, item)
            if first is not item:
                errors.append(
                    f"{item.where}: {item.id} is also defined at {first.where}; ids are global."
                )
    if errors:
        raise ContractDefinitionError("\n".join(errors))
    return specs
