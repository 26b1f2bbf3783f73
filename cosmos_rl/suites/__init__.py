"""The worlds' plugins: what ties a world (its prompts, verifier, first frames) to models, such as
the shipped `shapes` and `shapes_video` base presets and their held-out scorers."""
