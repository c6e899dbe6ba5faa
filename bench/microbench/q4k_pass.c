/* The byte kernels' Q4_K pass (engines/cuda/src/cpu/matmul/int8.rs, 8 rows, 16 columns a
 * tile, groups of 32) written plainly in C with AVX-512 VNNI intrinsics: the rate a compiler
 * reaches on this loop with nothing around it, to set beside the engine's.
 *
 *   cc -O3 -mavx512f -mavx512bw -mavx512vnni q4k_pass.c -o q4k_pass
 *   ./q4k_pass TILES ROWS PREFETCH REPEATS     e.g. ./q4k_pass 1024 64 1 8
 *
 * Prints vpdpbusd instructions per second on one core (64 multiply-adds each). The codes,
 * inputs and factors are arbitrary: the rate, not the sums, is the point. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define K 2048
#define GROUPS (K / 32)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s TILES ROWS PREFETCH REPEATS\n", argv[0]);
        return 2;
    }
    int tiles = atoi(argv[1]), rows = atoi(argv[2]), prefetch = atoi(argv[3]);
    int repeats = atoi(argv[4]);
    if (tiles < 1 || rows < 8 || rows % 8 || repeats < 1) {
        fprintf(stderr, "TILES >= 1, ROWS a multiple of 8, REPEATS >= 1\n");
        return 2;
    }
    int8_t *x = aligned_alloc(64, (size_t)rows * K);
    uint8_t *w = aligned_alloc(64, (size_t)(tiles + 8) * GROUPS * 256);
    float *steps = aligned_alloc(64, (size_t)GROUPS * rows * 4);
    float *factors = aligned_alloc(64, GROUPS * 64 * 2);
    float *out = aligned_alloc(64, (size_t)rows * tiles * 64);
    for (long i = 0; i < (long)rows * K; i++) x[i] = (int8_t)(i % 7 - 3);
    for (long i = 0; i < (long)(tiles + 8) * GROUPS * 256; i++) w[i] = (uint8_t)(i * 37);
    for (int i = 0; i < GROUPS * rows; i++) steps[i] = 0.01f;
    for (int i = 0; i < GROUPS * 32; i++) factors[i] = 1.0f;
    __m512i nibble = _mm512_set1_epi8(15);
    double start = now();
    for (int rep = 0; rep < repeats; rep++)
        for (int t = 0; t < tiles; t++) {
            const uint8_t *codes = w + (size_t)t * GROUPS * 256;
            for (int r0 = 0; r0 < rows; r0 += 8) {
                __m512 acc[8];
                for (int r = 0; r < 8; r++) acc[r] = _mm512_setzero_ps();
                for (int g = 0; g < GROUPS; g++) {
                    if (prefetch)
                        for (int l = 0; l < 256; l += 64)
                            _mm_prefetch((const char *)codes + (g + 8) * 256 + l, _MM_HINT_T0);
                    __m512i ints[8];
                    for (int r = 0; r < 8; r++) ints[r] = _mm512_setzero_si512();
                    for (int q = 0; q < 4; q++) {
                        __m512i b = _mm512_loadu_si512(codes + g * 256 + 64 * q);
                        __m512i lo = _mm512_and_si512(b, nibble);
                        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), nibble);
                        for (int r = 0; r < 8; r++) {
                            const int8_t *p = x + (size_t)(r0 + r) * K + g * 32 + 4 * q;
                            int32_t a, c;
                            __builtin_memcpy(&a, p, 4);
                            __builtin_memcpy(&c, p + 16, 4);
                            ints[r] = _mm512_dpbusd_epi32(ints[r], lo, _mm512_set1_epi32(a));
                            ints[r] = _mm512_dpbusd_epi32(ints[r], hi, _mm512_set1_epi32(c));
                        }
                    }
                    __m512 scale = _mm512_load_ps(factors + g * 16);
                    __m512 min = _mm512_load_ps(factors + GROUPS * 16 + g * 16);
                    for (int r = 0; r < 8; r++) {
                        float s = steps[g * rows + r0 + r];
                        __m512 step = _mm512_mul_ps(scale, _mm512_set1_ps(s));
                        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ints[r]), step, acc[r]);
                        acc[r] = _mm512_fmadd_ps(min, _mm512_set1_ps(s), acc[r]);
                    }
                }
                for (int r = 0; r < 8; r++)
                    _mm512_storeu_ps(out + ((size_t)(r0 + r) * tiles + t) * 16, acc[r]);
            }
        }
    double seconds = now() - start;
    double count = (double)repeats * tiles * (rows / 8) * GROUPS * 64;
    printf("tiles=%d rows=%d prefetch=%d: %.3f G vpdpbusd/s (check %f)\n", tiles, rows,
           prefetch, count / seconds / 1e9, out[5]);
    return 0;
}
