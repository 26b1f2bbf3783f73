"""Imported by every Python worker of a local cluster that warms its workers, before the worker takes
work (Ray's `preload_python_modules`, set by `dist.warm_workers.system_config`): the stack's imports.
Importing this module is the whole point; it never raises."""

from cosmos_rl.dist.warm_workers import preload

FINISHED_AT = preload()
