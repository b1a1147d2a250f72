"""The lab: the CPU overoptimization worlds, the recorder of real training runs as traces, and their command.

It lives beside the benchmarks and is not installed with the package (the wheel ships ``evalstop_callbacks`` and
``platform_sim`` only). It builds on the library like any user's code does: on :mod:`evalstop_callbacks` (the
callback, the evaluators) and on the demo's tiny world (:mod:`evalstop_callbacks.demo`: vocabulary, GPT-2 models,
the bag-of-words environment); nothing in the library imports it. Import it with ``benchmarks/`` on the path: the
benchmarks scripts have it there (a script's own folder), the tests through pytest's ``pythonpath`` option, and the
command as ``PYTHONPATH=benchmarks python -m lab ...``.

Its modules, each importing only those listed before it:

- ``worlds``: the sentence worlds' proxy and gold scores (length, keyword, format) and the Llama-style policy;
- ``runs``: what one recorded run is (``RunSpec``); ``envs``: the registry of environments, their grids and splits;
- ``trainers``: the TRL trainer of each run; ``references``, ``train_data``, ``world_evaluators``: reference policies,
  DPO/SFT data and evaluators of the sentence worlds; ``run_worlds``: one run's evaluator, trainer and header;
- ``record``: train and record one run (``python -m lab.record``, one process per run);
- ``cli_traces``, ``cli``: the lab's command (``python -m lab traces record ...``), one module per subcommand.
"""
