"""EvalStop where people fine-tune from a YAML file: an Axolotl plugin and a LLaMA-Factory entry point.

- :mod:`~evalstop_callbacks.integrations.axolotl`: ``EvalStopPlugin``, loaded by Axolotl's ``plugins:`` list, with
  ``evalstop_*`` keys in the Axolotl config.
- :mod:`~evalstop_callbacks.integrations.llamafactory`: ``evalstop llamafactory train config.yaml``, LLaMA-Factory's
  own YAML with an ``evalstop:`` section.
- :mod:`~evalstop_callbacks.integrations.options`: the options both read, checked before training starts.

Each framework module imports its framework; this package and ``options`` import neither.
"""
