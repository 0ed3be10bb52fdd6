"""Hugging Face folders of the Llama family (pytfm.llama, on the C reader pytfm_llama_*): each
family and option reads to the GPTConfig transformers' config means and to parameters equal to
transformers' state dict (bfloat16 and float16 converted exactly); save() writes folders that
transformers reads back equal; hostile folders are refused naming the file and the field."""

import json
import os

import numpy as np
import pytest

from pytfm import llama
from pytfm.checkpoint import CheckpointError
from pytfm.nn import GPTConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
CLASSES = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
           "mistral": "MistralConfig"}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}


def hf_model(family, seed=0, dtype="float32", **config):
    """A random-weight transformers model of family, SMALL dims changed by config."""
    cls = getattr(transformers, CLASSES[family])
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cls(**{**SMALL, **config}))
    with torch.no_grad():  # norms and biases away from their constant initial values
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.to(getattr(torch, dtype))


def saved(tmp_path, model, name="m", shard=None):
    path = tmp_path / name
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(str(path), safe_serialization=True, **kw)
    return str(path)


# (family, dtype, max_shard_size, config changes, the GPTConfig fields they mean)
CASES = [
    ("llama", "float32", None, {}, dict(n_kv_head=2, head_dim=8, tie_embeddings=False)),
    ("llama", "bfloat16", "8KB", dict(num_key_value_heads=1, tie_word_embeddings=True),
     dict(n_kv_head=1, tie_embeddings=True)),  # MQA, tied, sharded
    ("llama", "float16", None, dict(head_dim=16, rope_scaling=LLAMA3, rope_theta=500000.0),
     dict(head_dim=16, rope_scaling="llama3", rope_factor=8.0, rope_low_freq_factor=1.0,
          rope_high_freq_factor=4.0, rope_original_max_pos=32.0, rope_theta=500000.0)),
    ("qwen2", "bfloat16", "8KB", dict(rms_norm_eps=1e-5), dict(qkv_bias=True, norm_eps=1e-5)),
    ("qwen3", "float32", None, dict(head_dim=16, tie_word_embeddings=True),
     dict(qk_norm=True, head_dim=16, tie_embeddings=True)),
    ("qwen3", "bfloat16", None, {}, dict(qk_norm=True, head_dim=128)),  # Qwen3's default
    ("mistral", "float16", "12KB", dict(sliding_window=8), dict(sliding_window=8)),
    ("mistral", "float32", None, dict(sliding_window=None), dict(sliding_window=0)),
    ("qwen2", "float32", None, dict(use_sliding_window=True, sliding_window=6,
                                    max_window_layers=0), dict(qkv_bias=True, sliding_window=6)),
]


def expected_config(changes):
    base = dict(vocab=64, d_model=32, n_layer=2, n_head=4, max_seq=64, arch="llama",
                n_kv_head=2, d_ff=48, norm_eps=1e-6, tie_embeddings=False)
    return GPTConfig(**{**base, **changes})


@pytest.mark.parametrize("family, dtype, shard, config, fields", CASES,
                         ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_each_family_reads_to_its_config_and_transformers_weights(tmp_path, family, dtype,
                                                                  shard, config, fields):
    model = hf_model(family, dtype=dtype, **config)
    path = saved(tmp_path, model, shard=shard)
    if shard:
        assert os.path.exists(os.path.join(path, "model.safetensors.index.json"))
    assert llama.read_config(path) == expected_config(fields)
    cfg, params = llama.read_params(path)
    assert cfg == expected_config(fields)
    state = model.state_dict()
    names = [n for n in state if not (cfg.tie_embeddings and n == "lm_head.weight")]
    assert sorted(params) == sorted(names)
    for name, a in params.items():
        assert a.dtype == np.float32
        # every bfloat16 and float16 is a float32: the conversion is exact
        np.testing.assert_array_equal(a, state[name].float().numpy(), err_msg=name)


def test_load_copies_the_parameters_into_the_model(tmp_path, monkeypatch):
    """pytfm.llama.load on a stand-in for GPT (the Llama model lands in nn.py from elsewhere):
    the config and every parameter reach it."""
    path = saved(tmp_path, hf_model("qwen2"))
    made = {}

    class Params:
        def copy_from(self, arrays):
            made["arrays"] = arrays

    class FakeGPT:
        def __init__(self, cfg, device, precision, init=True):
            made.update(cfg=cfg, device=device, precision=precision, init=init)
            self.params = Params()

    monkeypatch.setattr(llama, "GPT", FakeGPT)
    model = llama.load(path, device="cpu", precision="fp32")
    assert isinstance(model, FakeGPT) and made["precision"] == "fp32"
    assert made["init"] is False  # nothing drawn: every parameter is then read
    cfg, params = llama.read_params(path)
    assert made["cfg"] == cfg and sorted(made["arrays"]) == sorted(params)
    for name in params:
        np.testing.assert_array_equal(made["arrays"][name], params[name])


# ---- save ---------------------------------------------------------------------------------------


def random_params(cfg, seed=0):
    from pytfm.nn import param_shapes

    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in param_shapes(cfg)}


SAVED = [
    dict(),
    dict(n_kv_head=1, tie_embeddings=True),
    dict(qkv_bias=True),
    dict(qk_norm=True, head_dim=16),
    dict(sliding_window=5),
    dict(rope_scaling="llama3", rope_factor=8.0, rope_low_freq_factor=1.0,
         rope_high_freq_factor=4.0, rope_original_max_pos=32.0, rope_theta=500000.0),
    dict(qkv_bias=True, sliding_window=7),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("changes", SAVED, ids=range(len(SAVED)))
def test_save_writes_a_folder_transformers_reads_back_equal(tmp_path, changes, dtype):
    cfg = expected_config(changes)
    params = random_params(cfg)
    path = str(tmp_path / "out")
    llama.save(path, cfg, params, dtype=dtype)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    family = llama.family(cfg)
    assert hf.config.model_type == family
    assert hf.config.num_key_value_heads == cfg.n_kv_head
    assert hf.config.head_dim == cfg.head_dim
    assert hf.config.tie_word_embeddings == cfg.tie_embeddings
    rope = hf.config.rope_parameters
    assert rope["rope_theta"] == cfg.rope_theta
    assert rope["rope_type"] == (cfg.rope_scaling or "default")
    if cfg.rope_scaling:
        assert rope["factor"] == cfg.rope_factor
        assert rope["original_max_position_embeddings"] == cfg.rope_original_max_pos
    window = getattr(hf.config, "sliding_window", None)
    assert (window or 0) == cfg.sliding_window
    if family in ("qwen2", "qwen3"):
        kind = "sliding_attention" if cfg.sliding_window else "full_attention"
        assert hf.config.layer_types == [kind] * cfg.n_layer
    state = hf.state_dict()
    for name, a in params.items():
        want = torch.from_numpy(a)
        if dtype == "bfloat16":  # torch's rounding to nearest even
            want = want.to(torch.bfloat16).float()
        torch.testing.assert_close(state[name], want, rtol=0, atol=0, msg=name)
    # and pytfm reads its own folder back to the same config and bits
    cfg2, back = llama.read_params(path)
    assert cfg2 == cfg
    for name, a in back.items():
        np.testing.assert_array_equal(a, state[name].numpy())


def test_bfloat16_rounding_is_torchs_on_the_hard_values(tmp_path):
    a = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8), 3.4e38, -3.4e38, 1e-40, 0.0,
                  -0.0, np.inf, -np.inf, 1.0 + 2**-8 + 2**-20], np.float32)
    bits = llama._bf16(a)
    want = torch.from_numpy(a).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bits, want)
    assert np.isnan(np.array(llama._bf16(np.array([np.nan], np.float32)).astype(np.uint32) << 16,
                             np.uint32).view(np.float32)).all()


def test_save_refuses_bad_arguments_before_writing(tmp_path):
    cfg = expected_config({})
    params = random_params(cfg)
    path = tmp_path / "out"
    with pytest.raises(ValueError, match="dtype must be one of"):
        llama.save(str(path), cfg, params, dtype="float16")
    with pytest.raises(ValueError, match="missing"):
        llama.save(str(path), cfg, {k: v for k, v in params.items() if "norm" not in k})
    bad = dict(params, **{"model.norm.weight": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match=r"model.norm.weight.*\(32,\)"):
        llama.save(str(path), cfg, bad)
    with pytest.raises(ValueError, match="arch 'llama'"):
        llama.save(str(path), GPTConfig(), params)
    with pytest.raises(ValueError, match="both q/k norm"):
        llama.save(str(path), expected_config(dict(qk_norm=True, qkv_bias=True)), params)
    assert not path.exists()


# ---- hostile folders ----------------------------------------------------------------------------


def edit_config(path, **changes):
    """config.json with changes (None deletes a key)."""
    file = os.path.join(path, "config.json")
    with open(file) as f:
        c = json.load(f)
    for k, v in changes.items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    with open(file, "w") as f:
        json.dump(c, f)


NULL = object()  # a value written as JSON null (None deletes the key)

HOSTILE_CONFIGS = [
    (dict(model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"]),
     r"config.json: model_type is 'gpt_neox'"),
    (dict(model_type="gemma", architectures=["GemmaForCausalLM"]), r"model_type is 'gemma'"),
    (dict(architectures=["Qwen2ForCausalLM"]), r'architectures is \["Qwen2ForCausalLM"\]'),
    (dict(architectures=["LlamaModel"]), r"architectures is"),
    (dict(model_type=None), "has no model_type"),
    (dict(frobnicate=1), r"unknown field 'frobnicate'"),
    (dict(sliding_window=4), r"unknown field 'sliding_window' for model_type 'llama'"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}),
     r"rope_parameters rope_type is 'yarn'"),
    (dict(rope_parameters=None, rope_scaling={"type": "linear", "factor": 2.0}),
     r"rope_scaling rope_type is 'linear'"),
    (dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "rope_theta": 1e4}), r"rope_parameters \(llama3\) has no high_freq"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "factor": 2.0}),
     r"rope_parameters has an unknown field 'factor'"),
    (dict(rope_theta=500.0), r"rope_theta \(500.0\) and rope_parameters's \(10000.0\) disagree"),
    (dict(hidden_act="gelu"), r"hidden_act is 'gelu'"),
    (dict(attention_bias=True), r"attention_bias is True"),
    (dict(mlp_bias=True), r"mlp_bias is True"),
    (dict(pretraining_tp=2), r"pretraining_tp is 2"),
    (dict(vocab_size=None), "has no vocab_size"),
    (dict(hidden_size=0), r"hidden_size must be a positive int, got 0"),
    (dict(num_key_value_heads=3), r"n_head \(4\) must be a multiple of n_kv_head \(3\)"),
    (dict(head_dim=7), r"rope needs an even head_dim, got 7"),
    (dict(rms_norm_eps="1e-6"), r"rms_norm_eps must be a finite number > 0, got '1e-6'"),
    (dict(tie_word_embeddings=1), r"tie_word_embeddings must be true or false"),
]


@pytest.mark.parametrize("change, message", HOSTILE_CONFIGS,
                         ids=[str(i) for i in range(len(HOSTILE_CONFIGS))])
def test_a_hostile_config_is_refused_naming_the_field(tmp_path, change, message):
    path = saved(tmp_path, hf_model("llama"))
    edit_config(path, **change)
    with pytest.raises(CheckpointError, match=message) as e:
        llama.read_params(path)
    assert os.path.join(path, "config.json") in str(e.value)
    with pytest.raises(CheckpointError, match=message):
        llama.read_config(path)


QWEN_WINDOWS = [
    (dict(use_sliding_window=True, sliding_window=4, max_window_layers=1, layer_types=None),
     r"max_window_layers 1 of 2 layers mixes"),
    (dict(layer_types=["full_attention", "sliding_attention"]), r"layer_types mixes"),
    (dict(layer_types=["sliding_attention"] * 2), r"no window"),
    (dict(layer_types=["full_attention"]), r"list of num_hidden_layers \(2\)"),
    (dict(use_sliding_window="yes"), r"use_sliding_window must be true or false"),
    (dict(attention_bias=True), r"unknown field 'attention_bias' for model_type 'qwen2'"),
]


@pytest.mark.parametrize("change, message", QWEN_WINDOWS, ids=range(len(QWEN_WINDOWS)))
def test_qwen_attention_of_two_kinds_is_refused(tmp_path, change, message):
    path = saved(tmp_path, hf_model("qwen2"))
    edit_config(path, **change)
    with pytest.raises(CheckpointError, match=message):
        llama.read_config(path)


def test_qwen_windows_as_transformers_assigns_them(tmp_path):
    """use_sliding_window with max_window_layers 0 (every layer slides), and >= the layers
    (none does): one kind in every layer, as transformers' Qwen2Config lays out layer_types."""
    path = saved(tmp_path, hf_model("qwen2"))
    edit_config(path, use_sliding_window=True, sliding_window=5, max_window_layers=0,
                layer_types=None)
    assert llama.read_config(path).sliding_window == 5
    edit_config(path, max_window_layers=2)
    assert llama.read_config(path).sliding_window == 0
    edit_config(path, use_sliding_window=False, max_window_layers=0)
    assert llama.read_config(path).sliding_window == 0


def rewrite(path, tensors):
    safetensors_torch.save_file(tensors, os.path.join(path, "model.safetensors"),
                                metadata={"format": "pt"})


def weights_of(path):
    return safetensors_torch.load_file(os.path.join(path, "model.safetensors"))


Q = "model.layers.1.self_attn.q_proj.weight"

HOSTILE_WEIGHTS = [
    (lambda t: {**t, Q: torch.zeros(32, 31)},
     rf"{Q} is float32\[32, 31\], config.json needs float32, bfloat16 or float16\[32, 32\]"),
    (lambda t: {k: v for k, v in t.items() if k != Q}, rf"tensor {Q} is missing"),
    (lambda t: {**t, "model.layers.0.self_attn.o_proj.bias": torch.zeros(32)},
     r"unexpected tensor model.layers.0.self_attn.o_proj.bias"),
    (lambda t: {**t, Q: t[Q].to(torch.int8)}, r'unsupported dtype "I8"'),
    (lambda t: {**t, Q: t[Q].double()}, r'unsupported dtype "F64"'),
    (lambda t: {**t, Q: t[Q].long()}, rf"{Q} is int64\[32, 32\]"),
]


@pytest.mark.parametrize("change, message", HOSTILE_WEIGHTS, ids=range(len(HOSTILE_WEIGHTS)))
def test_hostile_weights_are_refused_naming_file_and_tensor(tmp_path, change, message):
    path = saved(tmp_path, hf_model("llama"))
    rewrite(path, change(weights_of(path)))
    with pytest.raises(CheckpointError, match=message) as e:
        llama.read_params(path)
    assert os.path.join(path, "model.safetensors") in str(e.value)


def test_the_rotary_buffers_of_older_folders_are_not_parameters(tmp_path):
    path = saved(tmp_path, hf_model("llama"))
    t = weights_of(path)
    t["model.layers.1.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    rewrite(path, t)
    _, params = llama.read_params(path)
    assert "model.layers.1.self_attn.rotary_emb.inv_freq" not in params
    t["model.layers.2.self_attn.rotary_emb.inv_freq"] = torch.ones(4)  # no layer 2
    rewrite(path, t)
    with pytest.raises(CheckpointError, match="unexpected tensor model.layers.2"):
        llama.read_params(path)


def test_a_stored_tied_head_must_equal_the_embedding(tmp_path):
    path = saved(tmp_path, hf_model("llama", tie_word_embeddings=True))
    t = weights_of(path)
    t["lm_head.weight"] = t["model.embed_tokens.weight"].to(torch.bfloat16)
    rewrite(path, t)
    with pytest.raises(CheckpointError, match="lm_head.weight differs"):
        llama.read_params(path)  # bfloat16 rounded it: no longer equal
    t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()
    rewrite(path, t)
    cfg, params = llama.read_params(path)
    assert cfg.tie_embeddings and "lm_head.weight" not in params


def test_a_truncated_shard_and_a_bad_index_are_refused_naming_the_file(tmp_path):
    path = saved(tmp_path, hf_model("llama"), shard="8KB")
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        index = json.load(f)
    shard = sorted(set(index["weight_map"].values()))[-1]
    file = os.path.join(path, shard)
    size = os.path.getsize(file)
    with open(file, "r+b") as f:
        f.truncate(size - 10)
    with pytest.raises(CheckpointError, match=rf"{shard}: .*truncated file\?"):
        llama.read_params(path)
    index["weight_map"][Q] = "../elsewhere.safetensors"
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    with pytest.raises(CheckpointError, match=r"index.json: .*not a .safetensors file"):
        llama.read_params(path)
    del index["weight_map"]
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    with pytest.raises(CheckpointError, match=r"index.json: needs a weight_map"):
        llama.read_params(path)


def test_a_gpt2_folder_and_no_folder_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="not a folder .*Llama-family"):
        llama.read_params(str(tmp_path / "nothing"))
    path = saved(tmp_path, hf_model("llama"))
    edit_config(path, model_type="gpt2")
    with pytest.raises(CheckpointError, match=r"'gpt2'.*pytfm.gpt2"):
        llama.read_config(path)


def test_ignored_fields_are_ignored_and_listed():
    assert {"bos_token_id", "torch_dtype", "dtype", "transformers_version",
            "attention_dropout", "use_cache", "initializer_range"} <= llama.IGNORED
    base = {"model_type": "llama", **SMALL}
    cfg = llama.config_from_dict({**base, **{k: None for k in llama.IGNORED}, "_x": 1})
    assert cfg == llama.config_from_dict(base)
