"""Research code: the CPU overoptimization environments, the trace recorder of real runs, and the demo.

Nothing in the library part of :mod:`evalstop_callbacks` (callback, evaluators, clients, checkpoints, trace) imports
this subpackage; it builds on the library like any user's code does.
"""
