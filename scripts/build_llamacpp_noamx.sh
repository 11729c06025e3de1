#!/usr/bin/env bash
# llama.cpp's llama-server and llama-batched-bench built without its AMX kernels, for machines
# whose CPU reports AMX but whose kernel or hypervisor does not let a process use the tile
# registers: there llama.cpp's q8_0 products fault at their first `ldtilecfg` (a general
# protection fault in ggml_backend_amx_mul_mat; f32 runs, it has no AMX path). The same
# sources as ../shared/peers/llamacpp/setup.sh (run that first: it fetches them), the same
# options, but the instruction sets named instead of -march=native: AVX2, FMA, F16C, BMI2,
# AVX-512 (F, VBMI, VNNI, BF16) and AVX-VNNI, and no AMX — the sets of the Xeons that have AMX
# (Sapphire Rapids and later); a CPU without one of them needs its flag turned off here.
#   scripts/build_llamacpp_noamx.sh            # → $W/build-noamx/bin (W=/tmp/llamacpp), ~6 min on 2 cores
# Then: SERVER=$W/build-noamx/bin/llama-server scripts/bench_serve_vs_llamacpp.sh
set -euo pipefail
W="${W:-/tmp/llamacpp}"; VER=0.3.36
L="$W/llama_cpp_python-$VER/vendor/llama.cpp"
[ -d "$L" ] || { echo "llama.cpp's sources are not in $L: run W=$W bash ../shared/peers/llamacpp/setup.sh first" >&2; exit 1; }
export PATH="$W/venv/bin:$PATH"
cmake -S "$L" -B "$W/build-noamx" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
  -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build "$W/build-noamx" --target llama-server llama-batched-bench -j2
"$W/build-noamx/bin/llama-server" --version
