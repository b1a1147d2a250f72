"""``EvalStopCallback()`` with no arguments on a plain ``Trainer``: stop an overfitting run on its eval loss (CPU).

A tiny GPT-2 (pretrained locally) is fine-tuned on sentences with negative adjectives while the eval set holds
positive ones, so the eval loss soon rises. The callback takes the trainer's own metric (``eval_loss``, or
``metric_for_best_model``) and cadence (``eval_strategy="steps"``, ``eval_steps``), evaluates at step 0 first, stops
after 2 consecutive rises and loads the best weights back. The ``evalstop/*`` keys are in ``trainer.state.log_history``
and reach every ``report_to`` backend (``--report-to tensorboard`` where it is installed).

    .venv/bin/python examples/trainer_evalstop.py
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-steps", type=int, default=40, help="steps if EvalStop never stops (default 40)")
    parser.add_argument("--eval-steps", type=int, default=2, help="the trainer's eval_steps (default 2)")
    parser.add_argument("--report-to", default="none", help="the trainer's report_to (default none)")
    parser.add_argument("--out", default=None, help="output folder (default: a temporary folder)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("EVALSTOP_THREADS", "1")))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, PrinterCallback, Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    from evalstop_callbacks import EvalStopCallback
    from evalstop_callbacks.demo.tiny import VOCAB, build_policy, build_tokenizer, pretrain_policy

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    tok = build_tokenizer()
    model = pretrain_policy(build_policy(tok), tok, steps=150)
    rng = random.Random(0)

    def lines(adjectives, n):
        return [
            f"the {rng.choice(VOCAB.train_nouns)} is {rng.choice(adjectives)} and {rng.choice(adjectives)} ."
            for _ in range(n)
        ]

    def encode(texts):
        return Dataset.from_dict({"text": texts}).map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])

    callback = EvalStopCallback()
    config = TrainingArguments(
        output_dir=args.out or tempfile.mkdtemp(prefix="evalstop-trainer-"),
        max_steps=args.max_steps,
        per_device_train_batch_size=8,
        learning_rate=5e-3,
        eval_strategy="steps",
        eval_steps=args.eval_steps,
        logging_steps=args.eval_steps,
        save_strategy="no",
        use_cpu=True,
        report_to=args.report_to,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(
        model=model,
        args=config,
        train_dataset=encode(lines(VOCAB.negative, 64)),
        eval_dataset=encode(lines(VOCAB.positive, 32)),
        data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
        callbacks=[callback],
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()

    print("step  eval_loss  declines  action")
    for h in callback.history:
        print(f"{h['step']:>4}  {-h['eval_score']:>9.4f}  {h['declines']:>8}  {h['action']}")
    where = f"restored from {callback.restored_from}" if callback.restored_from else "nothing to restore"
    print(
        f"stopped at step {callback.stopped_at}; best step {callback.best_step} "
        f"(eval_loss {-callback.best_score:.4f}); {where}"
    )
    print(f"eval_loss of the model in memory: {trainer.evaluate()['eval_loss']:.4f}")
    logged = [e["step"] for e in trainer.state.log_history if "evalstop/eval_score" in e]
    print(f"evalstop/eval_score in log_history at steps {logged}")


if __name__ == "__main__":
    main()
