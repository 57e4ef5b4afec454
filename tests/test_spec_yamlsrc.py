"""The YAML layer: line numbers kept, every broken input turned into one SpecError line."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.spec.inventory import inventory_from_text
from orchestrator.spec.yamlsrc import Map, Scalar, Seq, collect_lines, load_yaml
from tests.helpers import distrun


def message(data: str | bytes) -> str:
    with pytest.raises(SpecError) as caught:
        load_yaml(data, "f.yaml")
    return str(caught.value)


def test_every_key_value_and_item_keeps_its_line() -> None:
    root = load_yaml("# comment\na: 1\nb:\n  - x\n  - {c: y}\n", "f.yaml")
    assert isinstance(root, Map)
    assert root.key_lines == {"a": 2, "b": 3}
    items = root.entries["b"]
    assert isinstance(items, Seq)
    assert [item.line for item in items.items] == [4, 5]
    assert collect_lines(root) == {"": 2, "a": 2, "b": 3, "b[0]": 4, "b[1]": 5, "b[1].c": 5}


def test_scalars_keep_the_text_as_written() -> None:
    root = load_yaml("a: 3.10\nb: no\nc: 0x10\nd: 'quoted'\n", "f.yaml")
    assert isinstance(root, Map)
    found = {key: (node.value, node.text) for key, node in root.entries.items() if isinstance(node, Scalar)}
    assert found == {"a": (3.1, "3.10"), "b": (False, "no"), "c": (16, "0x10"), "d": ("quoted", "quoted")}


def test_empty_or_comment_only_document_is_none() -> None:
    assert load_yaml("", "f.yaml") is None
    assert load_yaml("# nothing\n", "f.yaml") is None


def test_anchors_aliases_and_merge_keys_are_resolved() -> None:
    root = load_yaml("base: &b {x: 1, y: 2}\nnode:\n  <<: *b\n  y: 3\nsame: *b\n", "f.yaml")
    assert isinstance(root, Map)
    node = root.entries["node"]
    assert isinstance(node, Map)
    assert {key: value.text for key, value in node.entries.items() if isinstance(value, Scalar)} == {"x": "1", "y": "3"}
    assert node.key_lines == {"y": 4, "x": 1}
    assert root.entries["same"] is root.entries["base"]


def test_duplicate_key_names_the_first_line() -> None:
    assert (
        message("a: 1\nb:\n  c: 1\n  c: 2\n")
        == "f.yaml:4: b.c: duplicate key (first set at line 3) (remove one of them)"
    )


def test_tab_indentation_is_reported_with_a_hint() -> None:
    assert message("a:\n\tb: 1\n") == (
        "f.yaml:2: invalid YAML: while scanning for the next token, found character '\\t' that cannot start "
        "any token (indent with spaces; YAML does not allow tabs)"
    )


def test_syntax_error_reports_the_line_of_the_problem() -> None:
    assert message("a: 1\nb: [1, 2\nc: 3\n").startswith("f.yaml:3: invalid YAML: while parsing a flow sequence")


def test_bytes_that_are_not_utf8_report_their_line() -> None:
    assert message(b"a: 1\nb: \xff\n") == "f.yaml:2: invalid YAML: not UTF-8 text (byte 0xff) (save the file as UTF-8)"


def test_utf8_byte_order_mark_is_accepted() -> None:
    assert isinstance(load_yaml("\ufeffa: 1\n".encode(), "f.yaml"), Map)


def test_control_character_reports_its_line() -> None:
    assert message("a: 1\nb: \x07\n") == "f.yaml:2: invalid YAML: character '\\x07' is not allowed (remove it)"


def test_recursive_alias_is_an_error_not_a_hang() -> None:
    assert message("a: &x [1, *x]\n") == (
        "f.yaml:1: a[1]: an alias refers to a node that contains it (aliases may only repeat a finished node)"
    )


def test_unknown_tag_is_refused() -> None:
    assert message("a: !python/object x\n").startswith("f.yaml:1: invalid YAML: could not determine a constructor")


@pytest.mark.parametrize("text", ["a: !!int abc", 'a: !!float ""', "a: !!bool maybe", "a: !!timestamp 2024-13-45"])
def test_tagged_scalar_with_bad_text_is_a_spec_error(text: str) -> None:
    assert message(text).startswith("f.yaml:1: invalid YAML: cannot read")


def test_collection_with_a_tag_is_refused() -> None:
    assert message("a: !!set {x}\n") == (
        "f.yaml:1: invalid YAML: unsupported tag 'tag:yaml.org,2002:set' (distrun reads plain YAML: remove the '!' tag)"
    )


def test_non_text_key_is_refused() -> None:
    assert message("a:\n  ? [x, y]\n  : 1\n") == (
        "f.yaml:2: a: a key must be plain text, not a list or mapping (check for a stray '?' or brackets before ':')"
    )


def test_second_document_is_refused() -> None:
    assert message("a: 1\n---\nb: 2\n").startswith("f.yaml:2: invalid YAML: expected a single document")


def test_very_deep_nesting_is_a_spec_error() -> None:
    assert message("[" * 5000) == (
        "f.yaml:1: invalid YAML: the document is nested too deeply "
        "(check the indentation, quotes and brackets on this line and the one before)"
    )


def alias_bomb(labels: int = 5000, nodes: int = 400) -> str:
    """The inventory of issue 14: one anchored list of labels that every other node aliases."""
    names = ", ".join(f"l{i}" for i in range(labels))
    lines = ["nodes:", f"  - {{name: n0, labels: &all [{names}]}}"]
    lines += [f"  - {{name: n{i}, labels: *all}}" for i in range(1, nodes)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_inventory_is_refused_at_its_alias_without_building_it() -> None:
    text = alias_bomb()
    assert 44_000 < len(text) < 50_000
    tracemalloc.start()
    try:
        with pytest.raises(SpecError) as caught:
            inventory_from_text(text, "inv.yaml")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 5,001 nodes an alias: the 20th alias, on line 22, passes 100,000.
    assert str(caught.value) == (
        "inv.yaml:22: invalid YAML: aliases repeat more than 100,000 values in all "
        "(write large lists and mappings out once instead of repeating them through aliases)"
    )
    assert peak < 40 * 2**20  # built, it held 2 million label strings (320 MB)


def test_nested_aliases_are_counted_as_what_they_expand_to() -> None:
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for level in "bcdefgh":
        previous = chr(ord(level) - 1)
        laughs += f"{level}: &{level} [" + ", ".join([f"*{previous}"] * 10) + "]\n"
    assert message(laughs).startswith("f.yaml:5: invalid YAML: aliases repeat more than 100,000 values in all")


def test_an_inventory_of_256_nodes_built_from_anchors_and_merge_keys_loads() -> None:
    first = ("  - &gpu {name: gpu000, host: 10.0.0.10, gpus: 8, python: /opt/venv/bin/python, iface: eth1,\n"
             "          labels: [h100, rack1, ib, nvme, prod, team-a, eu, sxm, bf16, fp8],\n"
             "          env: {NCCL_DEBUG: WARN, NCCL_IB_HCA: mlx5, NCCL_IB_GID_INDEX: '3'}}\n")
    others = "".join(f"  - {{<<: *gpu, name: gpu{i:03d}, host: 10.0.{i // 200}.{i % 200 + 10}}}\n"
                     for i in range(1, 256))
    inventory = inventory_from_text("defaults: {user: ops}\nnodes:\n" + first + others, "inv.yaml")
    assert len(inventory.nodes) == 256
    last = inventory.nodes[-1]
    assert (last.name, last.host, last.gpus, last.iface, last.user) == ("gpu255", "10.0.1.65", 8, "eth1", "ops")
    assert last.labels[0] == "h100" and last.env["NCCL_IB_HCA"] == "mlx5"


def test_doctor_given_an_alias_bomb_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(alias_bomb())
    result = distrun("doctor", "-i", str(path), home=tmp_path / "home")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"distrun: error: {path}:22: invalid YAML: aliases repeat more than 100,000 values")
    assert result.stderr.count("\n") == 1
