"""TxnID (PIP-31 §TxnID): the TCID in the high 16 bits, text form "(most,least)"."""

from __future__ import annotations

import pytest

from proto import boot_epoch, txn_text
from tc import TxnID

U64 = 2**64 - 1
MAX_TCID = 2**16 - 1
MAX_COUNTER = 2**112 - 1


@pytest.mark.parametrize(
    ("tcid", "counter"),
    [
        (0, 0),
        (1, 0),
        (0, 1),
        (7, 12345),
        (MAX_TCID, 0),
        (0, MAX_COUNTER),
        (MAX_TCID, MAX_COUNTER),
        (3, 2**64),  # the counter spills into most_bits
        (3, U64),  # the largest counter that fits in least_bits alone
        (0x1234, (0xABCD << 64) | 0x5678),
    ],
)
def test_of_puts_tcid_in_high_16_bits_and_counter_below(tcid: int, counter: int) -> None:
    txn = TxnID.of(tcid, counter)
    assert txn.most_bits >> 48 == tcid
    assert txn.most_bits & (2**48 - 1) == counter >> 64
    assert txn.least_bits == counter & U64
    assert (txn.most_bits << 64) | txn.least_bits == (tcid << 112) | counter
    assert txn.tcid == tcid
    assert txn.counter == counter


def test_tcid_and_counter_of_raw_halves() -> None:
    txn = TxnID(most_bits=(5 << 48) | 9, least_bits=11)
    assert txn.tcid == 5
    assert txn.counter == (9 << 64) | 11
    assert TxnID(U64, U64).tcid == MAX_TCID
    assert TxnID(U64, U64).counter == MAX_COUNTER


def test_different_coordinators_never_share_an_id() -> None:
    assert TxnID.of(1, 0) != TxnID.of(2, 0)
    assert TxnID.of(1, MAX_COUNTER) < TxnID.of(2, 0)  # ordered by TCID first
    assert TxnID.of(1, 5) < TxnID.of(1, 6)


@pytest.mark.parametrize(
    ("most", "least"),
    [(0, 0), (0, U64), (U64, 0), (U64, U64), (MAX_TCID << 48, 0), (1, 2), (2**63, 2**63 - 1)],
)
def test_str_parse_round_trip(most: int, least: int) -> None:
    txn = TxnID(most, least)
    text = str(txn)
    assert text == f"({most},{least})"
    assert TxnID.parse(text) == txn


def test_parse_accepts_surrounding_whitespace() -> None:
    assert TxnID.parse("  (3,4)\n") == TxnID(3, 4)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "()",
        "(1)",
        "(1,2,3)",
        "1,2",
        "(1,2",
        "1,2)",
        "[1,2]",
        "(a,2)",
        "(1,b)",
        "(-1,2)",
        "(1,-2)",
        "(+1,2)",
        "(1.0,2)",
        "(0x1,2)",
        "(,2)",
        "(1,)",
        "(1 2)",
        "TxnID(1,2)",
    ],
)
def test_parse_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="TxnID"):
        TxnID.parse(text)


@pytest.mark.parametrize("text", ["(\uff11,2)", "(1,\u0662)", "(\u0967,\u0968)"])
def test_parse_rejects_non_ascii_digits(text: str) -> None:
    # parse is documented as the inverse of str, raising ValueError on anything
    # else; str never writes fullwidth / Arabic-Indic / Devanagari digits.
    with pytest.raises(ValueError):
        TxnID.parse(text)


@pytest.mark.parametrize("text", [f"({U64 + 1},0)", f"(0,{U64 + 1})", f"({2**70},{2**70})"])
def test_parse_rejects_out_of_range_halves(text: str) -> None:
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        TxnID.parse(text)


@pytest.mark.parametrize(("most", "least"), [(-1, 0), (0, -1), (U64 + 1, 0), (0, U64 + 1)])
def test_out_of_range_halves_raise(most: int, least: int) -> None:
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        TxnID(most, least)


@pytest.mark.parametrize("tcid", [-1, MAX_TCID + 1, 2**32])
def test_of_rejects_out_of_range_tcid(tcid: int) -> None:
    with pytest.raises(ValueError, match="TCID"):
        TxnID.of(tcid, 0)


@pytest.mark.parametrize("counter", [-1, MAX_COUNTER + 1, 2**128])
def test_of_rejects_out_of_range_counter(counter: int) -> None:
    with pytest.raises(ValueError, match="counter"):
        TxnID.of(0, counter)


def test_txnid_is_immutable_and_hashable() -> None:
    txn = TxnID.of(1, 2)
    with pytest.raises(AttributeError):
        txn.most_bits = 3  # type: ignore[misc]
    assert {txn: "x"}[TxnID.of(1, 2)] == "x"


def test_an_id_is_printed_one_way_whether_a_txnid_or_its_tuple() -> None:
    txnid = TxnID.of(3, 12)
    assert str(txnid) == txn_text(txnid) == txn_text(tuple(txnid)) == f"({txnid[0]},{txnid[1]})"
    assert TxnID.parse(txn_text(tuple(txnid))) == txnid


def test_the_boot_epoch_and_the_sequence_of_an_id() -> None:
    for epoch, sequence in [(0, 0), (1, 5), (3, (1 << 64) - 1), (1 << 40, 7)]:
        txnid = TxnID.issued(9, epoch, sequence)
        assert (txnid.tcid, txnid.epoch, txnid.sequence) == (9, epoch, sequence)
        assert boot_epoch(txnid) == boot_epoch(tuple(txnid)) == epoch
        assert txnid.counter == epoch << 64 | sequence
