"""EAGLE-3 heads: official-format checkpoints (random weights, official key names, with and without a
reduced draft vocabulary / d2t) load, compute what the reference architecture computes, draft from the
fused features of base layers 2, N//2, N-3, and decode exactly like plain decoding (fp32)."""

import json
import random

import pytest
import torch
from safetensors.torch import save_file
from tiny_models import FAMILIES, build_model

from eaglechat.engine.decode import Decoder
from eaglechat.engine.heads import Eagle3Config, Eagle3Head, init_weights, load_head
from eaglechat.engine.heads.eagle3 import set_draft_vocab
from eaglechat.engine.protocol import GenerationParams, TreeBudget
from eaglechat.errors import WeightsError

V = 96
LAYERS = 8  # fused layers 2, 4, 5: all distinct


def deep_config(family, layers=LAYERS):
    config = FAMILIES[family]()
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[0]] * layers
    return config


def deep_model(family="llama", seed=0, layers=LAYERS, scale=2.0):
    return build_model(deep_config(family, layers), seed, scale).requires_grad_(False)


def random_head3(model, draft_ids=None, seed=1) -> Eagle3Head:
    torch.manual_seed(seed)
    cfg = Eagle3Config.for_base(model.config, draft_vocab_size=len(draft_ids) if draft_ids is not None else 0)
    head = init_weights(Eagle3Head(cfg, model.get_input_embeddings()), std=0.15)
    with torch.no_grad():  # norms away from 1, so a missing or misplaced norm shows
        for name, p in head.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    if draft_ids is not None:
        set_draft_vocab(head, draft_ids)
    return head.eval()


def official_config(model, draft_vocab):
    """config.json as the official EAGLE-3 heads ship it: no rope_theta, draft_vocab_size."""
    c = model.config
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps, "vocab_size": c.vocab_size,
        "draft_vocab_size": draft_vocab, "max_position_embeddings": 2048, "pad_token_id": 0,
        "tie_word_embeddings": False, "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
    }


def write_official(folder, model, head, fmt="safetensors", *, zero_d2t_for_full=True, embedding=False):
    folder.mkdir(parents=True, exist_ok=True)
    state = dict(head.head_state_dict())
    if not head.config.reduced_vocab and zero_d2t_for_full:  # EAGLE3-Vicuna1.3-13B ships all-zero d2t
        state["d2t"] = torch.zeros(head.config.draft_vocab_size, dtype=torch.long)
        state["t2d"] = torch.ones(head.config.vocab_size, dtype=torch.bool)
    if embedding:
        state["embed_tokens.weight"] = model.get_input_embeddings().weight.detach().clone()
    (folder / "config.json").write_text(json.dumps(official_config(model, head.config.draft_vocab_size)))
    if fmt == "bin":
        torch.save(state, folder / "pytorch_model.bin")
    else:
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    return folder


def draft_vocab(seed=3, n=40):
    return sorted(random.Random(seed).sample(range(V), n))


def plain(model, prompt, n):
    dec = Decoder(model, None, 256)
    return [t for s in dec.generate(prompt, GenerationParams(max_new_tokens=n, speculate=False), TreeBudget(), set()) for t in s.tokens]


def spec(decoder, prompt, n, budget, params=None):
    params = params or GenerationParams(max_new_tokens=n)
    return [t for s in decoder.generate(prompt, params, budget, set()) for t in s.tokens]


def prefill(decoder, prompt):
    """The decoder's own prefill, by hand: -> (post-norm features, fused draft features, root)."""
    ids = torch.tensor(prompt)
    chain = torch.arange(len(prompt))
    feats, draft_features = decoder.target.forward(ids, chain, chain[:, None] >= chain[None, :])
    root = int(decoder.target.logits(feats[-1]).argmax())
    return feats, draft_features, root


# -- the reference architecture, written out independently from the state dict ----------------------

def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def reference_forward(sd, cfg, emb_w, inputs, tokens):
    """Causal pass of the EAGLE-3 midlayer over rows at positions 0..T-1; each input row is a fused
    3H target feature (goes through fc) or an H-wide fed-back head output (does not)."""
    h, eps, nh, nkv, hd = cfg.hidden_size, cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    hidden = torch.stack([x @ sd["fc.weight"].T if x.numel() == 3 * h else x for x in inputs])
    emb = emb_w[torch.tensor(tokens)]
    x = torch.cat([rms(emb, sd["midlayer.input_layernorm.weight"], eps), rms(hidden, sd["midlayer.hidden_norm.weight"], eps)], -1)
    t = x.shape[0]
    q = (x @ sd["midlayer.self_attn.q_proj.weight"].T).view(t, nh, hd).transpose(0, 1)
    k = (x @ sd["midlayer.self_attn.k_proj.weight"].T).view(t, nkv, hd).transpose(0, 1)
    v = (x @ sd["midlayer.self_attn.v_proj.weight"].T).view(t, nkv, hd).transpose(0, 1)
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))  # the head's base, not the target's
    ang = torch.arange(t).float()[:, None] * inv
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rope(z):
        return z * cos + torch.cat([-z[..., hd // 2:], z[..., : hd // 2]], -1) * sin

    q, k = rope(q), rope(k)
    k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
    att = (q @ k.transpose(-1, -2)) / hd ** 0.5
    att = att.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    hidden = hidden + (att @ v).transpose(0, 1).reshape(t, nh * hd) @ sd["midlayer.self_attn.o_proj.weight"].T
    y = rms(hidden, sd["midlayer.post_attention_layernorm.weight"], eps)
    mlp = (torch.nn.functional.silu(y @ sd["midlayer.mlp.gate_proj.weight"].T) * (y @ sd["midlayer.mlp.up_proj.weight"].T))
    out = hidden + mlp @ sd["midlayer.mlp.down_proj.weight"].T
    logits = rms(out, sd["norm.weight"], eps) @ sd["lm_head.weight"].T
    return out, logits


# -- tests ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_captured_features_are_the_inputs_of_layers_2_mid_and_n_minus_3(family):
    model = deep_model(family)
    head = random_head3(model)
    decoder = Decoder(model, head, 64)
    assert decoder.target.feature_layers == [2, 4, 5]
    seen = {}
    hooks = [
        layer.register_forward_pre_hook(
            lambda mod, args, kwargs, i=i: seen.__setitem__(i, (kwargs.get("hidden_states") if args == () else args[0]).detach().clone()),
            with_kwargs=True,
        )
        for i, layer in enumerate(model.model.layers)
    ]
    try:
        feats, fused, _ = prefill(decoder, [5, 6, 7, 8, 9])
    finally:
        for hk in hooks:
            hk.remove()
    assert fused.shape == (5, 3 * 64)
    assert torch.equal(fused, torch.cat([seen[2][0], seen[4][0], seen[5][0]], -1))
    # ... and not the post-norm last feature EAGLE-1/2 use
    assert not torch.allclose(fused[:, -64:], feats)
    assert [2, 3, 4] == Decoder(deep_model(family, layers=7), random_head3(deep_model(family, layers=7)), 8).target.feature_layers


@pytest.mark.parametrize("reduced", [True, False])
def test_head_matches_the_reference_architecture_and_drafts_a_chain(tmp_path, reduced):
    model = deep_model("llama")
    model.config.rope_theta = 500000.0  # the target's base must not leak into the head
    ids = draft_vocab() if reduced else None
    folder = write_official(tmp_path / "h", model, random_head3(model, ids))
    head = load_head(folder, model)
    assert isinstance(head, Eagle3Head)
    assert torch.allclose(head.rotary.inv_freq, 1.0 / (10000.0 ** (torch.arange(0, 16, 2).float() / 16)))
    sd = {k: v.float() for k, v in head.head_state_dict().items()}
    emb_w = model.get_input_embeddings().weight
    to_target = (lambda d: ids[d]) if reduced else (lambda d: d)

    decoder = Decoder(model, head, 64)
    prompt = [3, 9, 27, 81, 50, 12]
    _, fused, root = prefill(decoder, prompt)
    shifted = prompt[1:] + [root]
    decoder.drafter.extend(fused, torch.tensor(shifted))
    ref_out, ref_logits = reference_forward(sd, head.config, emb_w, list(fused), shifted)
    assert torch.allclose(decoder.drafter.h_last, ref_out[-1], atol=1e-4)
    # a top-1 chain: each level feeds back the head's own pre-norm output (no fc) with the drafted token
    tree = decoder.drafter.draft(root, TreeBudget(total_tokens=4, depth=4, draft_top_k=1))
    inputs, tokens, chain = list(fused), list(shifted), []
    logits = ref_logits[-1]
    out = ref_out
    for _ in range(4):
        chain.append(to_target(int(logits.argmax())))
        inputs.append(out[-1])
        tokens.append(chain[-1])
        out, all_logits = reference_forward(sd, head.config, emb_w, inputs, tokens)
        logits = all_logits[-1]
    assert tree.tokens.tolist() == [root] + chain
    assert tree.parents.tolist() == [-1, 0, 1, 2, 3]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("reduced,fmt", [(True, "safetensors"), (False, "bin"), (True, "bin")])
def test_official_checkpoints_decode_exactly_like_plain(tmp_path, family, reduced, fmt):
    model = deep_model(family)
    ids = draft_vocab() if reduced else None
    folder = write_official(tmp_path / "h", model, random_head3(model, ids), fmt=fmt, embedding=(fmt == "bin" and not reduced))
    head = load_head(folder, model)
    assert head.own_embedding is None  # a copy equal to the base's is shared, not kept
    assert (head.draft_to_target is not None) == reduced
    assert head.lm_head.weight.shape[0] == (40 if reduced else V)
    rng = random.Random(family)
    for _ in range(2):
        prompt = [rng.randrange(V) for _ in range(rng.randint(2, 14))]
        expected = plain(model, prompt, 16)
        for budget in (TreeBudget(8, 3, 4), TreeBudget(24, 5, 6), TreeBudget(kind="static")):
            assert spec(Decoder(model, head, 256), prompt, 16, budget) == expected, (budget, prompt)


def test_reduced_vocab_drafts_only_draft_tokens_and_sampling_runs(tmp_path):
    model = deep_model("qwen3")
    ids = draft_vocab(seed=5, n=24)
    head = load_head(write_official(tmp_path / "h", model, random_head3(model, ids)), model)
    decoder = Decoder(model, head, 256)
    _, fused, root = prefill(decoder, [4, 8, 15, 16, 23, 42])
    decoder.drafter.extend(fused, torch.tensor([8, 15, 16, 23, 42, root]))
    tree = decoder.drafter.draft(root, TreeBudget(30, 5, 6))
    assert tree.size == 31 and set(tree.tokens[1:].tolist()) <= set(ids)
    # sampling: same loop, same seed twice -> same text; tokens outside the draft vocabulary still appear
    params = GenerationParams(max_new_tokens=40, temperature=1.0, seed=11)
    a = spec(Decoder(model, head, 256), [1, 2, 3], 40, TreeBudget(8, 3, 4), params)
    b = spec(Decoder(model, head, 256), [1, 2, 3], 40, TreeBudget(8, 3, 4), params)
    assert a == b and len(a) == 40
    assert set(a) - set(ids)


def test_multi_turn_prefix_reuse_keeps_eagle3_exact(tmp_path):
    model = deep_model("llama")
    head = load_head(write_official(tmp_path / "h", model, random_head3(model, draft_vocab())), model)
    decoder = Decoder(model, head, 256)
    first = [5, 6, 7, 8, 9]
    reply = spec(decoder, first, 10, TreeBudget(8, 3, 4))
    second = first + reply + [10, 11]
    assert spec(decoder, second, 10, TreeBudget(8, 3, 4)) == plain(model, second, 10)
    assert decoder.stats.reused_tokens >= len(first) + len(reply) - 2


def test_broken_or_mismatched_eagle3_heads_fail_with_one_clear_line(tmp_path):
    model = deep_model("llama")
    head = random_head3(model, draft_vocab())
    folder = write_official(tmp_path / "h", model, head)
    good = dict(head.head_state_dict())

    def rewrite(state):
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))

    rewrite({k: v for k, v in good.items() if k != "midlayer.hidden_norm.weight"})
    with pytest.raises(WeightsError, match="lack midlayer.hidden_norm.weight"):
        load_head(folder, model)
    rewrite({k: v for k, v in good.items() if k != "d2t"})
    with pytest.raises(WeightsError, match="lack d2t"):
        load_head(folder, model)
    rewrite({**good, "midlayer.self_attn.q_proj.weight": torch.zeros(64, 64)})
    with pytest.raises(WeightsError, match=r"midlayer.self_attn.q_proj.weight has shape \(64, 64\), expected \(64, 128\)"):
        load_head(folder, model)
    rewrite({**good, "lm_head.weight": torch.zeros(50, 64)})
    with pytest.raises(WeightsError, match="lm_head.weight has shape"):
        load_head(folder, model)
    rewrite({**good, "d2t": torch.full((40,), 90, dtype=torch.long)})
    with pytest.raises(WeightsError, match="d2t maps draft ids outside"):
        load_head(folder, model)
    rewrite({**good, "layers.0.mlp.up_proj.weight": torch.zeros(128, 64)})
    with pytest.raises(WeightsError, match="unexpected key layers.0.mlp.up_proj.weight"):
        load_head(folder, model)
    rewrite(good)
    wide = deep_model("llama")
    wide.config.hidden_size = 128
    with pytest.raises(WeightsError, match="for another base: hidden size 64"):
        load_head(folder, wide, base_name="wide")
    # an EAGLE-1/2 folder is not mistaken for an EAGLE-3 one, and vice versa
    from tiny_models import random_head

    from eaglechat.engine.heads import save_head

    save_head(random_head(model), tmp_path / "e2")
    assert load_head(tmp_path / "e2", model).kind == "eagle2"
    assert load_head(folder, model).kind == "eagle3"


def save_deep_pair(root, family="llama", reduced=True):
    """A tiny 8-layer base folder (tokenizer, chat template) and an official-format EAGLE-3 head folder."""
    from tiny_models import tiny_tokenizer

    tok = tiny_tokenizer()
    config = deep_config(family)
    config.vocab_size = max(len(tok), 320)
    config.eos_token_id, config.bos_token_id = tok.eos_token_id, tok.bos_token_id
    model = build_model(config, seed=0)
    base_dir = root / f"deep-{family}"
    model.save_pretrained(base_dir)
    tok.save_pretrained(base_dir)
    ids = sorted(random.Random(1).sample(range(config.vocab_size), 100)) if reduced else None
    head_dir = write_official(root / f"deep-{family}-eagle3", model, random_head3(model, ids), fmt="bin")
    return base_dir, head_dir


def test_load_engine_takes_catalog_eagle3_heads_through_the_eagle3_loader(tmp_path, monkeypatch):
    from dataclasses import replace

    from eaglechat import loader
    from eaglechat.engine.protocol import Finished
    from eaglechat.models.manifest import Manifest

    base_dir, head_dir = save_deep_pair(tmp_path)
    manifest = Manifest.for_pair("deep-llama-eagle3", base=("test/deep-llama", "main"), head=("test/deep-llama-eagle3", "main"),
                                 kind="eagle3", dtype="float32")
    monkeypatch.setattr(loader, "resolve_model", lambda *args, **kwargs: (base_dir, head_dir, manifest))
    engine = loader.load_engine("deep-llama-eagle3", device="cpu", tree=TreeBudget(12, 4, 4))
    assert isinstance(engine.head, Eagle3Head) and engine.decoder.target.feature_layers == [2, 4, 5]

    def reply(speculate):
        events = list(engine.generate_ids([1, 40, 41, 42], GenerationParams(max_new_tokens=24, speculate=speculate)))
        return [e for e in events if isinstance(e, Finished)][0].token_ids

    assert reply(True) == reply(False)
    manifest = replace(manifest, head_kind="eagle2")  # a manifest that disagrees with the folder: one clear line
    with pytest.raises(WeightsError, match="catalog says an eagle2 head, but deep-llama-eagle3 holds an eagle3 head"):
        loader.load_engine("deep-llama-eagle3", device="cpu")


def test_cli_run_with_an_eagle3_head_equals_no_speculate(tmp_path):
    import subprocess
    import sys

    base_dir, head_dir = save_deep_pair(tmp_path, "qwen3", reduced=False)

    def run(*extra):
        r = subprocess.run([sys.executable, "-m", "eaglechat", "run", str(base_dir), "Hello world", "--json",
                            "--max-new-tokens", "20", *extra], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    eagle, plain_out = run("--head", str(head_dir), "--speculate", "on"), run("--no-speculate")
    assert eagle["token_ids"] == plain_out["token_ids"] and eagle["text"] == plain_out["text"]


def test_community_layout_head_dim_and_rope_theta_from_the_head_config(tmp_path):
    """AngelSlim/SpecForge Qwen3 heads: head_dim != hidden/heads, rope_theta given, rope_scaling null."""

    model = deep_model("qwen3")
    ids = draft_vocab(seed=9, n=32)
    base = Eagle3Config.for_base(model.config, draft_vocab_size=32)
    cfg = Eagle3Config(**{**{k: getattr(base, k) for k in base.__dataclass_fields__}, "head_dim": 32, "rope_theta": 1e6})
    torch.manual_seed(4)
    head = init_weights(Eagle3Head(cfg, model.get_input_embeddings()), std=0.15).eval()
    set_draft_vocab(head, ids)
    folder = write_official(tmp_path / "h", model, head)
    raw = json.loads((folder / "config.json").read_text())
    raw.update({"head_dim": 32, "rope_theta": 1000000, "rope_scaling": None, "model_type": "llama"})
    (folder / "config.json").write_text(json.dumps(raw))
    loaded = load_head(folder, model)
    assert loaded.midlayer.self_attn.q_proj.weight.shape == (4 * 32, 128)
    assert torch.allclose(loaded.rotary.inv_freq, 1.0 / (1e6 ** (torch.arange(0, 32, 2).float() / 32)))
    prompt = [7, 1, 8, 2, 8, 1, 8]
    assert spec(Decoder(model, loaded, 256), prompt, 16, TreeBudget(12, 4, 4)) == plain(model, prompt, 16)


def test_narrow_head_with_target_hidden_size_brings_its_own_embedding(tmp_path):
    """config target_hidden_size: fc maps 3T -> H with H != T; the checkpoint must carry embed_tokens."""

    model = deep_model("llama")
    base = Eagle3Config.for_base(model.config, draft_vocab_size=40)
    fields = {k: getattr(base, k) for k in base.__dataclass_fields__}
    fields.update(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                  target_hidden_size=64)
    cfg = Eagle3Config(**fields)
    torch.manual_seed(6)
    own = torch.nn.Embedding(V, 32)
    head = init_weights(Eagle3Head(cfg, own), std=0.15).eval()
    set_draft_vocab(head, draft_vocab())
    folder = tmp_path / "narrow"
    folder.mkdir()
    state = {**head.head_state_dict(), "embed_tokens.weight": own.weight.detach().clone()}
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    raw = {**official_config(model, 40), "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
           "num_key_value_heads": 1, "target_hidden_size": 64}
    (folder / "config.json").write_text(json.dumps(raw))
    loaded = load_head(folder, model)
    assert loaded.fc.weight.shape == (32, 192) and loaded.own_embedding is not None
    assert torch.equal(loaded.embed_tokens.weight, own.weight)
    assert torch.equal(loaded.head_state_dict()["embed_tokens.weight"], own.weight)
    prompt = [11, 12, 13, 14]
    assert spec(Decoder(model, loaded, 256), prompt, 16, TreeBudget(12, 4, 4)) == plain(model, prompt, 16)
    save_file({k: v.contiguous() for k, v in head.head_state_dict().items()}, str(folder / "model.safetensors"))
    with pytest.raises(WeightsError, match="no embed_tokens.weight"):
        load_head(folder, model)
