"""Proof-of-rollouts verdicts in the run state (``hubgrpo.coordinator.verdicts``): bounded, never losing an
exclusion."""

from __future__ import annotations

def test_state_keeps_every_failed_verdict_and_the_newest_passed_ones(monkeypatch):
    from hubgrpo.coordinator import verdicts
    from hubgrpo.layout import RunState, VerdictRecord, VerdictReport

    monkeypatch.setattr(verdicts, "MAX_KEPT", 4)
    state = RunState(run_id="r", project_name="p")

    def verdict(i: int, passed: bool) -> VerdictRecord:
        report = VerdictReport(passed=passed, completions=1, tokens=2, checked=2, mismatches=0 if passed else 2)
        return VerdictRecord(submission_id=f"w{i}-l", worker=f"w{i}", report=report, at=float(i))

    verdicts.apply(state, {v.submission_id: v for v in [verdict(0, False), *(verdict(i, True) for i in range(1, 4))]})
    saved = verdicts.apply(state, {v.submission_id: v for v in [verdict(4, True), verdict(5, False)]})
    assert saved == {"w4-l", "w5-l"}
    assert [v.worker for v in state.verdicts] == ["w0", "w3", "w4", "w5"]  # w1, w2: the oldest passed ones
    assert verdicts.excluded(state) == {"w0", "w5"}
