"""cpuset.parse must accept and refuse exactly what k8s.io/utils/cpuset.Parse does."""

from __future__ import annotations

import pytest

from rollout.kubelet.cpuset import CPUSetError, format_cpus, parse


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("", set()),
        ("0", {0}),
        ("0-3,8", {0, 1, 2, 3, 8}),
        ("0,32", {0, 32}),
        ("2-2", {2}),
    ],
)
def test_parses_like_the_kubelet(text: str, cpus: set[int]) -> None:
    assert parse(text) == frozenset(cpus)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0, 4", 'strconv.Atoi: parsing " 4": invalid syntax'),
        ("a", 'strconv.Atoi: parsing "a": invalid syntax'),
        ("3-1", 'invalid range "3-1" (3 > 1)'),
        ("1-", 'strconv.Atoi: parsing "": invalid syntax'),
        ("0,,1", 'strconv.Atoi: parsing "": invalid syntax'),
    ],
)
def test_refuses_like_the_kubelet(text: str, message: str) -> None:
    with pytest.raises(CPUSetError) as e:
        parse(text)
    assert str(e.value) == message


def test_format_is_canonical() -> None:
    assert format_cpus({5, 0, 1, 2, 32, 33}) == "0-2,5,32-33"
    assert parse(format_cpus(range(0, 64, 2))) == frozenset(range(0, 64, 2))
