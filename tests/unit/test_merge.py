"""Merge strategies against a dense reference (ΔW formed explicitly on small shapes)."""

from __future__ import annotations

import json

import pytest
import torch

from hubgrpo.errors import InvalidSubmission, MergeError
from hubgrpo.merge import (Adapter, MergeOptions, dense_delta, load_adapter_dir, merge, parse_modules,
                           save_adapter_dir, staleness_weight)
from tests.support.adapter_factory import TINY, drifted, make_adapter, rel_err

TOL = 1e-5


def mean_delta(items, global_: Adapter, lr: float = 1.0) -> dict[str, torch.Tensor]:
    """Dense reference: ΔW_G + lr · Σ wᵢ (ΔWᵢ − ΔW_base(i)) / Σ w."""
    total = sum(w for _, _, w in items)
    out = {k: v.clone() for k, v in dense_delta(global_).items()}
    for sub, base, w in items:
        ds, db = dense_delta(sub), dense_delta(base)
        for k in out:
            out[k] += lr * (w / total) * (ds[k] - db[k])
    return out


@pytest.fixture
def world():
    """A global adapter, a stale base two versions back, three fresh and one stale submission."""
    global_ = make_adapter(seed=0)
    old = make_adapter(seed=100)
    fresh = [make_adapter(seed=i) for i in (1, 2, 3)]
    stale = make_adapter(seed=4)
    items = [(fresh[0], global_, 0.4), (fresh[1], global_, 0.3), (fresh[2], global_, 0.2), (stale, old, 0.1)]
    return global_, items


@pytest.mark.parametrize("options", [
    MergeOptions(method="svd", rank=24, svd_algorithm="exact"),
    MergeOptions(method="svd", rank=24, svd_algorithm="randomized"),
    MergeOptions(method="stack"),
    MergeOptions(method="stack", outer_lr=0.7),
    MergeOptions(method="svd", rank=24, outer_lr=0.7, svd_algorithm="exact"),
], ids=["svd-exact", "svd-randomized", "stack", "stack-lr0.7", "svd-lr0.7"])
def test_exact_methods_match_dense_reference(world, options):
    global_, items = world
    result = merge(global_, items, options)
    want = mean_delta(items, global_, options.outer_lr)
    assert rel_err(dense_delta(result.adapter), want) <= TOL
    assert result.report["residual"] <= 1e-6


def test_ffa_matches_dense_reference_with_stale_base():
    torch.manual_seed(0)
    global_ = make_adapter(seed=0)
    old = Adapter({k: (v * 0.5 if "lora_B" in k else v) for k, v in global_.weights.items()}, global_.config)
    subs = [Adapter({k: (v + 0.05 * torch.randn_like(v) if "lora_B" in k else v) for k, v in base.weights.items()},
                    global_.config) for base in (global_, global_, old)]
    items = [(subs[0], global_, 1.0), (subs[1], global_, 2.0), (subs[2], old, 1.0)]
    result = merge(global_, items, MergeOptions(method="ffa", outer_lr=0.7))
    assert rel_err(dense_delta(result.adapter), mean_delta(items, global_, 0.7)) <= TOL
    for k, v in global_.weights.items():
        if "lora_A" in k:
            assert torch.equal(result.adapter.weights[k], v)


def test_ffa_refuses_different_a():
    global_ = make_adapter(seed=0)
    with pytest.raises(MergeError, match="A frozen and shared"):
        merge(global_, [(make_adapter(seed=1), global_, 1.0)], MergeOptions(method="ffa"))


def test_default_svd_is_weighted_mean_when_rank_fits():
    global_ = make_adapter(seed=0)
    sub = make_adapter(seed=1)
    result = merge(global_, [(sub, global_, 1.0)])  # lr 1, one fresh submission: ΔW′ = ΔW_sub, rank r
    assert result.report["residual"] <= 1e-6
    assert rel_err(dense_delta(result.adapter), dense_delta(sub)) <= TOL
    assert result.adapter.config == global_.config
    assert {k: v.shape for k, v in result.adapter.weights.items()} == {k: v.shape for k, v in global_.weights.items()}


def test_svd_residual_is_reported_and_randomized_is_near_optimal(world):
    global_, items = world
    exact = merge(global_, items, MergeOptions(svd_algorithm="exact"))  # rank 4 < combined rank: truncated
    true_err = rel_err(dense_delta(exact.adapter), mean_delta(items, global_))
    assert exact.report["residual"] == pytest.approx(true_err, rel=1e-4)
    assert exact.report["residual"] > 0.1
    rnd = merge(global_, items, MergeOptions(svd_algorithm="randomized", passes=6))
    rnd_err = rel_err(dense_delta(rnd.adapter), mean_delta(items, global_))
    assert rnd_err <= 1.05 * true_err
    assert rnd.report["residual"] == pytest.approx(rnd_err, rel=0.15)
    assert rnd.report["residual_estimated"] and rnd.report["algorithm"] == "randomized"


def test_svd_auto_picks_by_size():
    global_ = make_adapter(seed=0)
    few = merge(global_, [(make_adapter(seed=i), global_, 1.0) for i in (1, 2)])
    many = merge(global_, [(make_adapter(seed=i), global_, 1.0) for i in range(1, 12)])
    assert few.report["algorithm"] == "exact" and many.report["algorithm"] == "randomized"


@pytest.mark.parametrize("drift", [0.1, 0.5])
def test_naive_shows_its_known_error(drift):
    common = make_adapter(seed=0)
    global_ = make_adapter(seed=9)
    items = [(drifted(common, drift, seed=i), global_, 1.0) for i in range(4)]
    naive = merge(global_, items, MergeOptions(method="naive"))
    stack = merge(global_, items, MergeOptions(method="stack"))
    want = mean_delta(items, global_)
    assert rel_err(dense_delta(naive.adapter), want) > 1e-3
    assert rel_err(dense_delta(stack.adapter), want) <= TOL


def test_stack_rank_grows_then_falls_back_to_svd(world):
    global_, items = world
    grown = merge(global_, items, MergeOptions(method="stack"))
    # terms: G (coefficient 1 − 0.9), 3 fresh, the stale one and its old base; s = 1 written as r = alpha
    assert grown.adapter.config["r"] == 4 * 6 and grown.adapter.config["lora_alpha"] == 24
    assert grown.report["algorithm"] == "stack"
    capped = merge(global_, items, MergeOptions(method="stack", max_rank=8, svd_algorithm="exact"))
    assert capped.adapter.config["r"] == 8 and capped.report["residual"] > 0
    err = rel_err(dense_delta(capped.adapter), mean_delta(items, global_))
    assert err == pytest.approx(capped.report["residual"], rel=1e-4)


def _dense_momentum_run(steps, lr, mu, nesterov):
    """Hand-computed outer SGD: m′ = μm + g; ΔW′ = ΔW + lr·m′ (plain) or ΔW + lr·(g + μm′) (Nesterov)."""
    delta, m, out = None, None, []
    for global_, items in steps:
        delta = dense_delta(global_) if delta is None else delta
        g = {k: v - dense_delta(global_)[k] for k, v in mean_delta(items, global_).items()}
        m = g if m is None else {k: mu * m[k] + g[k] for k in g}
        delta = {k: delta[k] + lr * ((g[k] + mu * m[k]) if nesterov else m[k]) for k in g}
        out.append(delta)
    return out


@pytest.mark.parametrize("method", ["svd", "ffa"])
@pytest.mark.parametrize("nesterov", [False, True])
def test_outer_momentum_two_steps(method, nesterov):
    lr, mu = 0.7, 0.9
    opts = MergeOptions(method=method, outer_lr=lr, outer_momentum=mu, nesterov=nesterov, svd_algorithm="exact",
                        rank=None if method == "ffa" else 64, momentum_rank=64)  # ranks fit: exact
    g0 = make_adapter(seed=0)
    bump = (lambda a, s: Adapter({k: (v + 0.1 * torch.randn_like(v) if "lora_B" in k else v)
                                  for k, v in a.weights.items()}, a.config)) if method == "ffa" else None
    torch.manual_seed(0)
    subs1 = [bump(g0, i) if bump else make_adapter(seed=i) for i in (1, 2)]
    r1 = merge(g0, [(s, g0, 1.0) for s in subs1], opts, momentum=None)
    g1 = r1.adapter
    subs2 = [bump(g1, i) if bump else drifted(g1, 0.3, seed=i) for i in (3, 4)]
    r2 = merge(g1, [(s, g1, 1.0) for s in subs2], opts, momentum=r1.momentum)
    want = _dense_momentum_run([(g0, [(s, g0, 1.0) for s in subs1]), (g1, [(s, g1, 1.0) for s in subs2])],
                               lr, mu, nesterov)
    assert rel_err(dense_delta(g1), want[0]) <= TOL
    assert rel_err(dense_delta(r2.adapter), want[1]) <= TOL
    assert all(v.dtype == torch.float32 for v in r2.momentum.values())


def _dense_delayed_run(steps, lr, mu, nesterov, ks):
    """Hand-computed delayed Nesterov, ``ks[t]`` = k at merge t: a merge with fewer than k − 1 gradients buffered
    steps by g and buffers it; otherwise m′ = μm + mean(buffered g's and its own) and the step is g + μ·m′
    (Nesterov) or g + μ·m."""
    delta, m, buf, out = None, None, [], []
    for (global_, items), k in zip(steps, ks):
        delta = dense_delta(global_) if delta is None else delta
        g = {key: v - dense_delta(global_)[key] for key, v in mean_delta(items, global_).items()}
        buf.append(g)
        step = g
        if len(buf) >= k:
            mean = {key: sum(b[key] for b in buf) / len(buf) for key in g}
            new_m = mean if m is None else {key: mu * m[key] + mean[key] for key in g}
            push = new_m if nesterov else (m or {key: torch.zeros_like(v) for key, v in g.items()})
            step = {key: g[key] + mu * push[key] for key in g}
            m, buf = new_m, []
        delta = {key: delta[key] + lr * step[key] for key in g}
        out.append(delta)
    return out


@pytest.mark.parametrize("method", ["svd", "ffa"])
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("ks", [[3] * 7, [4, 4, 4, 2, 2, 4, 4, 4, 1, 1]], ids=["k3", "k-lowered"])
def test_delayed_nesterov_updates_the_momentum_every_k_merges_and_its_state_survives_a_file(method, nesterov, ks):
    """k = 3 over 7 merges (two buffered merges before each update), and k lowered 4 → 2 with 3 buffered (the
    update then averages all 4) and 4 → 1 with 2 buffered; every version against the dense reference."""
    from safetensors.torch import load, save

    lr, mu = 0.5, 0.9
    adapters, steps, state, buffered = [make_adapter(seed=0)], [], None, 0
    for t, k in enumerate(ks):
        opts = MergeOptions(method=method, outer_lr=lr, outer_momentum=mu, nesterov=nesterov, momentum_every=k,
                            svd_algorithm="exact", rank=None if method == "ffa" else 128, momentum_rank=128)
        g = adapters[-1]
        subs = [_ffa(g, 0.2, seed=10 * t + i) if method == "ffa" else drifted(g, 0.3, seed=10 * t + i)
                for i in (1, 2)]
        steps.append((g, [(s, g, 1.0) for s in subs]))
        r = merge(g, steps[-1][1], opts, momentum=state)
        state = load(save({key: v.contiguous() for key, v in r.momentum.items()}))  # as the coordinator keeps it
        buffered = buffered + 1 if buffered + 1 < k else 0
        assert int(state.get("delayed_nesterov.buffered", 0)) == buffered, t
        assert any(key.endswith(".buffer_B") for key in state) == (buffered > 0), t
        adapters.append(r.adapter)
    want = _dense_delayed_run(steps, lr, mu, nesterov, ks)
    for t in range(len(ks)):
        assert rel_err(dense_delta(adapters[t + 1]), want[t]) <= TOL, t


def test_a_tampered_delayed_nesterov_state_is_refused():
    g = make_adapter(seed=0)
    items = [(drifted(g, 0.3, seed=1), g, 1.0)]
    assert "delayed_nesterov.buffered" not in merge(g, items, MergeOptions(outer_momentum=0.9)).momentum
    opts = MergeOptions(outer_momentum=0.9, nesterov=True, momentum_every=4)
    r = merge(g, items, opts)
    state = r.momentum
    count = "delayed_nesterov.buffered"
    a_key = next(key for key in state if key.endswith(".buffer_A"))
    bad_states = [{**state, count: bad} for bad in (torch.tensor(-1), torch.tensor(0.5), torch.tensor([1, 2]),
                                                     torch.tensor(True), torch.tensor(1, dtype=torch.uint8))]
    bad_states += [
        {key: v for key, v in state.items() if key != a_key},  # a B without its A
        {key: v for key, v in state.items() if key != count},  # a buffer with no count
        {key: v for key, v in state.items() if ".buffer_" not in key},  # a count with no buffer
        {**state, a_key: torch.full_like(state[a_key], float("nan"))},  # not finite
        {**state, a_key: state[a_key][:-1]},  # B and A of different ranks
        {**state, a_key: state[a_key].to(torch.int32)},  # not floats
    ]
    for bad in bad_states:
        with pytest.raises(MergeError, match="momentum state"):
            merge(r.adapter, items, opts, momentum=bad)


def test_momentum_state_must_match_method():
    g = make_adapter(seed=0)
    r = merge(g, [(make_adapter(seed=1), g, 1.0)], MergeOptions(outer_momentum=0.9))
    with pytest.raises(MergeError, match="momentum state"):
        merge(r.adapter, [(make_adapter(seed=2), r.adapter, 1.0)], MergeOptions(method="ffa", outer_momentum=0.9),
              momentum=r.momentum)
    with pytest.raises(MergeError, match="naive"):
        merge(g, [(make_adapter(seed=1), g, 1.0)], MergeOptions(method="naive", outer_momentum=0.9))


def test_rslora_and_different_alpha_and_patterns():
    patterns = {"rank_pattern": {"layers.0.self_attn.q_proj": 2}, "alpha_pattern": {"v_proj": 3}}
    ranks = {k: 2 for k in TINY if k.endswith("layers.0.self_attn.q_proj")}
    global_ = make_adapter(seed=0, alpha=8, use_rslora=True, ranks=ranks, **patterns)
    specs, _ = parse_modules(global_)
    q0 = next(s for s in specs.values() if s.path.endswith("layers.0.self_attn.q_proj"))
    v1 = next(s for s in specs.values() if s.path.endswith("layers.1.self_attn.v_proj"))
    assert q0.rank == 2 and q0.scaling == pytest.approx(8 / 2 ** 0.5)
    assert v1.scaling == pytest.approx(3 / 2.0)
    subs = [make_adapter(seed=1, alpha=32), make_adapter(seed=2, alpha=8, use_rslora=True, ranks=ranks, **patterns)]
    items = [(subs[0], global_, 1.0), (subs[1], global_, 3.0)]
    for options in (MergeOptions(method="stack"), MergeOptions(rank=8, svd_algorithm="exact")):
        result = merge(global_, items, options)
        assert rel_err(dense_delta(result.adapter), mean_delta(items, global_)) <= TOL
    kept = merge(global_, [(subs[1], global_, 1.0)])  # svd keeps the global's config (rsLoRA + patterns)
    assert kept.adapter.config == global_.config
    assert rel_err(dense_delta(kept.adapter), dense_delta(subs[1])) <= TOL


@pytest.mark.parametrize("change", [
    {"use_dora": True}, {"modules_to_save": ["lm_head"]}, {"lora_bias": True}, {"bias": "all"},
    {"peft_type": "LOHA"}, {"target_parameters": ["mlp.experts"]},
])
def test_unsupported_adapters_are_refused(change):
    global_ = make_adapter(seed=0)
    sub = make_adapter(seed=1, **change)
    with pytest.raises(MergeError):
        merge(global_, [(sub, global_, 1.0)])


def test_dora_magnitude_key_is_refused():
    global_ = make_adapter(seed=0)
    sub = make_adapter(seed=1)
    sub.weights["base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"] = torch.ones(32)
    with pytest.raises(MergeError, match="not a LoRA factor"):
        merge(global_, [(sub, global_, 1.0)])


def test_incompatible_modules_are_refused():
    global_ = make_adapter(seed=0)
    other = make_adapter({k: v for k, v in list(TINY.items())[:3]}, seed=1)
    with pytest.raises(MergeError, match="other modules"):
        merge(global_, [(other, global_, 1.0)])
    with pytest.raises(MergeError, match="one rank per module"):
        merge(global_, [(make_adapter(seed=1, r=8), global_, 1.0)], MergeOptions(method="naive"))


def test_clip_and_trim(world):
    global_, _ = world
    subs = [make_adapter(seed=i) for i in range(1, 6)]
    huge = Adapter({k: v * 20 for k, v in make_adapter(seed=7).weights.items()}, global_.config)
    items = [(s, global_, 1.0) for s in subs] + [(huge, global_, 1.0)]
    clipped = merge(global_, items, MergeOptions(method="stack", clip_factor=1.5))
    rep = clipped.report
    assert rep["clipped"] == 1 and len(rep["update_norms"]) == 6
    scale = rep["clip_bound"] / rep["update_norms"][-1]
    dg, want = dense_delta(global_), dense_delta(global_)
    for (sub, _, _), f in zip(items, [1.0] * 5 + [scale]):
        for k, v in dense_delta(sub).items():
            want[k] = want[k] + f * (v - dg[k]) / 6
    assert rel_err(dense_delta(clipped.adapter), want) <= TOL
    trimmed = merge(global_, items, MergeOptions(method="stack", trim_fraction=0.2))
    assert trimmed.report["trimmed"] == 2 and trimmed.report["merged"] == 4
    order = sorted(range(6), key=lambda i: trimmed.report["update_norms"][i])
    kept = [items[i] for i in order[1:5]]
    assert rel_err(dense_delta(trimmed.adapter), mean_delta(kept, global_)) <= TOL


def test_update_norms_are_exact(world):
    global_, items = world
    result = merge(global_, items, MergeOptions(compute_norms=True))
    for (sub, base, _), norm in zip(items, result.report["update_norms"]):
        ds, db = dense_delta(sub), dense_delta(base)
        want = sum(float(((ds[k] - db[k]) ** 2).sum()) for k in ds) ** 0.5
        assert norm == pytest.approx(want, rel=1e-5)
    applied = sum(float(((v - dense_delta(global_)[k]) ** 2).sum()) for k, v in dense_delta(result.adapter).items())
    assert result.report["update_norm"] == pytest.approx(applied ** 0.5, rel=1e-5)


def test_zero_update_keeps_a_trainable_adapter():
    global_ = make_adapter(seed=0)
    zero_b = Adapter({k: (torch.zeros_like(v) if "lora_B" in k else v) for k, v in global_.weights.items()},
                     global_.config)
    result = merge(zero_b, [(zero_b, zero_b, 1.0)])  # ΔW′ = 0: B′ = 0, A′ fresh and non-zero (LoRA init)
    assert result.report["residual"] == 0.0
    for k, v in result.adapter.weights.items():
        assert (v.abs().max() == 0) if "lora_B" in k else (v.abs().max() > 0)


def test_dtype_is_preserved_and_report_is_json(world, tmp_path):
    g16 = make_adapter(seed=0, dtype=torch.bfloat16)
    sub = make_adapter(seed=1, dtype=torch.bfloat16)
    result = merge(g16, [(sub, g16, 1.0)], MergeOptions(compute_norms=True))
    assert all(v.dtype == torch.bfloat16 for v in result.adapter.weights.values())
    json.dumps(result.report)
    save_adapter_dir(result.adapter, tmp_path / "out")
    back = load_adapter_dir(tmp_path / "out")
    assert back.config == result.adapter.config
    assert all(torch.equal(back.weights[k], v) for k, v in result.adapter.weights.items())


def test_merge_weights_must_be_valid(world):
    global_, items = world
    with pytest.raises(MergeError, match="weights"):
        merge(global_, [(s, b, -1.0) for s, b, _ in items])
    with pytest.raises(MergeError, match="nothing to merge"):
        merge(global_, [])


def test_staleness_weight():
    assert staleness_weight(100, 0, 0.5, 4) == pytest.approx(100.0)
    assert staleness_weight(100, 3, 0.5, 4) == pytest.approx(50.0)
    assert staleness_weight(10, 1, 1.0) == pytest.approx(5.0)
    with pytest.raises(InvalidSubmission) as exc:
        staleness_weight(100, 5, 0.5, 4)
    assert exc.value.code == "stale" and "5 versions behind" in exc.value.message


def _tiny_qwen():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False))


def _peft_adapter(tmp_path, target, **lora_kw) -> Adapter:
    """A real PEFT adapter of the tiny model, every LoRA factor randomised (PEFT inits B or A to zero)."""
    import copy

    from peft import LoraConfig, get_peft_model

    model = get_peft_model(copy.deepcopy(_tiny_qwen()), LoraConfig(r=4, lora_alpha=8, target_modules=target,
                                                                   **lora_kw))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(tmp_path / "global")
    return load_adapter_dir(tmp_path / "global")


@pytest.mark.parametrize("method,target,lora_kw", [
    ("svd", "all-linear", {}),
    ("stack", "all-linear", {"use_rslora": True}),
    ("svd", ["embed_tokens", "q_proj", "v_proj"], {}),
], ids=["svd-all-linear", "stack-rslora", "svd-embedding"])
def test_merged_adapter_loads_with_peft_and_reproduces_delta(tmp_path, method, target, lora_kw):
    from peft import PeftModel

    global_ = _peft_adapter(tmp_path, target, **lora_kw)
    subs = [drifted(global_, 0.3, seed=i) for i in range(3)]
    for sub in subs:  # the frozen base embedding PEFT saves must stay the global's
        sub.weights.update({k: v for k, v in global_.weights.items() if k.endswith("base_layer.weight")})
    result = merge(global_, [(s, global_, w) for s, w in zip(subs, (0.5, 0.3, 0.2))], MergeOptions(method=method))
    save_adapter_dir(result.adapter, tmp_path / "merged")
    peft_model = PeftModel.from_pretrained(_tiny_qwen(), tmp_path / "merged").eval()
    reference, base = _tiny_qwen().eval(), _tiny_qwen().eval()
    with torch.no_grad():
        for prefix, delta in dense_delta(result.adapter).items():
            module = reference.get_submodule(prefix.removeprefix("base_model.model."))
            module.weight += (delta.T if isinstance(module, torch.nn.Embedding) else delta).float()
        ids = torch.arange(40).reshape(2, 20) % 64
        got, want, plain = peft_model(ids).logits, reference(ids).logits, base(ids).logits
    assert float((got - want).norm() / (want - plain).norm()) <= 1e-4
    assert float((want - plain).abs().max()) > 1e-2  # the adapter is not a no-op


def test_exact_path_survives_unbalanced_factors():
    global_ = make_adapter(seed=0)
    sub = make_adapter(seed=1)
    skewed = Adapter({k: v * (1e-6 if "lora_B" in k else 1e6) for k, v in make_adapter(seed=2).weights.items()},
                     global_.config)  # same ΔW scale as the others, stored as tiny B and huge A
    items = [(sub, global_, 1.0), (skewed, global_, 1.0)]
    result = merge(global_, items, MergeOptions(rank=8, svd_algorithm="exact"))
    assert rel_err(dense_delta(result.adapter), mean_delta(items, global_)) <= TOL


def test_keep_a_split_preserves_the_product_and_the_scale_of_a():
    """``factor_split="keep_a"``: the same ΔW as the balanced split, but every A row keeps the global A's median
    row norm (B carries the magnitude), so the next round's B gradient (∝ A) keeps its scale."""
    global_ = make_adapter(TINY, r=4, seed=0, alpha=8)
    subs = [drifted(global_, 0.3, seed=i) for i in range(3)]
    items = [(s, global_, 1 / 3) for s in subs]
    balanced = merge(global_, items, MergeOptions(factor_split="balanced")).adapter
    keep = merge(global_, items, MergeOptions(factor_split="keep_a")).adapter
    db, dk = dense_delta(balanced), dense_delta(keep)
    assert rel_err(dk, db) < 1e-5
    for key, a in keep.weights.items():
        if "lora_A" in key:
            want = global_.weights[key].norm(dim=1).median()
            assert torch.allclose(a.norm(dim=1), want.expand(a.shape[0]), rtol=1e-4)


def _ffa(global_: Adapter, drift: float, seed: int) -> Adapter:
    """A submission that shares the global's A (FFA-LoRA): only B drifted."""
    moved = drifted(global_, drift, seed)
    return Adapter({k: (global_.weights[k] if "lora_A" in k else v) for k, v in moved.weights.items()},
                   global_.config)


def test_an_ffa_fold_equals_the_full_merge_and_declines_what_it_cannot_stand_for():
    from hubgrpo.merge.fold import FfaFold

    g = make_adapter(seed=0)
    stale = _ffa(g, 0.3, seed=9)  # an older version the later submissions were trained from
    items = [(_ffa(g, 0.2, seed=i), stale if i % 2 else g, 1.0 + i) for i in range(5)]
    opts = MergeOptions(method="ffa", outer_lr=0.7, outer_momentum=0.9, nesterov=True)
    momentum = {f"{p}.momentum_B": torch.randn(s.out_dim, s.rank) for p, s in parse_modules(g)[0].items()}
    total = sum(w for *_, w in items)
    full = merge(g, [(s, b, w / total) for s, b, w in items], opts, momentum=momentum)
    fold = FfaFold(g, version=3)
    for i, (s, b, w) in enumerate(items):
        fold.add(f"s{i}", s, b, w)
        fold.add(f"s{i}", s, b, w)  # folding the same id twice counts once
    weights = {f"s{i}": w for i, (_, _, w) in enumerate(items)}
    got = fold.result(weights, opts, momentum=momentum)
    assert got is not None and got.report["folded"] and got.report["merged"] == 5
    for k in full.adapter.weights:
        assert torch.allclose(got.adapter.weights[k], full.adapter.weights[k], atol=1e-6), k
    assert all(torch.allclose(got.momentum[k], full.momentum[k], atol=1e-6) for k in full.momentum)
    assert abs(got.report["update_norm"] - full.report["update_norm"]) < 1e-4 * full.report["update_norm"]
    delayed = opts.model_copy(update={"momentum_every": 3})
    for count in (0, 2):  # in between (buffered) and at the momentum update
        state = {**momentum, "delayed_nesterov.buffered": torch.tensor(count)}
        if count:
            state.update({key.replace("momentum_B", "buffer_B"): torch.randn_like(v) for key, v in momentum.items()})
        a, b = fold.result(weights, delayed, momentum=state), merge(g, [(s, b, w / total) for s, b, w in items],
                                                                    delayed, momentum=state)
        assert set(a.momentum) == set(b.momentum) and int(a.momentum["delayed_nesterov.buffered"]) == (count + 1) % 3
        assert all(torch.allclose(a.adapter.weights[key], b.adapter.weights[key], atol=1e-6) for key in b.adapter.weights)
        assert all(torch.allclose(a.momentum[key].float(), b.momentum[key].float(), atol=1e-6) for key in b.momentum)
    assert fold.result({**weights, "s0": 9.0}, opts) is None  # another weight than was folded
    assert fold.result({k: w for k, w in weights.items() if k != "s4"}, opts) is None  # another set
    assert fold.result(weights, MergeOptions(method="ffa", clip_factor=2.0)) is None  # needs every norm first
    assert fold.result(weights, MergeOptions(method="svd")) is None
    broken = FfaFold(g, version=3)
    broken.add("x", drifted(g, 0.2, seed=1), g, 1.0)  # A trained: not FFA
    assert broken.broken and broken.result({"x": 1.0}, MergeOptions(method="ffa")) is None
