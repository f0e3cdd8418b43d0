"""Dummy-weight model presets: the real architecture configs of public models, no weights.

    path = write_model_dir("llama-3.1-8b")         # ~/.cache/hands-on/models/llama-3.1-8b
    # SGLang:      sglang.Engine(model_path=path, load_format="dummy")
    # mini-SGLang: LLM(path, use_dummy_weight=True)

A preset dir holds the model's own ``config.json`` (shapes exactly as published, so kernels see
realistic shapes and timings) and a synthetic byte-level tokenizer: every UTF-8 byte of a
prompt is one token (a prompt of N ASCII characters is N tokens, plus BOS). Its vocabulary
fills every id of the model so any token a random model samples can be detokenized. Users
with real weights pass their own model path instead; nothing here downloads anything.

    python -m common models list
    python -m common models write llama-3.1-8b /tmp/llama31-8b
"""
from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

from common.base.checks import cache_dir, cache_folder

_LLAMA31_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192, "rope_type": "llama3"}
_LLAMA3_SPECIALS = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128008: "<|eom_id|>",
                    128009: "<|eot_id|>"}


def _llama(hidden, inter, layers, heads, kv_heads, **kw):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
            "attention_dropout": 0.0, "mlp_bias": False, "bos_token_id": 128000,
            "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": hidden,
            "intermediate_size": inter, "initializer_range": 0.02, "max_position_embeddings": 131072,
            "num_attention_heads": heads, "num_hidden_layers": layers, "num_key_value_heads": kv_heads,
            "head_dim": 128, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": dict(_LLAMA31_ROPE),
            "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "use_cache": True, "vocab_size": 128256, "transformers_version": "4.43.0.dev0", **kw}


# name -> (config.json, special tokens {id: text}, bos text, eos text, what it is)
PRESETS = {
    "llama-3.1-8b": (_llama(4096, 14336, 32, 32, 8), _LLAMA3_SPECIALS, "<|begin_of_text|>", "<|eot_id|>",
                     "meta-llama/Llama-3.1-8B: 32 layers, GQA 32/8, head_dim 128"),
    "llama-3.1-70b": (_llama(8192, 28672, 80, 64, 8), _LLAMA3_SPECIALS, "<|begin_of_text|>", "<|eot_id|>",
                      "meta-llama/Llama-3.1-70B: 80 layers, GQA 64/8, head_dim 128 (needs TP>=2 on 80 GB GPUs)"),
    "qwen2.5-7b": ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_dropout": 0.0,
                    "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 3584,
                    "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 32768,
                    "max_window_layers": 28, "num_attention_heads": 28, "num_hidden_layers": 28,
                    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                    "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                    "use_cache": True, "use_sliding_window": False, "vocab_size": 152064,
                    "transformers_version": "4.43.1"},
                   {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"},
                   "<|endoftext|>", "<|im_end|>",
                   "Qwen/Qwen2.5-7B: 28 layers, GQA 28/4, head_dim 128, QKV bias"),
    "tiny-llama": (_llama(1024, 3584, 4, 8, 2), _LLAMA3_SPECIALS, "<|begin_of_text|>", "<|eot_id|>",
                   "smoke-test model: Llama-3.1 layout, 4 layers, hidden 1024, GQA 8/2, head_dim 128"),
}


def config(preset: str) -> dict:
    if preset not in PRESETS:
        raise KeyError(f"unknown model preset {preset!r}; choose from {', '.join(PRESETS)}")
    return json.loads(json.dumps(PRESETS[preset][0]))


def param_count(preset_or_config) -> int:
    """Parameters implied by a config (embeddings, attention, MLP, norms, LM head)."""
    c = config(preset_or_config) if isinstance(preset_or_config, str) else preset_or_config
    h, i, v, n = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    d = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    attn = h * q + 2 * h * kv + q * h
    if c.get("model_type") == "qwen2" or c.get("attention_bias"):
        attn += q + 2 * kv
    per_layer = attn + 3 * h * i + 2 * h
    return v * h * (1 if c.get("tie_word_embeddings") else 2) + n * per_layer + h


def kv_bytes_per_token(preset_or_config, dtype_bytes: int = 2) -> int:
    """KV-cache bytes one token occupies across all layers (K and V)."""
    c = config(preset_or_config) if isinstance(preset_or_config, str) else preset_or_config
    d = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * d * dtype_bytes


def random_text(n_chars: int, seed: int) -> str:
    """ASCII words of exactly ``n_chars`` characters: as many tokens with the presets' byte-level tokenizer (+ BOS),
    the same text for the same seed."""
    import random
    rng = random.Random(seed)
    words = []
    while sum(len(w) + 1 for w in words) < n_chars:
        words.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))))
    return " ".join(words)[:n_chars]


def default_dir(preset: str) -> Path:
    return cache_dir() / "models" / preset


def _tokenizer(vocab_size: int, specials: dict, bos: str):
    """Byte-level BPE with no merges: one token per UTF-8 byte; fillers complete the vocab."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.pre_tokenizers import ByteLevel
    alphabet = sorted(ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    fillers = itertools.chain((a + b for a, b in itertools.product(alphabet, repeat=2)),
                              ("".join(t) for t in itertools.product(alphabet, repeat=3)))
    for i in range(len(alphabet), vocab_size):
        vocab[specials[i] if i in specials else next(fillers)] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials.values()])
    bos_id = next(i for i, s in specials.items() if s == bos)
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                       special_tokens=[(bos, bos_id)])
    return tok


def write_model_dir(preset: str, out_dir: str | Path | None = None, tokenizer: bool = True) -> Path:
    """Write config.json (+ a synthetic tokenizer) for ``preset``; reuse an identical existing dir."""
    cfg = config(preset)
    _, specials, bos, eos, _desc = PRESETS[preset]
    out = Path(out_dir) if out_dir else default_dir(preset)
    stamp = hashlib.sha256(json.dumps([cfg, tokenizer], sort_keys=True).encode()).hexdigest()[:16]
    marker = out / ".hands-on-preset"
    if marker.is_file() and marker.read_text().strip() == f"{preset} {stamp}":
        return out
    if out.absolute().is_relative_to(cache_dir().absolute()):     # a cache that cannot be written: one line
        cache_folder(*out.absolute().relative_to(cache_dir().absolute()).parts)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    eos_ids = cfg["eos_token_id"]
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": cfg["bos_token_id"], "eos_token_id": eos_ids, "do_sample": False}))
    if tokenizer:
        _tokenizer(cfg["vocab_size"], specials, bos).save(str(out / "tokenizer.json"))
        (out / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
            "model_max_length": cfg["max_position_embeddings"], "clean_up_tokenization_spaces": False,
            "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant: ",
        }, indent=1))
    marker.write_text(f"{preset} {stamp}\n")
    return out


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m common models", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list the presets")
    w = sub.add_parser("write", help="write a preset model dir")
    w.add_argument("preset", choices=sorted(PRESETS))
    w.add_argument("out", nargs="?", default=None)
    a = p.parse_args(argv)
    if a.cmd == "list":
        for name, (cfg, *_rest, desc) in PRESETS.items():
            print(f"{name:15s} {param_count(cfg) / 1e9:6.2f} B params  {desc}")
    else:
        print(write_model_dir(a.preset, a.out))
    return 0
