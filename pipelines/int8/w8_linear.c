/* int8 weights, float activations: y[m][n] = scale[n] * sum_k x[m][k] * w[n][k] (+ bias[n]).
 *
 * The CPU thinker decodes one token at a time, and each token reads every weight once: on a
 * two-core machine that is bound by memory bandwidth, so weights stored as int8 (one byte, not
 * fp32's four) make decoding up to four times faster, if the kernel turns bytes into products as
 * fast as memory delivers them. This one does, with AVX2 + FMA alone (no AVX-512, no VNNI).
 *
 * Layout (``pipelines/int8/kernel.py``'s ``pack``): output channels in blocks of 4; within a block, for every 8 inputs, the 4
 * channels' 8 weights one after another (32 bytes). A block is one contiguous run of 4*K bytes
 * read front to back, so the hardware prefetcher streams it (four rows read side by side from the
 * plain [N][K] layout ran at half the bandwidth). K is a multiple of 8 and N of 4 (padded by the
 * caller).
 *
 *  - one row (decoding): per block, 8 weights of each channel sign-extended and converted to float
 *    in registers and multiplied into the activations; nothing is written but the outputs;
 *  - several rows (prefill): two blocks are converted to float once into a per-thread buffer (it
 *    stays in L2), then 4 channels x 3 rows at a time run from it (12 accumulators).
 *
 * Activations stay float: the only error is the weights' rounding to int8 (per output channel).
 * Blocks are shared among OpenMP threads; built with -fopenmp against the libgomp that torch
 * already loaded, so the thread pool and its thread count are torch's.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

/* The hash of this file, given by the build (hatch_build.py): the loader refuses a library built
 * from another version of it (whose packed layout may differ). */
#ifndef W8_LINEAR_TAG
#define W8_LINEAR_TAG ""
#endif
const char w8_linear_tag[] = W8_LINEAR_TAG;

static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

static inline __m256 load8(const int8_t *w) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)w)));
}

static inline void store(float *y, const float *scale, const float *bias, int64_t n, int64_t N, float dot) {
    if (n < N) y[n] = dot * scale[n] + (bias ? bias[n] : 0.0f);
}

/* one row, block b */
static void gemv_block(const float *x, const int8_t *p, const float *scale, const float *bias, float *y,
                       int64_t K, int64_t N, int64_t b) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t k = 0; k < K; k += 8, p += 32) {
        _mm_prefetch((const char *)(p + 1024), _MM_HINT_T0);
        __m256 xv = _mm256_loadu_ps(x + k);
        a0 = _mm256_fmadd_ps(xv, load8(p), a0);
        a1 = _mm256_fmadd_ps(xv, load8(p + 8), a1);
        a2 = _mm256_fmadd_ps(xv, load8(p + 16), a2);
        a3 = _mm256_fmadd_ps(xv, load8(p + 24), a3);
    }
    const int64_t n = b * 4;
    store(y, scale, bias, n, N, hsum(a0));
    store(y, scale, bias, n + 1, N, hsum(a1));
    store(y, scale, bias, n + 2, N, hsum(a2));
    store(y, scale, bias, n + 3, N, hsum(a3));
}

#define BLOCKS 2 /* blocks of 4 channels converted to float together (prefill) */

/* rows [0, M) of 4 channels whose float weights are buf[4][K], outputs from channel n */
static void rows4(const float *x, const float *buf, const float *scale, const float *bias, float *y,
                  int64_t M, int64_t K, int64_t N, int64_t n) {
    const float *b0 = buf, *b1 = buf + K, *b2 = buf + 2 * K, *b3 = buf + 3 * K;
    int64_t m = 0;
    for (; m + 3 <= M; m += 3) {
        const float *x0 = x + m * K, *x1 = x0 + K, *x2 = x1 + K;
        __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c03 = c00;
        __m256 c10 = c00, c11 = c00, c12 = c00, c13 = c00;
        __m256 c20 = c00, c21 = c00, c22 = c00, c23 = c00;
        for (int64_t k = 0; k < K; k += 8) {
            __m256 v0 = _mm256_loadu_ps(x0 + k), v1 = _mm256_loadu_ps(x1 + k), v2 = _mm256_loadu_ps(x2 + k), w;
            w = _mm256_loadu_ps(b0 + k);
            c00 = _mm256_fmadd_ps(v0, w, c00), c10 = _mm256_fmadd_ps(v1, w, c10), c20 = _mm256_fmadd_ps(v2, w, c20);
            w = _mm256_loadu_ps(b1 + k);
            c01 = _mm256_fmadd_ps(v0, w, c01), c11 = _mm256_fmadd_ps(v1, w, c11), c21 = _mm256_fmadd_ps(v2, w, c21);
            w = _mm256_loadu_ps(b2 + k);
            c02 = _mm256_fmadd_ps(v0, w, c02), c12 = _mm256_fmadd_ps(v1, w, c12), c22 = _mm256_fmadd_ps(v2, w, c22);
            w = _mm256_loadu_ps(b3 + k);
            c03 = _mm256_fmadd_ps(v0, w, c03), c13 = _mm256_fmadd_ps(v1, w, c13), c23 = _mm256_fmadd_ps(v2, w, c23);
        }
        float *y0 = y + m * N, *y1 = y0 + N, *y2 = y1 + N;
        store(y0, scale, bias, n, N, hsum(c00)), store(y0, scale, bias, n + 1, N, hsum(c01));
        store(y0, scale, bias, n + 2, N, hsum(c02)), store(y0, scale, bias, n + 3, N, hsum(c03));
        store(y1, scale, bias, n, N, hsum(c10)), store(y1, scale, bias, n + 1, N, hsum(c11));
        store(y1, scale, bias, n + 2, N, hsum(c12)), store(y1, scale, bias, n + 3, N, hsum(c13));
        store(y2, scale, bias, n, N, hsum(c20)), store(y2, scale, bias, n + 1, N, hsum(c21));
        store(y2, scale, bias, n + 2, N, hsum(c22)), store(y2, scale, bias, n + 3, N, hsum(c23));
    }
    for (; m < M; m++) {
        const float *xr = x + m * K;
        __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
        for (int64_t k = 0; k < K; k += 8) {
            __m256 v = _mm256_loadu_ps(xr + k);
            c0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(b0 + k), c0), c1 = _mm256_fmadd_ps(v, _mm256_loadu_ps(b1 + k), c1);
            c2 = _mm256_fmadd_ps(v, _mm256_loadu_ps(b2 + k), c2), c3 = _mm256_fmadd_ps(v, _mm256_loadu_ps(b3 + k), c3);
        }
        float *yr = y + m * N;
        store(yr, scale, bias, n, N, hsum(c0)), store(yr, scale, bias, n + 1, N, hsum(c1));
        store(yr, scale, bias, n + 2, N, hsum(c2)), store(yr, scale, bias, n + 3, N, hsum(c3));
    }
}

/* ``packed``: ceil(N / 4) blocks of 4*K bytes, K % 8 == 0 (outputs only for n < N).
 * 0 on success, -1 when a thread could not get its buffer. */
int w8_linear(const float *x, const int8_t *packed, const float *scale, const float *bias, float *y,
              int64_t M, int64_t K, int64_t N) {
    const int64_t blocks = (N + 3) / 4;
    if (M == 1) {
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < blocks; b++) gemv_block(x, packed + b * 4 * K, scale, bias, y, K, N, b);
        return 0;
    }
    int failed = 0;
    const int64_t groups = (blocks + BLOCKS - 1) / BLOCKS;
#pragma omp parallel reduction(| : failed)
    {
        float *buf = (float *)aligned_alloc(64, sizeof(float) * 4 * BLOCKS * (size_t)K);
        if (!buf) failed = 1;
#pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; g++) {
            if (!buf) continue;
            const int64_t b0 = g * BLOCKS, nb = blocks - b0 < BLOCKS ? blocks - b0 : BLOCKS;
            for (int64_t i = 0; i < nb; i++) {
                const int8_t *p = packed + (b0 + i) * 4 * K;
                float *dst = buf + i * 4 * K;
                for (int64_t k = 0; k < K; k += 8, p += 32)
                    for (int j = 0; j < 4; j++) _mm256_storeu_ps(dst + j * K + k, load8(p + j * 8));
            }
            for (int64_t i = 0; i < nb; i++) rows4(x, buf + i * 4 * K, scale, bias, y, M, K, N, (b0 + i) * 4);
        }
        free(buf);
    }
    return failed ? -1 : 0;
}
