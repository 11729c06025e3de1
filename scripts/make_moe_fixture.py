"""Makes tests/fixtures/qwen2_moe_hf and tests/fixtures/mixtral_hf: small random-weight
mixture-of-experts models from Hugging Face `transformers`, an input batch, and the logits, loss,
every parameter's gradient and greedy continuations that PyTorch computes for them.

- qwen2_moe_hf: Qwen2MoeForCausalLM, 3 layers, the middle one dense (mlp_only_layers), 6
  experts with 2 a token, probabilities not renormalised (norm_topk_prob false), a shared expert
  with its sigmoid gate, q/k/v biases, GQA 2:1.
- mixtral_hf: MixtralForCausalLM, 1 layer, 4 experts with 2 a token (softmax over the chosen),
  GQA 4:1, untied head.
- qwen3_moe_hf: Qwen3MoeForCausalLM, 3 layers, the middle one dense, 6 experts with 2 a token
  renormalised (norm_topk_prob true), no shared expert, an RMSNorm over each query and key head
  (q_norm, k_norm), head_dim 16 in a hidden size of 32 with 4 heads (not hidden / heads), GQA 2:1.
- olmoe_hf: OlmoeForCausalLM, 2 layers, 6 experts of intermediate_size 16 with 2 a token, not
  renormalised, RMSNorms over all of q and all of k (q_norm of 32, k_norm of 16), GQA 2:1.

Both say output_router_logits: true, so the load-balancing loss counts. brigade's is the Switch
form taken per sequence and per MoE layer, averaged (transformers pools its whole batch and
every layer); the loss and gradients here are brigade's definition computed by PyTorch from
transformers' own router logits (`ours_aux`), and `one_seq_loss` is transformers' own loss on
one sequence of the 1-layer Mixtral, where the two definitions coincide.

brigade's test `hf_moe_fixture` loads the folders and must match logits and gradients to 1e-4
relative and the continuations exactly.

    ../shared/peers/.venv/bin/python scripts/make_moe_fixture.py [NAME...]   (default: all)
"""
import os

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
import sys

from transformers import (MixtralConfig, MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM, Qwen2MoeConfig,
                          Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

ROOT = "crates/brigade/tests/fixtures"


def ours_aux(router_logits, top_k, batch, seq):
    """Mean over MoE layers and sequences of E * sum_i f_i * P_i (f: share of a sequence's tokens
    choosing expert i among their top k; P: its mean probability)."""
    terms = []
    for logits in router_logits:
        e = logits.shape[-1]
        probs = F.softmax(logits.float(), dim=-1).reshape(batch, seq, e)
        chosen = torch.topk(probs, top_k, dim=-1).indices
        mask = F.one_hot(chosen, e).sum(dim=2).float()  # [b, t, e]: 1 where chosen
        f = mask.mean(dim=1)
        p = probs.mean(dim=1)
        terms.append(e * (f * p).sum(dim=-1))  # [b]
    return torch.stack(terms).mean()


def hub_form(name, t, mixtral):
    """transformers 5's in-memory tensor (fused experts: gate_up_proj [E, 2M, C] with the gate
    first, down_proj [E, C, M]; Mixtral's block named mlp) under the Hub's per-expert names."""
    if mixtral:
        name = name.replace(".mlp.", ".block_sparse_moe.")
    if name.endswith("experts.gate_up_proj"):
        pre, m = name[: -len("gate_up_proj")], t.shape[1] // 2
        g, u = ("w1", "w3") if mixtral else ("gate_proj", "up_proj")
        return [(f"{pre}{e}.{g}.weight", t[e, :m]) for e in range(t.shape[0])] + \
               [(f"{pre}{e}.{u}.weight", t[e, m:]) for e in range(t.shape[0])]
    if name.endswith("experts.down_proj"):
        pre = name[: -len("down_proj")]
        d = "w2" if mixtral else "down_proj"
        return [(f"{pre}{e}.{d}.weight", t[e]) for e in range(t.shape[0])]
    return [(name, t)]


def make(name, model, vocab, top_k):
    out = os.path.join(ROOT, name)
    model = model.float()
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.15 * torch.randn_like(p))
    model.eval()
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    g = torch.Generator().manual_seed(1)
    b, t = 3, 11
    ids = torch.randint(0, vocab, (b, t), generator=g)
    res = model(input_ids=ids, output_router_logits=True)
    ce = F.cross_entropy(res.logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))
    aux = ours_aux(res.router_logits, top_k, b, t)
    loss = ce + model.config.router_aux_loss_coef * aux
    loss.backward()
    tensors = {"input_ids": ids.to(torch.int64), "logits": res.logits.detach().contiguous(),
               "loss": loss.detach().reshape(1), "ce": ce.detach().reshape(1), "aux": aux.detach().reshape(1)}
    mixtral = isinstance(model, MixtralForCausalLM)
    saved = load_file(os.path.join(out, "model.safetensors"))
    for n, p in model.named_parameters():
        # the mapping checked on the weights: the saved file holds them under these names
        for hub, w in hub_form(n, p.detach(), mixtral):
            assert torch.equal(saved[hub], w), hub
        for hub, gr in hub_form(n, p.grad.detach(), mixtral):
            tensors["grad." + hub] = gr.clone().contiguous()
    assert len([k for k in tensors if k.startswith("grad.")]) == len(saved)
    model.zero_grad()
    with torch.no_grad():
        # transformers' own loss (its pooled balancing loss) on one sequence
        one = model(input_ids=ids[:1], labels=ids[:1], output_router_logits=True)
        tensors["one_seq_loss"] = one.loss.detach().reshape(1)
        prompt = torch.randint(0, vocab, (1, 9), generator=g)
        gen = model.generate(prompt, max_new_tokens=24, do_sample=False, pad_token_id=0,
                             eos_token_id=None, use_cache=True)
    tensors["prompt_ids"] = prompt.to(torch.int64)
    tensors["greedy_ids"] = gen[:, prompt.shape[1]:].to(torch.int64).contiguous()
    save_file(tensors, os.path.join(out, "expected.safetensors"))
    print(name, "loss", loss.item(), "ce", ce.item(), "aux", aux.item(),
          "params", sum(p.numel() for p in model.parameters()))


WANT = set(sys.argv[1:]) or {"qwen2_moe_hf", "mixtral_hf", "qwen3_moe_hf", "olmoe_hf"}

torch.manual_seed(0)
qwen = Qwen2MoeConfig(
    vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
    tie_word_embeddings=False, hidden_act="silu", rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
    norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1], output_router_logits=True,
    router_aux_loss_coef=0.05, use_sliding_window=False, bos_token_id=None, eos_token_id=None,
    pad_token_id=None,
)
if "qwen2_moe_hf" in WANT:
    make("qwen2_moe_hf", Qwen2MoeForCausalLM(qwen), qwen.vocab_size, qwen.num_experts_per_tok)

torch.manual_seed(1)
mixtral = MixtralConfig(
    vocab_size=83, hidden_size=32, intermediate_size=24, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256, rms_norm_eps=1e-5,
    tie_word_embeddings=False, hidden_act="silu", rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    num_local_experts=4, num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.1,
    sliding_window=None, bos_token_id=None, eos_token_id=None, pad_token_id=None,
)
if "mixtral_hf" in WANT:
    make("mixtral_hf", MixtralForCausalLM(mixtral), mixtral.vocab_size, mixtral.num_experts_per_tok)

torch.manual_seed(2)
qwen3 = Qwen3MoeConfig(
    vocab_size=89, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
    rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu",
    rope_parameters={"rope_type": "default", "rope_theta": 1e6}, attention_bias=False,
    num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True,
    decoder_sparse_step=1, mlp_only_layers=[1], output_router_logits=True, router_aux_loss_coef=0.02,
    use_sliding_window=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
)
if "qwen3_moe_hf" in WANT:
    make("qwen3_moe_hf", Qwen3MoeForCausalLM(qwen3), qwen3.vocab_size, qwen3.num_experts_per_tok)

torch.manual_seed(3)
olmoe = OlmoeConfig(
    vocab_size=79, hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, attention_bias=False, clip_qkv=None,
    num_experts=6, num_experts_per_tok=2, norm_topk_prob=False, output_router_logits=True,
    router_aux_loss_coef=0.01, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
)
if "olmoe_hf" in WANT:
    make("olmoe_hf", OlmoeForCausalLM(olmoe), olmoe.vocab_size, olmoe.num_experts_per_tok)
