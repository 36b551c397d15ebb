"""benchmarks.ledger_scale at tiny sizes: PAASO releases listed, composed (one statement
per configuration) and written at two counts, with a per-release ratio for each step; bad
sizes are one line before any work."""

from __future__ import annotations

import re

import pytest

from benchmarks import ledger_scale
from tests.argv import refused


def test_both_counts_are_measured_and_compared(capsys):
    ledger_scale.main(["--sizes", "6", "20", "--distinct", "2"])
    out = capsys.readouterr().out
    assert "ledger of PAASO releases (2 distinct events)" in out
    rows = re.findall(r"^  (add|compose|write) +[\d.]+ms +[\d.]+ms +[\d.]+$", out, re.M)
    assert rows == ["add", "compose", "write"]
    assert "for 6," in out and "for 20" in out


def test_write_records_the_table_in_its_section(capsys, monkeypatch):
    from benchmarks import _results

    written = {}
    monkeypatch.setattr(_results, "write_section", lambda name, text: written.update({name: text}))
    ledger_scale.main(["--sizes", "4", "9", "--distinct", "1", "--write"])
    text = written["ledger_scale"]
    assert "`python -m benchmarks.ledger_scale --sizes 4 9 --distinct 1`" in text
    assert "| step | ms per release at 4 | at 9 | ratio |" in text and "| compose |" in text


def test_the_releases_are_paasos_one_per_configuration():
    made = ledger_scale.releases(7, 3)
    assert len({r.data for r in made}) == 7 and len({r.fingerprint for r in made}) == 7
    assert all(r.private and r.unit == "client" for r in made)
    assert len({repr(r.groups[0][1]) for r in made}) == 3  # three swarm sizes, three events


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes", "10", "10"], "--sizes: the large count must exceed the baseline's"),
        (["--sizes", "0", "10"], "--sizes"),
        (["--distinct", "0"], "--distinct"),
    ],
)
def test_bad_sizes_are_one_line_before_any_work(argv, message, capsys):
    assert message in refused(ledger_scale.main, argv, capsys)
