"""Actions and the action space (ALGORITHMS.md section 2)."""

from __future__ import annotations

import pytest

from decoding import Action, ActionSpace, parse_action


def test_action_fields_and_size() -> None:
    a = Action(4, 2, 3)
    assert (a.K, a.L1, a.L2) == (4, 2, 3)
    assert a.tree_size == 2 + 4 * 3
    assert not a.is_chain and Action(1, 2, 3).is_chain and Action(4, 2, 0).is_chain
    assert str(a) == "4,2,3"
    assert parse_action(" 4, 2,3") == a
    assert hash(a) == hash(Action(4, 2, 3))


@pytest.mark.parametrize(("args", "field"), [((0, 1, 1), "K"), ((1, -1, 1), "L1"), ((1, 1, -2), "L2"),
                                             ((1.0, 1, 1), "K"), ((True, 1, 1), "K"), ((1, "2", 1), "L1")])
def test_action_validation_names_the_field(args, field) -> None:
    with pytest.raises(ValueError, match=f"Action.{field}"):
        Action(*args)


@pytest.mark.parametrize("text", ["4,2", "a,b,c", "1,2,3,4", ""])
def test_parse_action_errors(text: str) -> None:
    with pytest.raises(ValueError, match="K,L1,L2"):
        parse_action(text)


def test_default_space_is_stable() -> None:
    space = ActionSpace()
    assert len(space) == 324
    assert space[0] == Action(1, 0, 0) and space[1] == Action(1, 0, 1) and space[9] == Action(1, 1, 0)
    assert space[-1] == Action(4, 8, 8)
    assert all(space.index(a) == i for i, a in enumerate(space))
    assert list(space) == list(ActionSpace().actions)
    assert space.max_action == Action(4, 8, 8)


def test_canonical_merges_l2_zero_only() -> None:
    space = ActionSpace()
    assert space.canonical(Action(3, 5, 0)) == Action(1, 5, 0)
    assert space.canonical(Action(3, 5, 1)) == Action(3, 5, 1)
    canon = space.canonical_index()
    assert len(set(canon)) == 324 - 3 * 9  # 36 L2 = 0 actions collapse to 9
    assert all(space[canon[i]].L2 == 0 for i, a in enumerate(space) if a.L2 == 0)


def test_custom_space_and_errors() -> None:
    space = ActionSpace(K=[2, 4], L1=range(1, 3), L2=[0, 2])
    assert len(space) == 8 and space.canonical(Action(4, 1, 0)) == Action(2, 1, 0)
    assert Action(2, 1, 2) in space and Action(1, 1, 2) not in space
    with pytest.raises(ValueError, match="not in"):
        space.index(Action(1, 1, 2))
    with pytest.raises(ValueError, match="strictly increasing"):
        ActionSpace(K=[2, 1])
    with pytest.raises(ValueError, match="empty"):
        ActionSpace(L2=[])
    assert len(ActionSpace.from_config({"K": [1, 2], "L1": [0, 1], "L2": [0, 3]})) == 16
    with pytest.raises(ValueError, match="config"):
        ActionSpace.from_config({"K": [1, 2]})
