"""Override lists shared by the DPO tests that launch real runs: the smoke manifest cut down to a
few small steps (16 synthetic pairs, 4 a step, no progress bar, every checkpoint kept)."""

DPO_SMALL = [
    "rl.pairs_per_step=4",
    "rl.data.synthetic_pairs=16",
    "checkpoint.every=2",
    "checkpoint.keep=0",
    "job.progress=false",
]
# ... with a held-out pass every 2 steps over 4 of 8 synthetic validation pairs.
DPO_SMALL_WITH_VALIDATION = [
    *DPO_SMALL,
    "rl.validation.every=2",
    "rl.validation.max_pairs=4",
    "rl.validation.data.synthetic_pairs=8",
]
