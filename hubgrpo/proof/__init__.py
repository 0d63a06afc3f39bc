"""Proof of rollouts: a round's completions can be replayed, so a verifier can show the leased policy wrote them.

- ``noise``: keyed Gumbel noise, the same on every device (a counter-based integer hash, no ``torch.Generator``).
- ``sampling``: the logits processor that makes greedy decoding sample (Gumbel-max) with that noise, and the
  ``generate`` wrapper the worker's trainer uses (``hubgrpo.worker.keyed``).
- ``verify``: one teacher-forced forward over sampled completions; a verdict per batch.
- ``selection``: which completions to replay, chosen after submission with the coordinator's secret.

Numbering — the one place that defines what keys a token's noise (the worker and the verifier both follow it):

- seed: the lease's ``seed`` (``Lease.seed``, signed 64-bit).
- completion index: the completion's place in the round, counted from 0 across the round's generation batches in
  the order TRL generates them — which is the order of ``rollouts.json.gz`` (batch ``b``, row ``r`` of a round
  generating ``n`` completions per batch: ``b × n + r``). It restarts at 0 every round.
- position: the number of completion tokens before the token (0 for the first completion token); the prompt and
  its padding do not count.
- vocab index: the token id.

What a replay needs, and where this foundation stops:

- the token ids: a verifier replays ids, not text (re-tokenising a completion need not give the sampled ids);
  ``hubgrpo.worker.keyed.KeyedBatch`` holds them on the worker, and the rollouts file (schema 2) carries each
  completion's prompt ids and completion ids (``RolloutBatch.prompt_ids`` / ``completion_ids``).
- the policy of each generation batch: batch 0 of a round is sampled by the leased version; in a round of several
  steps, batch ``b`` is sampled by the adapter after ``b`` local steps, which only the worker holds. Replaying a
  later batch against the leased version flags it, so the verifier replays batch 0 only: in a round of several
  steps, the later batches are not checked, and a worker could forge them unseen (unless those adapters travel
  with the round one day).
- where a completion ends: the completion ids are what TRL keeps of a generated row, up to and including its first
  stop token (``GRPOTrainer.eos_token_ids``), without padding; a row that reached ``max_completion_length`` has no
  stop token. The verifier replays the stop token like any token and refuses any other ending
  (``verify.endings``).
- the processors before the warpers: a repetition penalty (or any other processor ``generate`` builds) is applied
  on the worker but not replayed by ``verify_completions``.
"""
