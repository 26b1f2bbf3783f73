"""The Push-T world: gym-pusht's simulator (pymunk physics) as the ground truth a world model's
predicted futures are judged against. Cosmos3's `pusht` embodiment: one action row per frame, the
agent's target position (2 wide)."""
