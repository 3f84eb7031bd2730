"""Nits of issue 28's fifth outside review (a Python user)."""
import asyncio

import pytest

import lecho


def test_noconsumer_errors_say_who_and_why(nameserver):
    # SyncError noconsumer had an empty errors list when the channel had no
    # consumer anywhere (decided here, at once, before any consumer was
    # asked): now one entry, this context, the reason and the code.
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        p = ctx.channel("py5.nobody").producer()
        with pytest.raises(lecho.SyncError) as e:
            p.submit_sync({"x": 1}, timeout=2)
        assert e.value.code == "noconsumer"
        assert e.value.errors == [{"context": ctx.address, "consumer": "", "code": "noconsumer",
                                   "message": e.value.message}], e.value.errors
        assert "no consumer of py5.nobody" in e.value.message

        async def main():
            with pytest.raises(lecho.SyncError) as se:
                await p.submit_sync_async({"x": 2}, timeout=1)
            return se.value
        se = asyncio.run(asyncio.wait_for(main(), 30))
        assert se.code == "noconsumer" and len(se.errors) == 1 and se.errors[0]["context"] == ctx.address
