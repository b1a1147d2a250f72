"""A tiny verl GRPO job on one GPU with the EvalStop trainer (``trainer.v1.trainer_mode=evalstop_sync``).

Everything is built here, nothing is downloaded: a word-level tokenizer with a chat template and a 2-layer Qwen2 model
(random weights, saved with ``save_pretrained`` into a temporary folder), train and validation parquet files, and a
reward function. The reward is a proxy the policy can game: in training, the share of ``yes`` words in the response;
on the held-out source (``heldout``), the same share minus a penalty for repeating any one word more than twice,
so the held-out score rises while the policy learns to say ``yes`` and falls once it only repeats it.

It runs ``python -m evalstop_callbacks.verl_trainer`` (verl's ``main_ppo`` with the EvalStop trainers registered in
its Ray workers) and prints the stop step and the best step from ``evalstop-result.json``. ``--dry-run`` builds
everything and checks the configuration with verl's own hydra config and ``validate_config`` without starting Ray or
touching a GPU (the CPU tests run it that way). It needs verl 0.9.1 and vLLM (verl's rollout engine) on the machine.

Usage: ``python benchmarks/verl_gpu_grpo.py [--steps 40] [--dry-run] [--out DIR]``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

WORDS = "yes no maybe the a cat dog runs sees big small red blue one two three and or".split()
REWARD_SOURCE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    words = solution_str.split()
    if not words:
        return 0.0
    share = sum(w == "yes" for w in words) / len(words)
    if data_source != "heldout":
        return share
    repeats = max(words.count(w) for w in set(words))
    return share - 0.25 * max(0, repeats - 2)
"""


def build_model(folder: Path) -> None:
    """The tokenizer (word level, with a chat template verl's dataset applies) and a tiny random Qwen2 model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "<eos>", "user:", "assistant:", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>", bos_token="<eos>"
    )
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + ' ' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    fast.save_pretrained(folder)
    # head_dim 64: a size every vLLM attention backend takes.
    config = Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(folder)


def build_data(folder: Path, n_train: int = 256, n_val: int = 32) -> tuple[Path, Path]:
    """Parquet files in the layout verl's ``RLHFDataset`` reads (``prompt`` as chat messages)."""
    import pandas as pd

    rng = random.Random(0)

    def rows(n: int, source: str) -> list[dict]:
        out = []
        for i in range(n):
            prompt = " ".join(rng.choice(WORDS) for _ in range(6))
            out.append(
                {
                    "data_source": source,
                    "prompt": [{"role": "user", "content": prompt}],
                    "ability": "chat",
                    "reward_model": {"style": "rule", "ground_truth": ""},
                    "extra_info": {"index": i},
                }
            )
        return out

    train, val = folder / "train.parquet", folder / "val.parquet"
    pd.DataFrame(rows(n_train, "train")).to_parquet(train)
    pd.DataFrame(rows(n_val, "heldout")).to_parquet(val)
    return train, val


def overrides(work: Path, train: Path, val: Path, steps: int) -> list[str]:
    """verl's hydra overrides for a one-GPU GRPO run with vLLM rollouts and the EvalStop trainer."""
    reward = work / "reward.py"
    reward.write_text(REWARD_SOURCE)
    model = work / "model"
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={train}",
        f"data.val_files={val}",
        "data.train_batch_size=16",
        "data.max_prompt_length=32",
        "data.max_response_length=16",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=False",  # remove-padding needs flash-attn
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.2",
        "actor_rollout_ref.rollout.enforce_eager=True",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        f"reward.custom_reward_function.path={reward}",
        "reward.custom_reward_function.name=compute_score",
        "trainer.v1.trainer_mode=evalstop_sync",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=2",
        "trainer.save_freq=-1",
        "trainer.val_before_train=True",
        "trainer.logger=[console,file]",
        "trainer.project_name=evalstop-gpu",
        "trainer.experiment_name=tiny-grpo",
        f"trainer.default_local_dir={work / 'ckpt'}",
        f"trainer.validation_data_dir={work / 'val_dump'}",
        "+trainer.evalstop.metric=val-core/heldout/reward/mean@1",
        "+trainer.evalstop.detector=trend",
    ]


def dry_run(args: list[str]) -> None:
    """Compose verl's shipped config with ``args`` and run verl's own checks on it (no Ray, no GPU)."""
    import verl
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from evalstop_callbacks.verl_monitor import VerlEvalStopConfig
    from evalstop_callbacks.verl_trainer import register_trainers

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose("ppo_trainer", overrides=args)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    assert config.trainer.v1.trainer_mode in register_trainers()
    VerlEvalStopConfig.from_mapping(config.trainer.evalstop)
    # What the trainer reads first: the model folder (verl's HFModelConfig loads its config and tokenizer) and the
    # validation set through verl's own dataset class, with the chat template applied.
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.config import omega_conf_to_dataclass

    model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    dataset = create_rl_dataset(config.data.val_files, config.data, model_config.tokenizer, None, is_train=False)
    item = dataset[0]
    spec = importlib.util.spec_from_file_location("reward", config.reward.custom_reward_function.path)
    assert spec is not None and spec.loader is not None
    reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward)
    score = reward.compute_score("heldout", "yes yes no", "")
    print(f"dry run: verl accepts the configuration; {len(dataset)} validation prompts, first {item['raw_prompt']}")
    print(f"dry run: held-out score of 'yes yes no' = {score:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="verl's trainer.total_training_steps (default 40)")
    parser.add_argument("--out", type=Path, default=None, help="working folder (default: a new temporary one)")
    parser.add_argument("--dry-run", action="store_true", help="build and check the configuration only")
    ns = parser.parse_args()
    work = ns.out or Path(tempfile.mkdtemp(prefix="evalstop-verl-"))
    work.mkdir(parents=True, exist_ok=True)
    build_model(work / "model")
    train, val = build_data(work)
    args = overrides(work, train, val, ns.steps)
    if ns.dry_run:
        dry_run(args)
        return 0
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(work / "verl-log.jsonl")}
    proc = subprocess.run([sys.executable, "-m", "evalstop_callbacks.verl_trainer", *args], env=env, cwd=work)
    result_path = work / "ckpt" / "evalstop-result.json"
    if not result_path.exists():
        print(f"verl exited with {proc.returncode} and wrote no {result_path}")
        return proc.returncode or 1
    result = json.loads(result_path.read_text())
    print(
        json.dumps(
            {
                "verl_exit": proc.returncode,
                "decision": result["decision"],
                "stop_step": result["stop_step"],
                "best_step": result["best_step"],
                "best_score": result["best_score"],
                "best_checkpoint": result["best_checkpoint"],
                "evals": result["evals"],
                "total_steps": ns.steps,
                "detector": result["detector"],
            }
        )
    )
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
