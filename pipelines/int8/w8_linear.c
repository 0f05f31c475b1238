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
 *    in registers and multiplied into the activations; nothing is written but the outputs. The
 *    activations stay float: the only error is the weights' rounding to int8 (per output channel);
 *  - several rows (prefill): compute, not memory, bounds it, and two cores' FMA units were the
 *    limit of the float way (~190 GFLOP/s on a 2-core EPYC). So each row of activations is
 *    rounded to int16 with a scale of its own (max |x| / 32767), two blocks of weights are widened
 *    to int16 once into a per-thread buffer (it stays in L1/L2), and 2 rows x 4 channels at a time
 *    run from it with vpmaddwd (16 products a step where an FMA does 8; 2 x 4, as 3 x 4 spills
 *    registers, the product needing one of its own): a product 1.2-1.7x as fast at the 0.5B
 *    thinker's shapes, a prefill 18-32% sooner (docs/cpu-agent.md, `python -m bench thinker`).
 *    Sums stay exact in int32 for KC inputs, then go on in int64. The error added: half an int16
 *    step of the row times the channel's sum of |weights| at most (tests/pipelines/test_w8.py
 *    states it); teacher-forced over a chat exchange the int8 thinker's log probabilities drift
 *    from fp32's as before (median 0.0183 against 0.0181 nats).
 *
 * Blocks are shared among OpenMP threads; built with -fopenmp against the libgomp that torch
 * already loaded, so the thread pool and its thread count are torch's.
 */
#include <immintrin.h>
#include <stdint.h>
#include <math.h>
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

#define BLOCKS 2 /* blocks of 4 channels converted to int16 together (prefill) */
#define KC 4096  /* inputs summed in int32 lanes before the sums go wide: each step adds at most
                  * 2 * 32767 * 127 to a lane, and 4096 inputs are 256 steps, under 2^31 */

static inline int64_t hsum_i32(__m256i v) { /* 8 lanes summed without overflow */
    __m256i lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(v));
    __m256i hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1));
    __m256i s = _mm256_add_epi64(lo, hi);
    __m128i t = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return _mm_cvtsi128_si64(t) + _mm_extract_epi64(t, 1);
}

static inline void store_q(float *y, const float *scale, const float *bias, int64_t n, int64_t N, int64_t dot, float xs) {
    if (n < N) y[n] = (float)((double)dot * xs * scale[n]) + (bias ? bias[n] : 0.0f);
}

/* Row m of x (K floats, K % 8 == 0) as int16 (K16, zero padded) with one scale: x ~= q * xs[m].
 * A NaN or an infinity has no int16: the row's scale is then NaN, and so are its outputs, as a
 * float product would make them (max_ps can drop a NaN, so v - v, NaN for both, is checked too). */
static void quantize_row(const float *x, int16_t *q, float *xs, int64_t K, int64_t K16) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), zero = _mm256_setzero_ps();
    __m256 mx = zero, bad = zero;
    for (int64_t k = 0; k < K; k += 8) {
        const __m256 v = _mm256_loadu_ps(x + k);
        mx = _mm256_max_ps(mx, _mm256_and_ps(absmask, v));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v, v), zero, _CMP_NEQ_UQ));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    *xs = _mm256_movemask_ps(bad) ? NAN : amax > 0.0f ? amax / 32767.0f : 1.0f;
    const __m256 iv = _mm256_set1_ps(amax > 0.0f ? 32767.0f / amax : 0.0f);
    for (int64_t k = 0; k < K16; k += 16) {
        const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k), iv));
        const __m256i b = k + 8 < K ? _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8), iv)) : _mm256_setzero_si256();
        /* packs works within 128-bit lanes: a0-3 b0-3 a4-7 b4-7; the permute puts them in order */
        _mm256_storeu_si256((__m256i *)(q + k), _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8));
    }
}

/* one 16-input step of a row and 4 channels: c_j += madd(x, w_j) */
#define STEP4(c0, c1, c2, c3, xv)                                                                        \
    c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(xv, _mm256_load_si256((const __m256i *)(b0 + k)))),   \
    c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(xv, _mm256_load_si256((const __m256i *)(b1 + k)))),   \
    c2 = _mm256_add_epi32(c2, _mm256_madd_epi16(xv, _mm256_load_si256((const __m256i *)(b2 + k)))),   \
    c3 = _mm256_add_epi32(c3, _mm256_madd_epi16(xv, _mm256_load_si256((const __m256i *)(b3 + k))))

/* rows [0, M) of int16 activations xq[M][K16] (scales xs) and 4 channels of int16 weights
 * buf[4][K16], outputs from channel n. Sums in int32 for KC inputs at a time, then in int64. */
static void rows4(const int16_t *xq, const float *xs, const int16_t *buf, const float *scale, const float *bias,
                  float *y, int64_t M, int64_t K16, int64_t N, int64_t n) {
    const int16_t *b0 = buf, *b1 = buf + K16, *b2 = buf + 2 * K16, *b3 = buf + 3 * K16;
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) { /* 2 rows x 4 channels: 8 accumulators, 2 rows, a weight and a product in 12 registers */
        const int16_t *x0 = xq + m * K16, *x1 = x0 + K16;
        int64_t t[8] = {0};
        for (int64_t k0 = 0; k0 < K16; k0 += KC) {
            const int64_t end = k0 + KC < K16 ? k0 + KC : K16;
            __m256i c00 = _mm256_setzero_si256(), c01 = c00, c02 = c00, c03 = c00;
            __m256i c10 = c00, c11 = c00, c12 = c00, c13 = c00;
            for (int64_t k = k0; k < end; k += 16) {
                const __m256i v0 = _mm256_loadu_si256((const __m256i *)(x0 + k));
                const __m256i v1 = _mm256_loadu_si256((const __m256i *)(x1 + k));
                __m256i w = _mm256_load_si256((const __m256i *)(b0 + k));
                c00 = _mm256_add_epi32(c00, _mm256_madd_epi16(v0, w)), c10 = _mm256_add_epi32(c10, _mm256_madd_epi16(v1, w));
                w = _mm256_load_si256((const __m256i *)(b1 + k));
                c01 = _mm256_add_epi32(c01, _mm256_madd_epi16(v0, w)), c11 = _mm256_add_epi32(c11, _mm256_madd_epi16(v1, w));
                w = _mm256_load_si256((const __m256i *)(b2 + k));
                c02 = _mm256_add_epi32(c02, _mm256_madd_epi16(v0, w)), c12 = _mm256_add_epi32(c12, _mm256_madd_epi16(v1, w));
                w = _mm256_load_si256((const __m256i *)(b3 + k));
                c03 = _mm256_add_epi32(c03, _mm256_madd_epi16(v0, w)), c13 = _mm256_add_epi32(c13, _mm256_madd_epi16(v1, w));
            }
            t[0] += hsum_i32(c00), t[1] += hsum_i32(c01), t[2] += hsum_i32(c02), t[3] += hsum_i32(c03);
            t[4] += hsum_i32(c10), t[5] += hsum_i32(c11), t[6] += hsum_i32(c12), t[7] += hsum_i32(c13);
        }
        for (int r = 0; r < 2; r++)
            for (int j = 0; j < 4; j++) store_q(y + (m + r) * N, scale, bias, n + j, N, t[r * 4 + j], xs[m + r]);
    }
    for (; m < M; m++) {
        const int16_t *xr = xq + m * K16;
        int64_t t[4] = {0};
        for (int64_t k0 = 0; k0 < K16; k0 += KC) {
            const int64_t end = k0 + KC < K16 ? k0 + KC : K16;
            __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
            for (int64_t k = k0; k < end; k += 16) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(xr + k));
                STEP4(c0, c1, c2, c3, v);
            }
            t[0] += hsum_i32(c0), t[1] += hsum_i32(c1), t[2] += hsum_i32(c2), t[3] += hsum_i32(c3);
        }
        for (int j = 0; j < 4; j++) store_q(y + m * N, scale, bias, n + j, N, t[j], xs[m]);
    }
}

/* ``packed``: ceil(N / 4) blocks of 4*K bytes, K % 8 == 0 (outputs only for n < N).
 * 0 on success, -1 when a buffer could not be had. */
int w8_linear(const float *x, const int8_t *packed, const float *scale, const float *bias, float *y,
              int64_t M, int64_t K, int64_t N) {
    const int64_t blocks = (N + 3) / 4;
    if (M == 1) {
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < blocks; b++) gemv_block(x, packed + b * 4 * K, scale, bias, y, K, N, b);
        return 0;
    }
    const int64_t K16 = (K + 15) / 16 * 16;
    int16_t *xq = (int16_t *)aligned_alloc(64, (sizeof(int16_t) * (size_t)(M * K16) + 63) / 64 * 64); /* a multiple of 64, as C11 asks */
    float *xs = (float *)malloc(sizeof(float) * (size_t)M);
    if (!xq || !xs) {
        free(xq), free(xs);
        return -1;
    }
    int failed = 0;
    const int64_t groups = (blocks + BLOCKS - 1) / BLOCKS;
#pragma omp parallel reduction(| : failed)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) quantize_row(x + m * K, xq + m * K16, xs + m, K, K16);
        /* (the loop's barrier: every row is quantized before any is read) */
        int16_t *buf = (int16_t *)aligned_alloc(64, sizeof(int16_t) * 4 * BLOCKS * (size_t)K16);
        if (!buf) failed = 1;
#pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; g++) {
            if (!buf) continue;
            const int64_t b0 = g * BLOCKS, nb = blocks - b0 < BLOCKS ? blocks - b0 : BLOCKS;
            for (int64_t i = 0; i < nb; i++) {
                const int8_t *p = packed + (b0 + i) * 4 * K;
                int16_t *dst = buf + i * 4 * K16;
                int64_t k = 0;
                for (; k + 16 <= K; k += 16, p += 64)
                    for (int j = 0; j < 4; j++) {
                        const __m128i lo = _mm_loadl_epi64((const __m128i *)(p + j * 8));
                        const __m128i hi = _mm_loadl_epi64((const __m128i *)(p + 32 + j * 8));
                        _mm256_store_si256((__m256i *)(dst + j * K16 + k), _mm256_cvtepi8_epi16(_mm_unpacklo_epi64(lo, hi)));
                    }
                if (k < K) /* K % 16 == 8: the last 8 inputs, then zeros */
                    for (int j = 0; j < 4; j++) {
                        const __m128i lo = _mm_loadl_epi64((const __m128i *)(p + j * 8));
                        _mm256_store_si256((__m256i *)(dst + j * K16 + k), _mm256_cvtepi8_epi16(lo));
                    }
            }
            for (int64_t i = 0; i < nb; i++) rows4(xq, xs, buf + i * 4 * K16, scale, bias, y, M, K16, N, (b0 + i) * 4);
        }
        free(buf);
    }
    free(xq), free(xs);
    return failed ? -1 : 0;
}
