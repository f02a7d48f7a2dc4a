"""The sentinel's rule for the first death when it wakes after mpiexec killed the others."""
from __future__ import annotations

from fastlib.training import rank_sentinel as rs


def _note(claim, pid, t):
    assert rs._note_wake(str(claim), pid, t) == rs._wake_path(str(claim), pid)


def test_a_sentinel_that_woke_first_by_the_margin_names_its_rank_first(tmp_path):
    claim = tmp_path / "claim"
    _note(claim, 11, 100.0)
    _note(claim, 12, 100.0 + 3 * rs.FIRST_BY)
    _note(claim, 13, 100.0 + rs.FIRST_BY)
    assert rs._woke_first(str(claim), 100.0, [12, 13])
    # the killed ranks' sentinels, looking in turn, are not first
    assert not rs._woke_first(str(claim), 100.0 + rs.FIRST_BY, [11, 12])


def test_sentinels_woken_together_or_a_peer_without_a_note_cannot_tell(tmp_path):
    claim = tmp_path / "claim"
    _note(claim, 12, 100.0 + 0.9 * rs.FIRST_BY)      # within the margin: died together
    assert not rs._woke_first(str(claim), 100.0, [12])
    assert not rs._woke_first(str(claim), 100.0, [99])   # no note: it may still run
    (tmp_path / "claim.woke-98").write_text("garbled")
    assert not rs._woke_first(str(claim), 100.0, [98])


def test_notes_are_removed(tmp_path):
    path = rs._note_wake(str(tmp_path / "claim"), 7, 1.0)
    rs._forget(path, wait=False)
    assert not (tmp_path / "claim.woke-7").exists()
    rs._forget(None)                                    # nothing noted: nothing to do
