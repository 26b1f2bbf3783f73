"""Every command of the CLI (`cli.py` parses and calls these): launch (train, resume), eval,
export, report, compare, pairs mine, the docs generator and the shapes bases' builds."""
