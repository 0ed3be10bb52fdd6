"""Write the seed corpus of fuzz_llama_config.c, tests/c_api/fuzz/llama_seeds/: small
config.json texts of each family as transformers writes them (LlamaConfig, Qwen2Config,
Qwen3Config, MistralConfig .to_json_string(), as save_pretrained does: the fields that differ
from the defaults), among them Llama 3.1's rope_parameters llama3, Qwen's layer_types and
sliding windows, and written out in the older layout transformers 4 wrote (rope_theta beside
rope_scaling, the llama3 dict under "type"), and the whole dicts (use_diff=False).

    python tests/c_api/fuzz/make_llama_seeds.py [folder]

Needs transformers (5.x writes rope_parameters). Deterministic: the same files every run."""

import json
import os
import sys

import transformers as t

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=8192)

# (file, config class, architecture, arguments)
BUILT = [
    ("llama.json", t.LlamaConfig, "LlamaForCausalLM", dict(tie_word_embeddings=True)),
    ("llama31.json", t.LlamaConfig, "LlamaForCausalLM",
     dict(rope_parameters=dict(LLAMA3, rope_theta=500000.0), max_position_embeddings=131072,
          rms_norm_eps=1e-5)),
    ("qwen2.json", t.Qwen2Config, "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    ("qwen2_sliding.json", t.Qwen2Config, "Qwen2ForCausalLM",
     dict(use_sliding_window=True, sliding_window=8, max_window_layers=0)),
    ("qwen3.json", t.Qwen3Config, "Qwen3ForCausalLM", dict(head_dim=16)),
    ("qwen3_sliding.json", t.Qwen3Config, "Qwen3ForCausalLM",
     dict(use_sliding_window=True, sliding_window=8, max_window_layers=0, head_dim=8)),
    ("mistral.json", t.MistralConfig, "MistralForCausalLM", dict(sliding_window=4)),
    ("mistral_full.json", t.MistralConfig, "MistralForCausalLM",
     dict(sliding_window=None, head_dim=None)),
]

# transformers 4's layout, written out: rope_theta at the top, rope_scaling beside it
WRITTEN = [
    ("llama31_v4.json", dict(
        architectures=["LlamaForCausalLM"], model_type="llama", **SMALL, hidden_act="silu",
        max_position_embeddings=131072, rms_norm_eps=1e-05, rope_theta=500000.0,
        rope_scaling=LLAMA3, attention_bias=False, mlp_bias=False, pretraining_tp=1,
        tie_word_embeddings=False, torch_dtype="bfloat16", transformers_version="4.45.0",
        bos_token_id=128000, eos_token_id=[128001, 128008, 128009], _name_or_path="x")),
    ("llama_type_v4.json", {
        "model_type": "llama", **SMALL, "rope_theta": 1e4, "head_dim": None,
        "num_key_value_heads": None, "use_cache": True, "attention_dropout": 0.0,
        "rope_scaling": {"type": "llama3",
                         **{k: v for k, v in LLAMA3.items() if k != "rope_type"}}}),
    ("qwen2_v4.json", dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", **SMALL, hidden_act="silu",
        max_position_embeddings=32768, max_window_layers=21, rms_norm_eps=1e-06,
        rope_theta=1000000.0, rope_scaling=None, sliding_window=32768, use_sliding_window=False,
        tie_word_embeddings=True, torch_dtype="bfloat16", use_cache=True)),
    ("mistral_v4.json", dict(
        architectures=["MistralForCausalLM"], model_type="mistral", **SMALL, head_dim=8,
        max_position_embeddings=32768, rms_norm_eps=1e-05, rope_theta=1000000.0,
        sliding_window=None, layer_types=["full_attention", "full_attention"],
        tie_word_embeddings=False)),
]


def main(folder):
    os.makedirs(folder, exist_ok=True)
    for name, cls, arch, extra in BUILT:
        config = cls(**{**SMALL, **extra}, architectures=[arch])
        with open(os.path.join(folder, name), "w") as f:
            f.write(config.to_json_string())
    name, cls, arch, extra = BUILT[1]
    with open(os.path.join(folder, "llama31_whole.json"), "w") as f:
        f.write(cls(**{**SMALL, **extra}, architectures=[arch]).to_json_string(use_diff=False))
    for name, config in WRITTEN:
        with open(os.path.join(folder, name), "w") as f:
            json.dump(config, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "llama_seeds"))
