"""Level: pure (no mount, no daemon).

`shared_tasks.each` runs tasks at once and raises the first failure as itself, not wrapped in the
`ExceptionGroup` a nursery raises: the FUSE operations' handlers map a format or source error to
its errno and log line, and took a group for an internal error."""

from __future__ import annotations

import pytest
import trio

from shufflefs.errors import FormatError
from shufflefs.shared_tasks import each


def test_the_first_failure_is_raised_as_it_is_and_the_others_end() -> None:
    ended: list[str] = []

    async def fails() -> None:
        await trio.sleep(0.01)
        raise FormatError("/data/b.parquet", 0, "too short for a Parquet file")

    async def waits() -> None:
        try:
            await trio.sleep(10)
        finally:
            ended.append("waits")

    async def main() -> None:
        await each([waits, fails])

    with pytest.raises(FormatError, match="b.parquet"):
        trio.run(main)
    assert ended == ["waits"]


def test_all_succeeding_run_at_once() -> None:
    got: list[int] = []

    async def main() -> None:
        async def one(i: int) -> None:
            await trio.sleep(0.01 * (3 - i))
            got.append(i)

        with trio.fail_after(1):
            await each([lambda i=i: one(i) for i in range(3)])

    trio.run(main)
    assert got == [2, 1, 0]
