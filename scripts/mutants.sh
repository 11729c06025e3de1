#!/usr/bin/env bash
# Mutation testing of the files the single-worker reference rests on, each against only the
# tests that cover it (the whole crate would take days on 2 cores). Needs
# `cargo install cargo-mutants`. Results: target/mutants/<name>/mutants.out/{caught,missed,…}.txt;
# every missed mutant is killed by a test or explained in docs/mutants.md.
#   scripts/mutants.sh              all five files (about 40 minutes on 2 cores)
#   scripts/mutants.sh optimizer    one of: optimizer trainer generate gpt chunks, the parallel
#                                   files: tp_comm vocab tp_state zero store stages executor gradients,
#                                   the serving engine's: engine (its scheduler) advance kv (its
#                                   block pool), the embedding job's: output
#                                   (its unit tests) and output_job (the same file against
#                                   brigade-cli's embedding job, for the crash hook); issue 46's
#                                   round: generation_config rope fused_experts experts
#                                   completion penalty chat_template tokenizer, and
#                                   its second part: paged_attention tools chat shard_load
#                                   weights llama moe checkpoint graph program_template addition,
#                                   and its third: elastic rope_kernels constraint
#                                   embeddings_http program_run launch_cmd; the thread
#                                   backend's: local_backend mailbox group; issue 47's
#                                   argmax (the greedy pick) and pages (huge pages)
# MUTANTS_ARGS passes more to cargo mutants
# and MUTANTS_BOUND (seconds) bounds each file's run. In a clean clone, as docs/mutants.md ran it:
#   MUTANTS_ARGS='--in-place --baseline skip --timeout 240 --shuffle' MUTANTS_BOUND=900 scripts/mutants.sh tools
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A file=(
  [optimizer]=crates/brigade/src/train/optimizer.rs
  [trainer]=crates/brigade/src/train/trainer.rs
  [generate]=crates/brigade/src/models/generate.rs
  [gpt]=crates/brigade/src/models/gpt.rs
  [chunks]=crates/brigade-comm/src/chunks.rs
  [tp_comm]=crates/brigade/src/nn/tp/comm.rs
  [vocab]=crates/brigade/src/nn/tp/vocab.rs
  [tp_state]=crates/brigade/src/nn/tp/state.rs
  [zero]=crates/brigade/src/parallel/data/zero.rs
  [store]=crates/brigade/src/parallel/data/store.rs
  [stages]=crates/brigade/src/parallel/pipeline/stages.rs
  [executor]=crates/brigade/src/parallel/pipeline/executor.rs
  [gradients]=crates/brigade/src/train/gradients.rs
  [engine]=crates/brigade-serve/src/engine/scheduler.rs
  [advance]=crates/brigade-serve/src/engine/advance.rs
  [kv]=crates/brigade-serve/src/engine/block_pool.rs
  [output]=crates/brigade/src/embed/output.rs
  [output_job]=crates/brigade/src/embed/output.rs
  [generation_config]=crates/brigade/src/models/generation_config.rs
  [rope]=crates/brigade/src/tensor/rope.rs
  [fused_experts]=crates/brigade/src/models/fused_experts.rs
  [experts]=crates/brigade-serve/src/model/experts.rs
  [completion]=crates/brigade-serve/src/request/completion.rs
  [penalty]=crates/brigade-serve/src/engine/advance.rs
  [chat_template]=crates/brigade/src/models/chat_template.rs
  [tokenizer]=crates/brigade/src/models/tokenizer.rs
  [paged_attention]=crates/brigade-serve/src/model/paged_attention.rs
  [tools]=crates/brigade-serve/src/request/tools.rs
  [chat]=crates/brigade-serve/src/request/chat.rs
  [shard_load]=crates/brigade/src/models/shard_load.rs
  [weights]=crates/brigade-serve/src/model/weights.rs
  [llama]=crates/brigade/src/models/family/llama.rs
  [moe]=crates/brigade/src/nn/moe.rs
  [checkpoint]=crates/brigade/src/models/checkpoint.rs
  [graph]=crates/brigade-serve/src/program/graph.rs
  [program_template]=crates/brigade-serve/src/program/template.rs
  [addition]=crates/brigade/src/train/addition.rs
  [elastic]=crates/brigade/src/plan/elastic.rs
  [rope_kernels]=crates/brigade/src/tensor/rope.rs
  [constraint]=crates/brigade-serve/src/constraint.rs
  [embeddings_http]=crates/brigade-serve/src/http/embeddings.rs
  [program_run]=crates/brigade-serve/src/program/run.rs
  [launch_cmd]=crates/brigade-cli/src/launch_cmd.rs
  [local_backend]=crates/brigade-comm/src/local/backend.rs
  [mailbox]=crates/brigade-comm/src/local/mailbox.rs
  [group]=crates/brigade-comm/src/local/group.rs
  [argmax]=crates/brigade/src/tensor/math.rs
  [pages]=crates/brigade/src/pages.rs
)
declare -A tests=(
  [optimizer]="--lib --test adamw_fixture --test micro_batching --test nonfinite_loss --test resume --test equivalence"
  [trainer]="--lib --test adamw_fixture --test micro_batching --test nonfinite_loss --test resume --test generation --test equivalence --test evaluation"
  [generate]="--lib --test generation"
  [gpt]="--lib --test gradcheck --test hf_fixture --test generation --test micro_batching"
  [chunks]="--lib --test local"
  [tp_comm]="--test equivalence"
  [vocab]="--test equivalence"
  [tp_state]="--test equivalence --test adamw_fixture"
  [zero]="--lib --test equivalence"
  [store]="--lib --test equivalence --test step_accounting"
  [stages]="--test equivalence --test pipeline_parts"
  [executor]="--test pipeline_executor --test equivalence"
  [gradients]="--test equivalence --test micro_batching --test adamw_fixture --test step_accounting"
  [engine]="--lib --test engine --test tensor_parallel"
  [advance]="--lib --test engine --test tensor_parallel"
  [kv]="--lib --test engine"
  [output]="--lib -- embed::output"
  [output_job]="--test embed_job"
  [generation_config]="--lib --test hf_llama_fixture -- generation_config published"
  [rope]="--lib --test hf_llama_fixture --test gradcheck -- rope published matches_hugging_face"
  [fused_experts]="--lib --test hf_moe_fixture -- fused"
  [experts]="--test hf_generate --test engine"
  [completion]="--lib"
  [penalty]="--lib --test hf_generate --test engine"
  [chat_template]="--lib --test chat_templates -- chat_template renders_and_tokenizes the_turn_ends template_errors"
  [tokenizer]="--lib --test tokenizer_folders"
  [paged_attention]="--test engine --test hf_generate"
  [tools]="--lib --test tool_grammar"
  [chat]="--lib"
  [shard_load]="--lib --test hf_llama_fixture --test hf_moe_fixture"
  [weights]="--test hf_generate --test int8 --test engine --test gguf_stored --test pipeline_parallel --test tensor_parallel"
  [llama]="--lib --test hf_llama_fixture --test gradcheck"
  [moe]="--lib --test hf_moe_fixture --test gradcheck"
  [checkpoint]="--lib --test hf_llama_fixture --test init_published"
  [graph]="--lib"
  [program_template]="--lib"
  [addition]="--lib"
  [elastic]="--lib -- elastic"
  [rope_kernels]="--lib --test hf_llama_fixture --test gradcheck -- rope published matches_hugging_face llama"
  [constraint]="--test programs --test serve -- structured special_characters a_failed_node tools_reach bench_serve_with_tools"
  [embeddings_http]="--test serve -- embeddings bad_requests"
  [program_run]="--test programs"
  [launch_cmd]="--bins --test launch"
  [local_backend]="--lib --test local"
  [mailbox]="--lib --test local"
  [group]="--lib --test local"
  [argmax]="--lib -- argmax"
  [pages]="--lib -- pages"
)
# mutants of only part of a file (a regular expression over cargo-mutants' names)
declare -A only=(
  [penalty]=penalize_repeats
  [rope_kernels]='rope_heads|rope_rows'
  [argmax]=argmax
)
# the package whose tests a file's mutants run against, where it is not the file's own
declare -A package=(
  [output_job]=brigade-cli
  [constraint]=brigade-cli
  [embeddings_http]=brigade-cli
  [program_run]=brigade-cli
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(optimizer trainer generate gpt chunks)
for n in "${names[@]}"; do
  out=target/mutants/$n
  mkdir -p "$out"
  # shellcheck disable=SC2086
  pkg=()
  [ -z "${package[$n]:-}" ] || pkg=(--test-package "${package[$n]}")
  re=()
  [ -z "${only[$n]:-}" ] || re=(--re "${only[$n]}")
  # shellcheck disable=SC2086
  bound=()
  [ -z "${MUTANTS_BOUND:-}" ] || bound=(timeout -s INT "$MUTANTS_BOUND")
  rc=0
  "${bound[@]}" cargo mutants --profile mutants ${MUTANTS_ARGS:-} "${pkg[@]}" "${re[@]}" -f "${file[$n]}" -o "$out" -- ${tests[$n]} || rc=$?
  # a run cut by its bound may stop a build midway, and with --in-place the next file's builds
  # then fail to link ("undefined symbol"): start the next one from a clean incremental cache
  if [ "$rc" = 124 ] || [ "$rc" = 130 ]; then
    rm -rf target/mutants/incremental
  fi
  m=$out/mutants.out
  printf '%-10s caught %3d  missed %3d  unviable %3d  timeout %3d\n' "$n" \
    "$(wc -l <"$m/caught.txt")" "$(wc -l <"$m/missed.txt")" "$(wc -l <"$m/unviable.txt")" "$(wc -l <"$m/timeout.txt")"
done
