"""A manifest resolved into what will launch (`plan`), its rich rendering, what one sample costs
(`media_cost`), and the run directory with its resume rules (`run_dir`)."""
