from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

from tokenstate.contracts import ContractViolation, spliced_rows, stale_position_mask

from .conftest import i32


def test_spliced_iff_seq_len_exceeds_prefill_len():
    assert spliced_rows(i32([5, 6, 4]), i32([5, 5, 5])).tolist() == [False, True, False]


def test_chunk_completing_prefill_is_not_spliced():
    # A prompt of 8 split into chunks 5 + 3: the completing chunk has seq_len == prefill_len.
    mask = stale_position_mask(i32([0, 3]), i32([8]), i32([8]))
    assert not mask.any()


def test_only_the_last_position_of_a_decode_row_is_stale():
    mask = stale_position_mask(i32([0, 2, 3]), i32([2, 10]), i32([2, 9]))
    assert mask.tolist() == [False, False, True]


def test_draft_positions_are_stale_too():
    # One decode row with 2 drafts: last sampled + 2 drafts = 3 stale positions.
    mask = stale_position_mask(i32([0, 3]), i32([12]), i32([9]), i32([2]))
    assert mask.tolist() == [True, True, True]


def test_empty_rows_never_reach_a_neighbour():
    mask = stale_position_mask(i32([0, 0, 1, 1]), i32([5, 6, 7]), i32([4, 5, 6]))
    assert mask.tolist() == [True]


def test_row_order_does_not_matter():
    qsl, seq, pre = i32([0, 1, 4]), i32([10, 3]), i32([9, 7])
    forward = stale_position_mask(qsl, seq, pre)
    backward = stale_position_mask(i32([0, 3, 4]), seq.flip(0), pre.flip(0))
    assert forward.tolist() == [True, False, False, False]
    assert backward.tolist() == [False, False, False, True]


def test_shape_mismatch_is_a_contract_violation():
    with pytest.raises(ContractViolation, match=r"seq_lens and prefill_lens must both be \[num_rows\]"):
        spliced_rows(i32([1, 2]), i32([1]))
    with pytest.raises(ContractViolation, match=r"query_start_loc must be \[num_rows \+ 1\] = \[3\]"):
        stale_position_mask(i32([0, 1]), i32([1, 2]), i32([1, 2]))


def test_numpy_arrays_give_the_mask_torch_tensors_give() -> None:
    # Rows: a decode row, a prefill chunk, an empty row, a decode row with 2 drafts, a completing chunk.
    qsl, seq, pre, drafts = [0, 1, 5, 5, 8, 11], [9, 4, 6, 20, 11], [8, 9, 5, 12, 11], [0, 0, 0, 2, 0]
    as_np = [np.array(v, dtype=np.int32) for v in (qsl, seq, pre, drafts)]
    want = stale_position_mask(i32(qsl), i32(seq), i32(pre), i32(drafts))
    got = stale_position_mask(*as_np)
    assert isinstance(got, np.ndarray) and got.dtype == np.bool_
    assert got.tolist() == want.tolist() == [True] + [False] * 4 + [True] * 3 + [False] * 3
    assert spliced_rows(as_np[1], as_np[2]).tolist() == spliced_rows(i32(seq), i32(pre)).tolist()
    assert stale_position_mask(*as_np[:3]).tolist() == stale_position_mask(
        i32(qsl), i32(seq), i32(pre)
    ).tolist()


@pytest.mark.parametrize("one_token_rows", [True, False], ids=["decode-step", "mixed-step"])
def test_the_mask_is_each_spliced_rows_tail_on_every_kind_of_step(one_token_rows: bool) -> None:
    """The mask by its definition, row by row, on random steps: a decode step (one token a row,
    which takes a shortcut) and steps mixing prefill chunks, empty rows and drafted rows."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        num_rows = int(rng.integers(1, 9))
        query_lens = np.ones(num_rows, np.int64) if one_token_rows else rng.integers(0, 5, num_rows)
        qsl = np.concatenate(([0], np.cumsum(query_lens))).astype(np.int32)
        seq = rng.integers(1, 40, num_rows).astype(np.int32)
        pre = (seq - rng.integers(-2, 3, num_rows)).astype(np.int32)
        drafts = rng.integers(0, 3, num_rows).astype(np.int32)
        want = []
        for r in range(num_rows):
            tail = min(1 + int(drafts[r]), int(query_lens[r])) if seq[r] > pre[r] else 0
            want += [False] * (int(query_lens[r]) - tail) + [True] * tail
        assert stale_position_mask(qsl, seq, pre, drafts).tolist() == want
        assert stale_position_mask(i32(qsl.tolist()), i32(seq.tolist()), i32(pre.tolist()), i32(drafts.tolist())).tolist() == want


def test_mixing_numpy_and_torch_is_a_contract_violation() -> None:
    seq = np.array([5, 6], dtype=np.int32)
    with pytest.raises(ContractViolation, match=r"of one kind \(torch tensors or numpy arrays\)"):
        spliced_rows(seq, i32([5, 5]))
    with pytest.raises(ContractViolation, match=r"every argument as a torch tensor or every one"):
        stale_position_mask(i32([0, 1, 2]), seq, np.array([5, 5], dtype=np.int32))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("qsl", [[0, 3, 1], [1, 2, 3]])
def test_row_starts_that_do_not_rise_from_zero_are_a_contract_violation(kind: str, qsl) -> None:
    seq, pre = [4, 4], [3, 3]
    args = [np.array(v, dtype=np.int32) for v in (qsl, seq, pre)] if kind == "numpy" else [
        i32(v) for v in (qsl, seq, pre)
    ]
    with pytest.raises(ContractViolation, match=r"query_start_loc must rise from 0 .* got \["):
        stale_position_mask(*args)


def _predicate_comparisons(tree: ast.AST) -> list[int]:
    """Line numbers of ``seq_len(s) <op> prefill_len(s)`` comparisons outside Triton-jitted functions."""

    def names(node: ast.AST) -> set[str]:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
            n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
        }

    hits: list[int] = []

    def visit(node: ast.AST, in_jit: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            in_jit = in_jit or any("jit" in ast.unparse(d) for d in node.decorator_list)
        ordering = (ast.Gt, ast.GtE, ast.Lt, ast.LtE)
        if isinstance(node, ast.Compare) and not in_jit and any(isinstance(o, ordering) for o in node.ops):
            sides = [names(node.left), *(names(c) for c in node.comparators)]
            has = lambda key: any(any(key in name for name in side) for side in sides)  # noqa: E731
            if has("seq_len") and has("prefill_len"):
                hits.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, in_jit)

    visit(tree, False)
    return hits


def test_predicate_is_defined_once_in_python():
    """DESIGN §3: exactly one Python definition of the row predicate (Triton's copy is pinned)."""
    root = pathlib.Path(__file__).resolve().parents[2]
    hits = [
        (str(p.relative_to(root)), line)
        for folder in ("contracts", "runtime", "models", "tools", "checker", "ledger", "src")
        for p in sorted((root / folder).rglob("*.py"))
        for line in _predicate_comparisons(ast.parse(p.read_text()))
    ]
    assert [path for path, _ in hits] == ["contracts/predicate.py"], hits
