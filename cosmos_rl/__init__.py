"""cosmos-rl: post-training for Cosmos3-family flow models."""

__version__ = "0.1.0"
