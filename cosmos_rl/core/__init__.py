"""The base layer every other layer may use: errors and exit codes, seeds, flow matching, what a
sample is (`media`), the manifest schema, problems, paths, metrics sinks and the run lock."""
