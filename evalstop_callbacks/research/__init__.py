"""The lab: the CPU overoptimization environments, the trace recorder of real runs, the demo and the ``evalstop``
command. It builds on the library like any user's code does; nothing in the library part of
:mod:`evalstop_callbacks` imports it.

Its modules, each importing only those listed before it:

- ``tiny``: the tiny world's vocabulary, corpus, tokenizer and GPT-2 models; ``sampling``: completions in and out;
- ``proxy``: the learned bag-of-words proxy; ``overopt``: the bag-of-words environment (gold, proxy, evaluator, cache);
- ``worlds``: the sentence worlds' proxy and gold scores (length, keyword, format) and the Llama-style policy;
- ``runs``: what one recorded run is (``RunSpec``); ``envs``: the registry of environments, their grids and splits;
- ``trainers``: the TRL trainer of each run; ``references``, ``train_data``, ``world_evaluators``: reference policies,
  DPO/SFT data and evaluators of the sentence worlds; ``run_worlds``: one run's evaluator, trainer and header;
- ``record``: train and record one run (``python -m evalstop_callbacks.research.record``); ``demo``: ``evalstop demo``;
- ``cli_args``, ``cli_demo``, ``cli_traces``, ``cli``: the ``evalstop`` command, one module per subcommand.
"""
