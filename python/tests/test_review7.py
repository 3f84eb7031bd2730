"""Findings of issue 28's seventh outside review (a Python user)."""
import pytest

import lecho


def test_ints_a_double_holds_exactly_are_sent():
    # E: p.submit({"n": 2**60}) raised ValueError "does not fit a double
    # exactly (|x| > 2**53)", but a double holds 2**60 exactly (the gateway
    # takes it): refused now is only an int whose float() does not convert
    # back to it, with a message that says so
    with lecho.Context(quiet=True) as ctx:
        ch = ctx.channel("py7.ints")
        got = []
        ch.consumer(lambda ev, meta: got.append(ev))
        p = ch.producer()
        ev = {"a": 2 ** 60, "b": -(2 ** 60), "c": 2 ** 53, "d": 3 * 2 ** 70, 2 ** 60: "key"}
        assert p.submit_sync(ev) is True
        (g,) = got
        assert g == ev                          # 2**60 == 1.152921504606847e18: the same number
        assert isinstance(g["a"], float) and isinstance(g["c"], int)
        for bad, text in ((2 ** 53 + 1, "9007199254740993 is not exactly representable as a double "
                                        "(it would arrive as 9007199254740992"),
                          (-(2 ** 60) - 1, "-1152921504606846977 is not exactly representable"),
                          (10 ** 400, "beyond a double's range"),
                          (10 ** 5000, "of 16610 bits is beyond a double's range")):
            with pytest.raises(ValueError) as e:
                p.submit({"n": bad})
            assert text in str(e.value), str(e.value)
            assert len(str(e.value)) < 300, str(e.value)
        with pytest.raises(ValueError, match="2\\*\\*53"):   # the message says which ints pass
            p.submit({(2 ** 60) + 1: 1})
        # the refused ones sent nothing
        assert p.submit_sync("after") is True
        assert got[1:] == ["after"]
