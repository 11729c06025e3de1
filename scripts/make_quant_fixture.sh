#!/usr/bin/env bash
# Makes crates/brigade/tests/fixtures/gguf_quantize.json: values off any quantization grid (a
# fixed generator: Gaussian rows, a row with outliers, an all-positive row, an all-negative
# row, a constant row, a zero row, tiny and huge magnitudes) and the bytes llama.cpp's own
# `ggml_quantize_chunk` — the call `llama-quantize` makes, without an importance matrix —
# gives them as Q8_0, Q4_0, Q5_0 and Q4_K. `tests/gguf_read.rs` holds brigade's writer to
# them byte for byte (`gguf_blocks.json` has llama-quantize's own blocks, but of a model
# already on a 4-bit grid, where a k-quant's fit is exact whatever its weighting).
#
#   scripts/make_quant_fixture.sh OUT.json
#   (llama.cpp built under $W, default /tmp/llamacpp, by ../shared/peers/llamacpp/setup.sh)
set -euo pipefail
out=$(realpath -m "$1")
W=${W:-/tmp/llamacpp}; L="$W/llama_cpp_python-0.3.36/vendor/llama.cpp"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cat > "$work/q.c" <<'C'
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml.h"
#define ROWS 8
#define K 512
static uint64_t s = 0x9E3779B97F4A7C15ull;
static double uni(void) { s = s * 6364136223846793005ull + 1442695040888963407ull; return ((s >> 11) + 0.5) / 9007199254740992.0; }
static double gauss(void) { return sqrt(-2 * log(uni())) * cos(6.283185307179586 * uni()); }
int main(void) {
  static float x[ROWS * K];
  for (int r = 0; r < ROWS; r++)
    for (int i = 0; i < K; i++) {
      double g = gauss(), v;
      switch (r) {
        case 0: case 1: v = 0.02 * g; break;                      /* a weight matrix's rows */
        case 2: v = 0.02 * g * (i % 97 == 5 ? 40 : 1); break;     /* outliers */
        case 3: v = fabs(0.05 * g) + 0.01; break;                 /* all positive */
        case 4: v = -fabs(0.05 * g) - 0.01; break;                /* all negative */
        case 5: v = i < 256 ? 0.125 : 0; break;                   /* a constant block, a zero block */
        case 6: v = 1e-6 * g; break;                              /* tiny */
        default: v = 300 * g; break;                              /* huge */
      }
      x[r * K + i] = (float)v;
    }
  const enum ggml_type types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q4_K};
  static uint8_t buf[ROWS * K * 2];
  printf("{\"made_by\": \"ggml_quantize_chunk (llama.cpp, no importance matrix), scripts/make_quant_fixture.sh\",\n");
  printf(" \"rows\": %d, \"k\": %d,\n \"source_bits\": [", ROWS, K);
  for (int i = 0; i < ROWS * K; i++) { uint32_t b; memcpy(&b, &x[i], 4); printf("%s%u", i ? "," : "", b); }
  printf("],\n \"types\": {");
  for (int t = 0; t < 4; t++) {
    size_t n = ggml_quantize_chunk(types[t], x, buf, 0, ROWS, K, NULL);
    printf("%s\n  \"%s\": \"", t ? "," : "", ggml_type_name(types[t]));
    for (size_t i = 0; i < n; i++) printf("%02x", buf[i]);
    printf("\"");
  }
  printf("\n }\n}\n");
  return 0;
}
C
cc -O2 -o "$work/q" "$work/q.c" -I"$L/ggml/include" "$W/build/ggml/src/libggml.a" "$W/build/ggml/src/libggml-cpu.a" \
  "$W/build/ggml/src/libggml-base.a" -lm -lstdc++ -lpthread -fopenmp
"$work/q" > "$out.tmp" && mv "$out.tmp" "$out"
echo "wrote $out"
