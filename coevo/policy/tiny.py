"""Tiny models for tests: a Qwen2-architecture LM with random weights and a locally built
byte-level BPE tokenizer with a ChatML template, both deterministic from a seed, ready in
about a second. Nothing is downloaded."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# A fixed corpus, so the learned merges (and therefore token ids) never change.
_CORPUS = [
    "You are a careful problem solver. Think step by step, use the tools when they help.",
    'To call a tool, write <tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3"}}</tool_call>',
    "Give your final answer as <answer>42</answer>. What is 17 * 3 + 4? The answer is 55.",
    "system user assistant tool result error python print(sum(range(10)))",
    " ".join(str(i) for i in range(200)),
]


def tiny_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A PreTrainedTokenizerFast: byte-level BPE trained on a fixed corpus, ChatML specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    fast.chat_template = CHATML
    return fast


def tiny_model(tokenizer: PreTrainedTokenizerBase, seed: int = 0, hidden_size: int = 64, layers: int = 2,
               arch: str = "qwen2") -> PreTrainedModel:
    """A randomly initialised causal LM (``qwen2`` or ``llama``) sized to ``tokenizer``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    archs = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}
    if arch not in archs:
        raise ValueError(f"arch must be one of {sorted(archs)}, got {arch!r}")
    config_cls, model_cls = archs[arch]
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = model_cls(config).float()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def tiny_policy(seed: int = 0, **kwargs: Any):
    """A TransformersPolicy over a tiny random model, for tests of everything downstream."""
    from coevo.policy.hf import TransformersPolicy

    tok = tiny_tokenizer()
    return TransformersPolicy(tiny_model(tok, seed=seed), tok, model_version="tiny-0", seed=seed, **kwargs)
