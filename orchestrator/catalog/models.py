"""Model presets: the shape fields of ``model:`` in a spec, each preset with its source.

A preset only fills fields; anything the user writes under ``model:`` overrides it.
"""
from __future__ import annotations

_GPT = {"seq_length": 2048, "vocab_size": 51200, "gated_mlp": False, "tie_embeddings": True,
        "normalization": "layernorm", "position_embedding": "learned", "add_bias_linear": True}
_NARAYANAN = "Narayanan et al. 2021 (SC21, arXiv 2104.04473) Table 1"
_LLAMA = {"gated_mlp": True, "tie_embeddings": False, "normalization": "rmsnorm",
          "position_embedding": "rope", "add_bias_linear": False}


def _gpt(layers: int, hidden: int, heads: int, source: str = _NARAYANAN) -> dict:
    return {**_GPT, "num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "_source": source}


def _llama(layers, hidden, heads, groups, ffn, vocab, seq, source) -> dict:
    return {**_LLAMA, "num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "num_query_groups": groups, "ffn_hidden_size": ffn, "vocab_size": vocab,
            "seq_length": seq, "_source": source}


def _moe(dense: dict, experts: int, topk: int, expert_ffn: int, aux_loss: float, source: str, **extra) -> dict:
    """A MoE preset: a Llama-style body whose MLPs are routed experts (every layer, dropless)."""
    moe = {"num_experts": experts, "router_topk": topk, "ffn_hidden_size": expert_ffn,
           "aux_loss_coeff": aux_loss}
    return {**dense, **extra, "moe": moe, "_source": source}


def _long(base: dict, seq: int, source: str) -> dict:
    """A long-context variant: the same shape trained at a longer sequence (RoPE scaled)."""
    return {**base, "seq_length": seq, "_source": source}


_MIXTRAL = "Jiang et al. 2024, Mixtral of Experts (arXiv 2401.04088) Table 1; HF config.json"
_QWEN3 = "Qwen3 Technical Report (arXiv 2505.09388) Table 2; HF config.json (head_dim 128, moe_intermediate_size)"
_LLAMA31 = "Llama 3 Herd of Models (arXiv 2407.21783) Table 3 and section 3.4.2 (long-context stage: 128K)"

MODELS: dict[str, dict] = {
    "gpt3-1.7b": _gpt(24, 2304, 24),
    "gpt3-3.6b": _gpt(30, 3072, 32),
    "gpt3-7.5b": _gpt(36, 4096, 32),
    "gpt3-18b": _gpt(40, 6144, 48),
    "gpt3-39b": _gpt(48, 8192, 64),
    "gpt3-76b": _gpt(60, 10240, 80),
    "gpt3-145b": _gpt(80, 12288, 96),
    "gpt3-310b": _gpt(96, 16384, 128),
    "gpt3-530b": _gpt(105, 20480, 128),
    "gpt3-1t": _gpt(128, 25600, 160),
    "gpt3-175b": {**_gpt(96, 12288, 96, "Brown et al. 2020 (arXiv 2005.14165) Table 2.1; GPT-2 BPE vocab"),
                  "vocab_size": 50257},
    "llama2-7b": _llama(32, 4096, 32, 32, 11008, 32000, 4096, "Touvron et al. 2023 (Llama 2), HF config"),
    "llama2-13b": _llama(40, 5120, 40, 40, 13824, 32000, 4096, "Touvron et al. 2023 (Llama 2), HF config"),
    "llama2-70b": _llama(80, 8192, 64, 8, 28672, 32000, 4096, "Touvron et al. 2023 (Llama 2), HF config"),
    "llama3-8b": _llama(32, 4096, 32, 8, 14336, 128256, 8192, "Meta Llama 3 (2024), HF config"),
    "llama3-70b": _llama(80, 8192, 64, 8, 28672, 128256, 8192, "Meta Llama 3 (2024), HF config"),
    "llama3-405b": _llama(126, 16384, 128, 8, 53248, 128256, 8192,
                          "Llama 3 Herd of Models (arXiv 2407.21783) Table 3"),
    "mistral-7b": _llama(32, 4096, 32, 8, 14336, 32000, 8192, "Jiang et al. 2023 (arXiv 2310.06825) Table 1"),
    "mixtral-8x7b": _moe(_llama(32, 4096, 32, 8, 14336, 32000, 4096, _MIXTRAL), 8, 2, 14336, 0.02, _MIXTRAL),
    "mixtral-8x22b": _moe(_llama(56, 6144, 48, 8, 16384, 32768, 4096, _MIXTRAL), 8, 2, 16384, 0.001, _MIXTRAL),
    "qwen3-30b-a3b": _moe(_llama(48, 2048, 32, 4, 6144, 151936, 4096, _QWEN3), 128, 8, 768, 0.001, _QWEN3,
                          kv_channels=128),
    "qwen3-235b-a22b": _moe(_llama(94, 4096, 64, 4, 12288, 151936, 4096, _QWEN3), 128, 8, 1536, 0.001, _QWEN3,
                            kv_channels=128),
    "llama3-8b-128k": _long(_llama(32, 4096, 32, 8, 14336, 128256, 8192, _LLAMA31), 131072, _LLAMA31),
    "llama3-70b-128k": _long(_llama(80, 8192, 64, 8, 28672, 128256, 8192, _LLAMA31), 131072, _LLAMA31),
    "llama3-405b-128k": _long(_llama(126, 16384, 128, 8, 53248, 128256, 8192, _LLAMA31), 131072, _LLAMA31),
    "llama2-7b-32k": _long(_llama(32, 4096, 32, 32, 11008, 32000, 4096, "Touvron et al. 2023 (Llama 2), HF config"),
                           32768, "Llama 2 7B shape at 32K context (Xiong et al. 2023, Effective Long-Context "
                           "Scaling, arXiv 2309.16039)"),
    # Small enough to train for real on a laptop CPU in seconds (the demo and the integration tests).
    "tiny-gpt": {**_GPT, "num_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "vocab_size": 512,
                 "seq_length": 128, "_source": "orch's CPU test model"},
    # The same with 4 routed experts (top-2) in every layer: trains with expert parallelism on CPU.
    "tiny-moe": {**_GPT, "num_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "vocab_size": 512,
                 "seq_length": 128, "moe": {"num_experts": 4, "router_topk": 2, "ffn_hidden_size": 256,
                                            "aux_loss_coeff": 0.01},
                 "_source": "orch's CPU test model"},
}


def preset_fields(name: str) -> dict:
    """The spec fields of a preset (without its source note)."""
    return {k: v for k, v in MODELS[name].items() if not k.startswith("_")}
