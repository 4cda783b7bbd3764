"""The numbers a costed drafter (costed.py) decides with, each beside the measurement that set it.

They live apart from the code so that costed.py reads as the decision and this file as its evidence;
costed.py imports every one by name, so a test may still patch or import them from there."""

RATE_KEEP = 0.9  # per round: the weight of the earlier rounds in the rate estimate
# A costed round must promise this much more than a plain target step (see ngram.NGRAM_MIN_GAIN).
# Was 0.15 ("a wrong yes also pays for the draft steps"), but the rate it is compared with is an
# expected yield from calibrated confidences over median step costs, not a noisy measurement, and
# on the dev CPU the 0.5B draft alone gains 3-22 % per category: a 15 % margin left `auto` without
# it wherever it paid. Pinned-cost replay of the shipped sets (docs/speed.md): `auto` over its best
# single source 0.966 -> 0.982 with 0.05, no category slower.
MODEL_MIN_GAIN = 0.05
CATCH_UP = 2  # tokens a draft catch-up step holds when the drafter is used round after round
# A probe may pay a catch-up costing at most this many 1-token target steps beyond a round's usual
# one (measured step costs). Beyond it the draft's cache is cold: its prompt prefill has not run (it
# runs when a round first uses the draft, so the first token never waits for it), or many plain rounds
# have passed since it last ran, and a probe would pay that mid-decode to learn a rate that earlier
# requests already estimate; a cold drafter is used only when that estimate, with the catch-up priced
# in (catch_up_rate), clears its margin. Bounded by cost, not tokens: on the 2-core dev CPU a 60-token
# catch-up of the 0.5B draft costs ~5 target steps (four such probes were 10 % of a short chat reply),
# on a GPU about one.
PROBE_CATCH_UP_STEPS = 1.0
FIRST_LOOK_ROUNDS = 8  # rounds an engine's draft must have run before cold probes stop
# A reply's length before any has been seen (the CLI's and bench's default max_new_tokens), and the
# weight of the earlier replies in the running estimate, per request. The estimate is the horizon
# over which a catch-up is paid back (CostedDrafter.catch_up_rate).
REPLY_PRIOR = 128
REPLY_KEEP = 0.75
# Tokens a streak of its rounds (rounds in a row that used it) wrote, before any streak has ended,
# and the weight of the earlier streaks per streak. Once caught up on the prompt, a draft that `auto`
# uses between other sources' rounds pays a catch-up over their text at every return, so that
# catch-up is paid back only over the streak that follows it, not over the rest of the reply.
STREAK_PRIOR = 32
STREAK_KEEP = 0.75
# The share of a reply its rounds wrote, in the recent requests where it drafted at all (1 for
# `--draft model`; less under `auto`, which gives the copies to the suffix index): a cold prompt
# prefill is paid back only over that share of the reply left.
SHARE_PRIOR = 1.0
SHARE_EVIDENCE = 16  # tokens of this reply that weigh as much as the recent requests' share (request_share)
PRIOR_K_MAX = 4  # the longest chain a request's starting estimate assumes (capability_round)
# A cold prompt prefill (the draft's first round in a request) is a one-off bet on the rest of the
# reply, priced with guesses (the reply's length, the share the draft will write), and a wrong yes
# costs all of it: a 190-token prompt is ~18 target steps of the 0.5B draft on the 2-core dev CPU.
# So `auto` (quote) waits until the reply has written PREFILL_WAIT tokens (a reply the suffix index
# copies shows itself in its first rounds: code completion paid that prefill in its first round for
# 2-4 draft tokens), prices the cold round from this reply's evidence (cold_rate) and, where a round
# path reports none (observe: trees and batches do not), asks it for PREFILL_MIN_GAIN over a plain step
# (refactoring paid 574 ms of prefill on a quote from other texts 7 % over the target's and ran 18 %
# behind the suffix index alone; with the reply's own evidence the 5 % of any model round is enough:
# pinned-cost replay of the shipped sets 1.011 -> 1.018 of the best source), and
# lets a fresh engine's first looks pay FIRST_LOOK_PREFILLS such prefills, only in a reply other
# sources wrote at most FIRST_LOOK_SHARE of (a replay whose first requests were summaries paid it in
# three of them, for a round or two each: 0.74x the suffix index alone).
# And a draft left unused for RELOOK_REQUESTS requests in a row gets such a look again: its estimate
# only moves when it runs, and between requests it sinks toward a prior that does not clear a cold
# prefill's margin, so without one the draft, once given up, stayed unused for good (measured: in the
# second pass over the `code` set `auto` never ran it, 0.91x the draft alone on code writing).
PREFILL_WAIT = 8
PREFILL_MIN_GAIN = 0.10
FIRST_LOOK_PREFILLS = 1
FIRST_LOOK_SHARE = 0.5
RELOOK_REQUESTS = 4
# How well the draft will do on *this* reply, before it has run in it: the target's own confidence in
# the tokens it wrote (its softmax probability of each, free from the verify's logits) predicts the
# draft's agreement token by token. Measured on the real pair over the shipped and held-out sets
# (greedy, 3,095 reply tokens of 32 prompts): where the target's confidence was 0.4-0.6 the draft
# agreed 51 %, 0.6-0.8 68 %, 0.8-0.9 88 %, 0.97-0.99 97 %, above 0.99 99.8 %; a reply's mean
# confidence over its first 16 tokens correlates 0.84 with the draft's agreement over the whole reply.
# The ratio of the draft's accepted tokens to the target's confidence at the positions it was judged
# on calibrates that for another pair (CAL_PRIOR judged tokens of ratio 1 before evidence), and
# TCONF_EVIDENCE reply tokens weigh as much as its long-run acceptance.
CAL_PRIOR = 32.0
TCONF_EVIDENCE = 16.0
# Reply tokens whose confidence is scored at most, while the draft has not run in the reply: each is a
# softmax over the vocabulary (~0.3 ms at Qwen's 152k on the dev CPU, 1 % of a target step), paid on
# every token of a reply the draft never runs in; by TCONF_MAX tokens the reply's evidence already
# carries TCONF_MAX / (TCONF_MAX + TCONF_EVIDENCE) = 80 % of the weight. Measured before the cap
# (pinned-cost replay, loop counted): `auto`'s own loop 1.1 ms per decoded token, the suffix index
# alone's 0.5 ms, the target alone's 0.3 ms.
TCONF_MAX = 64
# How its rounds did against the other sources' rounds (copies, plain steps) in the same replies, per
# octave of prompt length (prompt_octave): its rounds' tokens per second (draft steps, catch-ups,
# verify; not the prompt's prefill) over the others' (their verify), summed over the requests it ran
# in, REPLY_KEEP per request. Under 1 (from EDGE_MIN_ROUNDS of its rounds on), it scales a cold quote
# (`edge`): in such replies its rounds took positions the others wrote faster, and its prefill buys
# nothing. Per octave because how much of a reply copies follows the prompt's length. Measured on the
# shipped sets (pinned-cost replay at the 2026-12-02 run's step costs): replies to 128+ token prompts
# ran slower with the draft alone than with the suffix index alone (0.36-0.88x); refactoring copies
# only after 11-19 tokens, too late for request_share to stop the prefill, and `auto` paid it in
# every refactoring and summary reply: 0.94 and 0.81 of the suffix index alone.
EDGE_MIN_ROUNDS = 8
