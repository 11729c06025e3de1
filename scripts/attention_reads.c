// A model of a decode step's paged attention reading the KV cache (brigade-serve's
// model/paged_attention.rs), to try orders of reading without building the engine: 32
// sequences of NP cached positions, gpt2-small's 12 layers and 12 heads of 64, blocks of 16
// positions laid out as the cache lays them ([block][layer][k|v][slot][768]), each sequence's
// blocks interleaved with the others' as a step hands them out. Prints the time of all 12
// layers (best of 15) and the rate the keys and values are read at.
//
//   gcc -O2 -mavx2 -mfma -mavx512f -fopenmp -o /tmp/attention_reads scripts/attention_reads.c -lm
//   /tmp/attention_reads ORDER [HUGE] [PREFETCH]     (OMP_NUM_THREADS=1|2)
//
// ORDER: passes  the kept kernel: eight positions a pass, each head's slice of the eight rows
//                in turn (eight short strided streams), weighted values the same way
//        rows    each key row, then each value row, read whole, front to back (every head)
//        rows512 the same with 512-bit loads (the dot's lanes then differ: not bit-equal)
// HUGE: 1 puts the cache on transparent huge pages (madvise), written once before timing.
// PREFETCH: with `passes`, prefetcht0 of the rows this many passes ahead (0: none).
// Figures it gave are in docs/benchmarks.md (issue 47, the paged attention's reads).
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define H 12
#define HD 64
#define W (H * HD)
#define BS 16
#define L 12
#define PASS 8
#define NSEQ 32
#define NP 96

static float *cache;
static int tables[NSEQ][(NP + BS - 1) / BS];
static int order, prefetch;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static const float *slot(int b, int layer, int kv, int s) {
  return cache + ((((size_t)b * L + layer) * 2 + kv) * BS + s) * (size_t)W;
}

static float lanes_in_order(__m256 v) {
  float o[8];
  _mm256_storeu_ps(o, v);
  float s = o[0];
  for (int i = 1; i < 8; i++) s += o[i];
  return s;
}

static void ask(const float *row) {
  for (int c = 0; c < W * 4; c += 64) _mm_prefetch((const char *)row + c, _MM_HINT_T0);
}

static void scores_passes(const int *tab, int layer, const float *q, float *sc) {
  for (int p0 = 0; p0 < NP; p0 += PASS) {
    const float *k[PASS];
    for (int j = 0; j < PASS; j++) {
      int p = p0 + j < NP ? p0 + j : NP - 1;
      k[j] = slot(tab[p / BS], layer, 0, p % BS);
    }
    for (int j = 0; prefetch && j < PASS && p0 + prefetch * PASS + j < NP; j++) {
      int p = p0 + prefetch * PASS + j;
      ask(slot(tab[p / BS], layer, 0, p % BS));
    }
    for (int h = 0; h < H; h++) {
      __m256 acc[PASS];
      for (int j = 0; j < PASS; j++) acc[j] = _mm256_setzero_ps();
      for (int c = 0; c < HD; c += 8) {
        __m256 x = _mm256_loadu_ps(q + h * HD + c);
        for (int j = 0; j < PASS; j++) acc[j] = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[j] + h * HD + c), acc[j]);
      }
      for (int j = 0; j < PASS && p0 + j < NP; j++) sc[h * NP + p0 + j] = lanes_in_order(acc[j]) * 0.125f;
    }
  }
}

static void values_passes(const int *tab, int layer, const float *sc, float *out) {
  for (int p0 = 0; p0 < NP; p0 += PASS) {
    int m = NP - p0 < PASS ? NP - p0 : PASS;
    const float *v[PASS];
    for (int j = 0; j < m; j++) v[j] = slot(tab[(p0 + j) / BS], layer, 1, (p0 + j) % BS);
    for (int j = 0; prefetch && j < PASS && p0 + prefetch * PASS + j < NP; j++) {
      int p = p0 + prefetch * PASS + j;
      ask(slot(tab[p / BS], layer, 1, p % BS));
    }
    for (int h = 0; h < H; h++) {
      __m256 acc[8];
      for (int b = 0; b < 8; b++) acc[b] = _mm256_loadu_ps(out + h * HD + 8 * b);
      for (int j = 0; j < m; j++) {
        __m256 x = _mm256_set1_ps(sc[h * NP + p0 + j]);
        for (int b = 0; b < 8; b++) acc[b] = _mm256_fmadd_ps(x, _mm256_loadu_ps(v[j] + h * HD + 8 * b), acc[b]);
      }
      for (int b = 0; b < 8; b++) _mm256_storeu_ps(out + h * HD + 8 * b, acc[b]);
    }
  }
}

static void scores_rows(const int *tab, int layer, const float *q, float *sc) {
  for (int p = 0; p < NP; p++) {
    const float *k = slot(tab[p / BS], layer, 0, p % BS);
    if (order == 2) {
      for (int h = 0; h < H; h++) {
        __m512 a = _mm512_setzero_ps();
        for (int c = 0; c < HD; c += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + h * HD + c), _mm512_loadu_ps(k + h * HD + c), a);
        sc[h * NP + p] = _mm512_reduce_add_ps(a) * 0.125f;
      }
      continue;
    }
    for (int h = 0; h < H; h++) {
      __m256 a = _mm256_setzero_ps();
      for (int c = 0; c < HD; c += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * HD + c), _mm256_loadu_ps(k + h * HD + c), a);
      sc[h * NP + p] = lanes_in_order(a) * 0.125f;
    }
  }
}

static void values_rows(const int *tab, int layer, const float *sc, float *out) {
  for (int p = 0; p < NP; p++) {
    const float *v = slot(tab[p / BS], layer, 1, p % BS);
    for (int h = 0; h < H; h++) {
      __m256 x = _mm256_set1_ps(sc[h * NP + p]);
      for (int b = 0; b < 8; b++) {
        float *o = out + h * HD + 8 * b;
        _mm256_storeu_ps(o, _mm256_fmadd_ps(x, _mm256_loadu_ps(v + h * HD + 8 * b), _mm256_loadu_ps(o)));
      }
    }
  }
}

static void softmax(float *sc) {
  for (int h = 0; h < H; h++) {
    float *s = sc + h * NP, mx = -INFINITY, sum = 0;
    for (int p = 0; p < NP; p++) mx = s[p] > mx ? s[p] : mx;
    for (int p = 0; p < NP; p++) sum += s[p] = expf(s[p] - mx);
    for (int p = 0; p < NP; p++) s[p] /= sum;
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s passes|rows|rows512 [HUGE 0|1] [PREFETCH passes ahead]\n", argv[0]);
    return 2;
  }
  order = !strcmp(argv[1], "passes") ? 0 : !strcmp(argv[1], "rows") ? 1 : !strcmp(argv[1], "rows512") ? 2 : -1;
  if (order < 0) {
    fprintf(stderr, "ORDER is passes, rows or rows512, got %s\n", argv[1]);
    return 2;
  }
  int huge = argc > 2 ? atoi(argv[2]) : 0;
  prefetch = argc > 3 ? atoi(argv[3]) : 0;
  int nblk = (NP + BS - 1) / BS, blocks = 2 * NSEQ * nblk;
  size_t bytes = (size_t)blocks * L * 2 * BS * W * 4, align = 2 << 20;
  char *raw = mmap(0, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return perror("mmap"), 1;
  cache = (float *)(((size_t)raw + align - 1) & ~(align - 1));
  if (huge) madvise(cache, bytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < bytes / 4; i++) cache[i] = (i % 97) * 1e-3f;
  // block b of every sequence in turn, as a step of NSEQ growing sequences takes them
  for (int b = 0, n = 0; b < nblk; b++)
    for (int s = 0; s < NSEQ; s++) tables[s][b] = n++;
  static float q[NSEQ][W], out[NSEQ][W];
  for (int s = 0; s < NSEQ; s++)
    for (int i = 0; i < W; i++) q[s][i] = 0.01f * ((s + i) % 13);
  double best = INFINITY;
  for (int rep = 0; rep < 15; rep++) {
    double t0 = now();
    for (int layer = 0; layer < L; layer++) {
#pragma omp parallel
      {
        float *sc = malloc(sizeof(float) * H * NP);
#pragma omp for schedule(dynamic)
        for (int s = 0; s < NSEQ; s++) {
          memset(out[s], 0, sizeof out[s]);
          (order ? scores_rows : scores_passes)(tables[s], layer, q[s], sc);
          softmax(sc);
          (order ? values_rows : values_passes)(tables[s], layer, sc, out[s]);
        }
        free(sc);
      }
    }
    double t = now() - t0;
    best = t < best ? t : best;
  }
  double read = (double)NSEQ * NP * L * 2 * W * 4;
  printf("%s, huge pages %d, prefetch %d, %d threads: %.2f ms, %.1f GB/s (check %g)\n", argv[1], huge, prefetch,
         omp_get_max_threads(), best * 1e3, read / best / 1e9, out[3][5]);
  return 0;
}
