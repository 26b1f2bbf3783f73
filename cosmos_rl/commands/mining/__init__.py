"""`cosmos-rl pairs mine`: a model's own rollouts, scored by a reward, turned into DPO preference pairs.

`select` holds the pure rule (best vs worst of a prompt's samples, ties dropped), `shards` the
webdataset writer, and `command` the sampling loop that joins them.
"""
