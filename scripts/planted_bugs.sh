#!/usr/bin/env bash
# Plants, one at a time, the bugs that a review found the suite blind to (issue 7), the
# missing reductions of tensor and sequence parallelism (issue 8) and of the pipeline (issue 9),
# the Llama family's own (issue 22: grouped-query attention, rotary positions and their
# scaling, RMSNorm, replicated key/value heads, Qwen2's biases) and context parallelism's (issue
# 41: chunk-boundary targets, the ring's last hop, the all-gather's sum, the mask's skipping), the
# mixtures of experts' (issue 45) and issue 46's new code (fused experts, generation_config.json's
# ids and defaults, the repetition penalty, add_bos_token; then paged attention's softmax, the
# learning-rate warmup, GGUF's add_eos rule and the memory-mapped reader's name check; then the
# MoE stash's bytes, the grammar cache and the elastic planner's precision), and checks
# that `cargo test --release` now fails on each. Works on a copy of the tree (the checkout is
# never modified); the copy builds in target/planted. Takes ~1–2 minutes per bug on 2 cores.
#   scripts/planted_bugs.sh            all bugs
#   scripts/planted_bugs.sh 3 5        only bugs 3 and 5
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export CARGO_TARGET_DIR="$root/target/planted"

# name @@ file @@ perl substitution @@ package whose tests must catch it
bugs=(
  "AdamW without the first-moment bias correction@@crates/brigade/src/train/optimizer.rs@@s/let step_size = \(lr as f64 \/ bc1\) as f32;/let step_size = lr;/@@brigade"
  "AdamW without the second-moment bias correction@@crates/brigade/src/train/optimizer.rs@@s/let bc2_sqrt = bc2.sqrt\(\) as f32;/let bc2_sqrt = 1.0f32;/@@brigade"
  "weight decay with the wrong sign@@crates/brigade/src/train/optimizer.rs@@s/1.0 - lr \* c.weight_decay/1.0 + lr * c.weight_decay/@@brigade"
  "weight decay on biases and LayerNorm too@@crates/brigade/src/train/optimizer.rs@@s/let shrink = if \*decay/let shrink = if true || *decay/@@brigade"
  "gradient clipping disabled@@crates/brigade/src/train/trainer.rs@@s/clip_factor\(grad_norm, self.cfg.grad_clip\)/clip_factor(grad_norm, 0.0)/@@brigade"
  "each micro-batch averaged on its own@@crates/brigade/src/parallel/pipeline/executor.rs@@s/scale: data.scale \}/scale: 1.0 \/ data.targets[mb].iter().filter(|&&v| v != crate::tensor::loss::IGNORE).count().max(1) as f32 }/@@brigade"
  "forward_last reads position t-2@@crates/brigade/src/models/gpt.rs@@s/\(\(i \+ 1\) \* t - 1\) \* c/(((i + 1) * t).max(2) - 2) * c/@@brigade"
  "tensor parallelism: f backward without its all-reduce@@crates/brigade/src/nn/tp/comm.rs@@s/pub fn f_backward\(&self, dx: &mut \[f32\]\) -> Result<\(\)> \{\n        self.all_reduce\(dx, ReduceOp::Sum\)/pub fn f_backward(&self, _dx: &mut [f32]) -> Result<()> {\n        Ok(())/@@brigade"
  "tensor parallelism: g forward without its all-reduce@@crates/brigade/src/nn/tp/comm.rs@@s/pub fn g_forward\(&self, y: &mut \[f32\]\) -> Result<\(\)> \{\n        self.all_reduce\(y, ReduceOp::Sum\)/pub fn g_forward(&self, _y: &mut [f32]) -> Result<()> {\n        Ok(())/@@brigade"
  "sequence parallelism: replicated gradients not summed over the group@@crates/brigade/src/nn/tp/state.rs@@s/    if !tp.sp \{\n        return Ok\(\(\)\);/    if true {\n        return Ok(());/@@brigade"
  "vocabulary-parallel loss: row maximum not reduced@@crates/brigade/src/nn/tp/vocab.rs@@s/tp.all_reduce\(&mut mx, ReduceOp::Max\)\?;//@@brigade"
  "vocabulary-parallel loss: padding columns counted in the softmax@@crates/brigade/src/tensor/loss.rs@@s/let row = &row\[..w.valid\];/let row = \&row[..];/@@brigade"
  "tensor parallelism: replicated parameters counted on every rank in the gradient norm@@crates/brigade/src/nn/tp/state.rs@@s/let replicated = if tp.rank\(\) == 0 \{ sq\(replicated\) \} else \{ 0.0 \};/let replicated = sq(replicated);/@@brigade"
  "chunk_range gives the remainder to the last ranks@@crates/brigade-comm/src/chunks.rs@@s/let start = rank \* base \+ rank.min\(rem\);\n    start..start \+ base \+ usize::from\(rank < rem\)/let first = size - rem;\n    let start = rank * base + rank.saturating_sub(first);\n    start..start + base + usize::from(rank >= first)/@@brigade-comm"
  "pipeline: the tied token table's two copies not summed@@crates/brigade/src/parallel/pipeline/stages.rs@@s/pub fn tie_grads\(&self, pp: &Comm, g: &mut \[f32\]\) -> Result<\(\)> \{/pub fn tie_grads(&self, pp: &Comm, g: &mut [f32]) -> Result<()> {\n        if pp.size() > 0 {\n            return Ok(());\n        }/@@brigade"
  "pipeline: the head's copy of the token table counted again in the gradient norm@@crates/brigade/src/parallel/pipeline/stages.rs@@s/l.specs.retain\(\|s\| s.view.offset != copy.start\);/let _ = copy;/@@brigade"
  "zero-bubble: the deferred weight gradients never run@@crates/brigade/src/parallel/pipeline/executor.rs@@s/d.run\(&mut chunks.grads\(chunk\)\[unit\]\);/let _ = unit;/@@brigade"
  "matmul kernel: only the last 256-deep block of the inner dimension kept@@crates/brigade/src/tensor/sgemm.rs@@s/let beta = accumulate \|\| pc > 0;/let beta = accumulate;/@@brigade"
  "matmul kernel: every panel packed from the first panel's rows@@crates/brigade/src/tensor/sgemm.rs@@s/let row = x.wrapping_add\(\(i0 \+ i\) \* rs \+ pc\);/let row = x.wrapping_add((i0 + i % W) * rs + pc);/@@brigade"
  "selective recompute: the backward reads the dropped scores@@crates/brigade/src/nn/attention.rs@@s/let probs: &\[f32\] = if st.probs.is_empty\(\) \{/let probs: \&[f32] = if false {/@@brigade"
  "grouped-query attention: each query head's dk, dv overwrite the group's instead of adding@@crates/brigade/src/tensor/attention.rs@@s/let beta = j > 0;/let beta = false;/@@brigade"
  "grouped-query attention: query heads read key/value heads round-robin, not by group@@crates/brigade/src/tensor/attention.rs@@s/let kvh = h \/ s.group\(\);/let kvh = h % s.kv_heads;/@@brigade"
  "rotary backward: the gradient rotated forward again, not back@@crates/brigade/src/nn/attention.rs@@s/rope_rows\(&mut dqkv\[rq.clone\(\)\], self.heads, &st.rope, \|r\| docs.pos\(r, t\), true\);/rope_rows(\&mut dqkv[rq.clone()], self.heads, \&st.rope, |r| docs.pos(r, t), false);/@@brigade"
  "Llama 3 rope scaling ignored@@crates/brigade/src/models/family/spec.rs@@s/inv_freq\(hd, \*theta, scaling\)/inv_freq(hd, *theta, scaling.filter(|_| false))/@@brigade"
  "RMSNorm epsilon fixed at 1e-6@@crates/brigade/src/tensor/rmsnorm.rs@@s/\(ms \+ eps as f64\)/(ms + 1e-6)/@@brigade"
  "replicated key/value heads: copies' gradients not summed@@crates/brigade/src/nn/tp/state.rs@@s/if copies <= 1 \|\| shared.is_empty\(\)/if true/@@brigade"
  "replicated key/value heads: every copy counted in the gradient norm@@crates/brigade/src/nn/tp/state.rs@@s/let shared = if tp.rank\(\).is_multiple_of\(copies.max\(1\)\)/let shared = if true/@@brigade"
  "Qwen2: no biases on q, k, v@@crates/brigade/src/models/family/llama.rs@@s/qkv_bias: ty == \"qwen2\" \|\| bias,/qkv_bias: bias,/@@brigade"
  "context parallelism: a rank's targets from its own next row (the chunk-boundary bug)@@crates/brigade/src/train/trainer.rs@@s/let y: Vec<i32> = pick\(y.len\(\)\).map\(\|i\| y\[i\]\).collect\(\);/let y: Vec<i32> = { let n = split.local(); (0..x.len()).map(|j| if (j + 1) % n != 0 { x[j + 1] as i32 } else { crate::tensor::loss::IGNORE }).collect() };/@@brigade"
  "context parallelism, ring: the blocks' dK and dV not brought home (the last hop dropped)@@crates/brigade/src/nn/context.rs@@s/comm.recv\(&mut mine, prev, TAG_DKV\).map_err\(comm_err\)\?;/mine.copy_from_slice(&dkv);/@@brigade"
  "context parallelism, all-gather: dK and dV not summed over the group@@crates/brigade/src/nn/context.rs@@s/comm.reduce_scatter\(&dkv_all, &mut mine, ReduceOp::Sum\).map_err\(comm_err\)\?;/mine.copy_from_slice(&dkv_all[comm.rank() * blk..(comm.rank() + 1) * blk]);/@@brigade"
  "context parallelism: a key chunk starting at a query chunk's last position skipped@@crates/brigade/src/nn/context.rs@@s/if kr.start <= qmax && kr.end > lmin/if kr.start < qmax && kr.end > lmin/@@brigade"
  "mixture of experts: the chosen experts' weights not renormalised over the k (norm_topk_prob ignored)@@crates/brigade/src/nn/moe.rs@@s/\*w = if norm_topk \{ row\[e as usize\] \/ sum \}/*w = if false { row[e as usize] \/ sum }/@@brigade"
  "serving a mixture of experts: the balancing bias ignored when choosing the experts@@crates/brigade-serve/src/model/experts.rs@@s/let biased: Vec<f32> = p.iter\(\).zip\(b\).map\(\|\(p, b\)\| p \+ b\).collect\(\);/let biased: Vec<f32> = p.iter().zip(b).map(|(p, _b)| *p).collect();/@@brigade-serve"
  "transformers 5's fused experts: each expert's up rows read from its gate rows@@crates/brigade/src/models/fused_experts.rs@@s/let first = expert \* per_expert \+ if part == Part::Up \{ n \} else \{ 0 \};/let first = expert * per_expert;/@@brigade"
  "generation_config.json: only the first of its end-of-sequence ids kept@@crates/brigade/src/models/generation_config.rs@@s/                    eos.push\(i as u32\)\n/                    if eos.is_empty() { eos.push(i as u32) }\n/@@brigade"
  "serving: a request's left-out sampling fields not given the model's defaults@@crates/brigade-serve/src/request/completion.rs@@s/let temperature = num_field\(o, \"temperature\"\)\?.unwrap_or\(d.temperature as f64\);/let temperature = num_field(o, \"temperature\")?.unwrap_or(1.0);/@@brigade-serve"
  "serving: the repetition penalty divides negative logits too (making repeats likelier)@@crates/brigade-serve/src/engine/advance.rs@@s/\*x = if \*x > 0.0 \{ \*x \/ penalty \} else \{ \*x \* penalty \};/*x \/= penalty;/@@brigade-serve"
  "tokenizer: tokenizer_config.json's add_bos_token ignored (the post-processor alone decides)@@crates/brigade/src/models/tokenizer.rs@@s/let add_bos = match v.get\(\"add_bos_token\"\).and_then\(\|x\| x.as_bool\(\)\) \{\n        Some\(b\) => b,/let add_bos = match None::<bool> {\n        Some(b) => b,/@@brigade"
  "paged attention: the softmax adds its maximum instead of subtracting it@@crates/brigade-serve/src/model/paged_attention.rs@@s/exp\(\*v - mx\)/exp(*v + mx)/@@brigade-serve"
  "learning rate: a warmup of 0 forced to one step@@crates/brigade/src/train/optimizer.rs@@s/warmup: cfg.warmup.unwrap_or\(cfg.steps \/ 20\),/warmup: cfg.warmup.unwrap_or(cfg.steps \/ 20).max(1),/@@brigade"
  "GGUF export: tokenizer_config's add_eos_token over the post-processor's@@crates/brigade/src/models/gguf/export.rs@@s/eos = eos.or\(config\[\"add_eos_token\"\].as_bool\(\)\);/eos = config[\"add_eos_token\"].as_bool().or(eos);/@@brigade"
  "memory-mapped reader: tensor names not checked@@crates/brigade/src/models/shard_load.rs@@s/self.check_names\(&parsed, full\)\?;//@@brigade"
  "MoE: the shared expert's gate left out of the stash bytes@@crates/brigade/src/nn/moe.rs@@s/\n            \+ self.shared_gate.len\(\)//@@brigade"
  "structured outputs: the compiled-grammar cache starts over on every compile@@crates/brigade-serve/src/constraint.rs@@s/if c.len\(\) >= KEPT \{/if !c.is_empty() {/@@brigade-serve"
  "elastic planner: the pick estimated in BF16@@crates/brigade/src/plan/elastic.rs@@s/precision: Precision::Fp32, //@@brigade"
)

only=("$@")
failed=0
for i in "${!bugs[@]}"; do
  n=$((i + 1))
  if [ ${#only[@]} -gt 0 ] && [[ ! " ${only[*]} " =~ " $n " ]]; then continue; fi
  entry=${bugs[$i]}
  name=${entry%%@@*}; entry=${entry#*@@}
  file=${entry%%@@*}; entry=${entry#*@@}
  subst=${entry%@@*}; pkg=${entry##*@@}
  rm -rf "$work/tree" && mkdir "$work/tree"
  (cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work/tree")
  ln -sfn "$root/../shared" "$work/shared"
  before=$(md5sum "$work/tree/$file")
  perl -0pi -e "$subst" "$work/tree/$file"
  if [ "$before" = "$(md5sum "$work/tree/$file")" ]; then
    echo "bug $n ($name): the substitution did not apply to $file — update this script" >&2
    failed=1
    continue
  fi
  if (cd "$work/tree" && cargo test --release -q --no-fail-fast -p "$pkg" >"$work/log" 2>&1); then
    echo "bug $n ($name): NOT caught — the tests passed"
    failed=1
  else
    caught=$(grep -E "^test .* FAILED$|^    [a-z0-9_:]+$" "$work/log" | sed 's/^test //; s/ \.\.\. FAILED//; s/^ *//' | sort -u | tr '\n' ' ')
    echo "bug $n ($name): caught by ${caught:-a failing build}"
  fi
done
exit $failed
