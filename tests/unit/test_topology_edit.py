"""``reconciler switch``'s edit of the manifest (reconciler/load/topology_edit.py): only the value of the top-level
``topology:`` key changes; every other byte stays, whatever the file's comments, quoting or line ends."""

from __future__ import annotations

import difflib

import pytest

from reconciler.load.topology_edit import TopologyEditError, set_topology

MANIFEST = """\
# yaml-language-server: $schema=../schemas/manifest.schema.json
# The split is the normal topology; "topology: exclusive" switches (this comment is no key).
host: demo
topology: split   # what runs now
standby: [exclusive]
topologies:
  split:
    - recipe: omni
      gpus: [dark-compute-b]
  exclusive:
    - recipe: deepseek-256k-offload
      gpus: [dark-compute-a, dark-compute-b]
notes: |
  topology: not-this-one
"""


def _changed_lines(a: str, b: str) -> list[str]:
    return [ln for ln in difflib.unified_diff(a.splitlines(True), b.splitlines(True), n=0) if ln[:1] in "+-"][2:]


def test_only_the_value_changes_and_every_other_byte_stays() -> None:
    out = set_topology(MANIFEST, "exclusive")
    assert _changed_lines(MANIFEST, out) == [
        "-topology: split   # what runs now\n",
        "+topology: exclusive   # what runs now\n",
    ]
    assert out.replace("topology: exclusive ", "topology: split ", 1) == MANIFEST
    assert set_topology(out, "split") == MANIFEST


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("topology: 'split'\n", "topology: 'exclusive'\n"),
        ('topology: "split"\n', 'topology: "exclusive"\n'),
        ("topology:    split\n", "topology:    exclusive\n"),
        ("topology: split\r\n", "topology: exclusive\r\n"),
    ],
)
def test_quoting_spacing_and_line_ends_are_kept(line: str, expected: str) -> None:
    text = f"host: demo\n{line}topologies: {{}}\n"
    assert set_topology(text, "exclusive") == f"host: demo\n{expected}topologies: {{}}\n"


def test_a_name_yaml_would_read_as_no_string_is_quoted() -> None:
    assert set_topology("topology: split\n", "yes") == 'topology: "yes"\n'
    assert set_topology("topology: split\n", "1.5") == 'topology: "1.5"\n'


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("host: demo\nassignments: []\n", "no top-level 'topology:' key"),
        ("topology: a\ntopology: b\n", "twice"),
        ("topology: [a]\n", "plain name"),
        ("topology:\n", "plain name"),
        ("topology: 3\n", "plain name"),
        ("topology: &t split\nx: *t\n", "anchor"),
        ("- a\n- b\n", "not a YAML mapping"),
        ("topology: [unclosed\n", "not valid YAML"),
        ("nested:\n  topology: split\n", "no top-level"),
    ],
)
def test_what_cannot_be_edited_safely_is_refused(text: str, says: str) -> None:
    with pytest.raises(TopologyEditError, match=says):
        set_topology(text, "exclusive")


@pytest.mark.parametrize("name", ["", "Split", "a b", "../x", "x" * 64, "a\nb: c"])
def test_a_name_that_is_no_topology_name_is_refused_before_anything(name: str) -> None:
    with pytest.raises(TopologyEditError, match="not a topology name"):
        set_topology("topology: split\n", name)
