"""TRL 1.12 PPO pieces for the callback's PPO test and example: an anti-gold reward module and the trainer."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn


def word_count_reward_model(tokenizer, weights: dict[str, float]) -> nn.Module:
    """A reward module with the layout PPOTrainer reads (``base_model_prefix`` backbone + ``score``).

    The backbone returns running one-hot word counts, ``score`` weights them: the value at the last token is the sum
    of the weights of the words in prompt + response.
    """
    vocab_size = len(tokenizer)
    w = torch.zeros(vocab_size)
    for word, value in weights.items():
        w[tokenizer.convert_tokens_to_ids(word)] = value

    class _Counts(nn.Module):
        def forward(self, input_ids, attention_mask=None, **kwargs):
            onehot = nn.functional.one_hot(input_ids, vocab_size).float()
            if attention_mask is not None:
                onehot = onehot * attention_mask.unsqueeze(-1).float()
            return SimpleNamespace(hidden_states=(onehot.cumsum(1),))

    class _WordCountReward(nn.Module):
        base_model_prefix = "backbone"

        def __init__(self) -> None:
            super().__init__()
            self.backbone = _Counts()
            self.score = nn.Linear(vocab_size, 1, bias=False)
            with torch.no_grad():
                self.score.weight.copy_(w.unsqueeze(0))
            self.requires_grad_(False)

    return _WordCountReward()


def ppo_trainer(out_dir, policy, tokenizer, prompts, reward_weights, callbacks, max_steps=16, lr=3e-3, **kw):
    """A TRL 1.12 PPOTrainer on CPU: batch 16, one PPO epoch, no KL penalty (so the proxy can be hacked)."""
    from datasets import Dataset
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    from evalstop_callbacks.demo.tiny import build_scalar_model

    ds = Dataset.from_dict({"input_ids": [tokenizer(p)["input_ids"] for p in prompts]})
    batch = 16
    args = PPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=batch,
        num_mini_batches=1,
        num_ppo_epochs=1,
        total_episodes=batch * max_steps,
        response_length=8,
        learning_rate=lr,
        kl_coef=0.0,
        use_cpu=True,
        bf16=False,
        report_to="none",
        disable_tqdm=True,
        num_sample_generations=0,
        save_strategy="no",
        seed=0,
        stop_token="eos",
        **kw,
    )
    ref = type(policy)(policy.config)
    ref.load_state_dict(policy.state_dict())
    return PPOTrainer(
        args=args,
        processing_class=tokenizer,
        model=policy,
        ref_model=ref,
        reward_model=word_count_reward_model(tokenizer, reward_weights),
        value_model=build_scalar_model(tokenizer),
        train_dataset=ds,
        callbacks=callbacks,
    )
