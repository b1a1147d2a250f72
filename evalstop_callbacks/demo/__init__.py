"""``evalstop demo``: real reward hacking on CPU, stopped by EvalStop, then the simulated platform on real traces.

The demo is built from the library like any user's script (it imports :class:`~evalstop_callbacks.EvalStopCallback`
and the simulator's replay), in these modules, each importing only those listed before it:

- ``tiny``: the tiny world's vocabulary, shipped corpus, word-level tokenizer and GPT-2 models, all built in code
  (nothing is downloaded); ``sampling``: seeded completions in and out of a policy;
- ``proxy``: the learned bag-of-words proxy reward (and the same function as a reward-model module for PPO);
- ``overopt``: the environment: the hidden gold score, the fitted proxy, the held-out evaluator, the on-disk cache;
- ``training``: the GRPO trainer (TRL) on CPU;
- ``run``: the demo itself (train, stop, restore, plot, replay the shipped ``real`` corpus on the simulator);
- ``command``: its flags, ``main(argv)`` for ``evalstop demo``.

It needs the ``demo`` extra (``pip install 'evalstop[demo]'``: TRL, transformers, datasets and matplotlib). The
tests and the examples use ``tiny`` and ``overopt`` as their small real models; the lab (``benchmarks/lab``) builds
its recorded worlds on them.
"""
