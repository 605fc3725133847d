"""Level: pure (no mount).

docs/SEMANTICS.md and the tests hold each other: every statement label of the document is named
by at least one test (``SEMANTICS.md#<label>`` in the docstring of a test function, a test class
or a test module), and every label a test names is a statement or a section of the document."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "SEMANTICS.md"
TESTS = REPO / "tests"

SECTION = re.compile(r"^## .*\{#([a-z0-9-]+)\}\s*$")
STATEMENT = re.compile(r"^- \*\*\[([a-z0-9-]+)\]\*\*")
REFERENCE = re.compile(r"\[([a-z0-9]+(?:-[a-z0-9]+)+)\]")
NAMED = re.compile(r"SEMANTICS\.md#([a-z0-9-]+)")


def parse_doc(text: str) -> tuple[list[str], dict[str, str], list[str]]:
    """(section anchors, statement label -> its section, every ``[label]`` referred to)."""
    sections: list[str] = []
    labels: dict[str, str] = {}
    refs: list[str] = []
    duplicates = []
    for line in text.splitlines():
        m = SECTION.match(line)
        if m:
            sections.append(m.group(1))
            continue
        m = STATEMENT.match(line)
        if m:
            if m.group(1) in labels:
                duplicates.append(m.group(1))
            labels[m.group(1)] = sections[-1] if sections else ""
            line = line[m.end():]
        refs += REFERENCE.findall(line)
    assert not duplicates, f"labels defined twice: {duplicates}"
    return sections, labels, refs


def docstrings(tree: ast.Module) -> list[str]:
    """The docstrings that can name what a test holds: the module's, test classes' and test
    functions' (also methods of test classes)."""
    out = [ast.get_docstring(tree) or ""]
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            out.append(ast.get_docstring(node) or "")
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            out.append(ast.get_docstring(node) or "")
    return out


def named_by_tests() -> dict[str, list[str]]:
    """Label -> the test files whose test docstrings name it."""
    named: dict[str, list[str]] = defaultdict(list)
    for path in sorted(TESTS.rglob("test_*.py")):
        if path.resolve() == Path(__file__).resolve():
            continue
        tree = ast.parse(path.read_text(), str(path))
        for doc in docstrings(tree):
            for label in NAMED.findall(doc):
                named[label].append(str(path.relative_to(REPO)))
    return named


@pytest.fixture(scope="module")
def doc() -> tuple[list[str], dict[str, str], list[str]]:
    return parse_doc(DOC.read_text())


def test_the_document_has_sections_and_labelled_statements(doc):
    sections, labels, _ = doc
    assert len(sections) == len(set(sections)), "section anchors must be unique"
    assert len(sections) >= 8 and len(labels) >= 40
    # a label is <section>-<name>, so a label tells where its statement is
    misplaced = {label: section for label, section in labels.items() if not label.startswith(section + "-")}
    assert not misplaced, f"labels outside their section's prefix: {misplaced}"
    assert not set(labels) & set(sections), "a statement label must not shadow a section anchor"


def test_every_reference_in_the_document_is_a_label(doc):
    _, labels, refs = doc
    dangling = sorted(set(refs) - set(labels))
    assert not dangling, f"references to no statement: {dangling}"


def test_every_statement_is_held_by_a_test(doc):
    _, labels, _ = doc
    named = named_by_tests()
    untested = sorted(set(labels) - set(named))
    assert not untested, f"statements no test names (Holds: SEMANTICS.md#<label>): {untested}"


def test_every_label_a_test_names_is_in_the_document(doc):
    sections, labels, _ = doc
    named = named_by_tests()
    unknown = {label: files for label, files in named.items() if label not in labels and label not in sections}
    assert not unknown, f"tests name labels that SEMANTICS.md does not have: {unknown}"


def test_the_parser_finds_labels_sections_and_references():
    text = "\n".join([
        "# t", "## A {#a}", "- **[a-one]** text naming [a-two].", "  more [b-x] text",
        "- **[a-two]** text", "## B {#b}", "- **[b-x]** [not a label] and [c]",
    ])
    sections, labels, refs = parse_doc(text)
    assert sections == ["a", "b"]
    assert labels == {"a-one": "a", "a-two": "a", "b-x": "b"}
    assert refs == ["a-two", "b-x"]
    with pytest.raises(AssertionError):
        parse_doc("## A {#a}\n- **[a-one]** x\n- **[a-one]** y\n")
    tree = ast.parse('"""m SEMANTICS.md#a-one"""\n'
                     'def test_x():\n    """Holds: SEMANTICS.md#a-two, SEMANTICS.md#b"""\n'
                     'def helper():\n    """SEMANTICS.md#b-x"""\n')
    assert [NAMED.findall(d) for d in docstrings(tree)] == [["a-one"], ["a-two", "b"]]
