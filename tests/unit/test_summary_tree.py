"""The statistics' merge tree: one order of merges whatever the delivery, and a bounded number of summaries held."""

from __future__ import annotations

import numpy as np
import pytest

from transforms.merging import summary_tree
from transforms.merging.summary_tree import SummaryTree


def shape(parts) -> str:
    """A merge that shows its own order: "(a b c)"; one part is itself, as merge_by_name leaves one summary."""
    parts = list(parts)
    return parts[0] if len(parts) == 1 else "(" + " ".join(parts) + ")"


@pytest.fixture(autouse=True)
def small_tree(monkeypatch):
    monkeypatch.setattr(summary_tree, "UNITS_PER_GROUP", 4)
    monkeypatch.setattr(summary_tree, "GROUPS_PER_BRANCH", 3)


def parts_of(units: int, pieces: dict[int, int] | None = None, missing=()) -> list[tuple]:
    """(group, unit, piece, pieces, summary) of every block, in unit order; ``missing`` units yield none."""
    pieces = pieces or {}
    return [
        (unit // 4, unit, piece, pieces.get(unit, 1), f"u{unit}" + (f".{piece}" if pieces.get(unit, 1) > 1 else ""))
        for unit in range(units)
        if unit not in missing
        for piece in range(pieces.get(unit, 1))
    ]


def fold(parts, units: int, bundles: int, rng) -> tuple[str, int]:
    """Deliver ``parts`` shuffled into ``bundles`` trees, merged in a random order; the result and the most held."""
    order = rng.permutation(len(parts))
    trees, most = [], 0
    for chunk in np.array_split(order, bundles):
        tree = SummaryTree(shape, units)
        for i in chunk:
            tree.add_part(*parts[i])
            most = max(most, tree.held)
        trees.append(tree)
    first, *rest = [trees[i] for i in rng.permutation(len(trees))]
    for other in rest:
        first.absorb(other)
        most = max(most, first.held)
    return first.result(), most


@pytest.mark.parametrize("missing", [(), (5,), (0, 13, 27, 28, 29, 30)], ids=["all", "one-missing", "several"])
def test_every_delivery_merges_in_the_one_tree_order(missing):
    units = 31  # 8 groups of 4 (the last of 3), 3 branches of 3 groups (the last of 2)
    parts = parts_of(units, pieces={2: 3, 17: 2}, missing=missing)
    expected, _ = fold(parts, 0, 1, np.random.default_rng(0))  # units unknown: nothing folded before the end
    rng = np.random.default_rng(1)
    for bundles in (1, 2, 5, len(parts)):
        for _ in range(4):
            assert fold(parts, units, bundles, rng)[0] == expected
    if not missing:
        # groups in unit and piece order, branches in group order, then the branches
        group0 = "(u0 u1 u2.0 u2.1 u2.2 u3)"
        assert expected.startswith("((" + group0 + " (u4 u5 u6 u7) (u8 u9 u10 u11))")
        assert expected.endswith("((u24 u25 u26 u27) (u28 u29 u30)))")


def test_up_to_one_branch_the_tree_is_the_flat_fold_of_the_groups():
    """A build of up to UNITS_PER_GROUP x GROUPS_PER_BRANCH units merges as the flat merge of groups always did."""
    parts = parts_of(12)
    result, _ = fold(parts, 12, 3, np.random.default_rng(2))
    assert result == "((u0 u1 u2 u3) (u4 u5 u6 u7) (u8 u9 u10 u11))"


def test_what_it_holds_in_unit_order_is_a_few_nodes_not_a_summary_a_unit():
    units = 4 * 3 * 20  # 20 branches
    tree = SummaryTree(shape, units)
    most = 0
    for part in parts_of(units):
        tree.add_part(*part)
        most = max(most, tree.held)
    assert tree.held == 20 and not tree.groups and not tree.branches  # one folded summary a branch
    assert most <= 4 + 3 + 20
    unknown = SummaryTree(shape, 0)
    for part in parts_of(units):
        unknown.add_part(*part)
    assert unknown.held == units and unknown.result() == tree.result()
