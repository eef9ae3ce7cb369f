/* The finite-difference level sums of one CPU chunk in one pass: gradcheck_bi/fd/_c_fd.py.
 *
 * Per perturbed row (m, r) and level k of ys (2L, M, R, D), the +o outputs first:
 *
 *     odd:   sum_i (y_i(+o) - y_i(-o)) * g_i
 *     even:  sum_i ((y_i(-o) - y0_i) + (y_i(+o) - y0_i)) * g_i
 *
 * every term rounded once in double as torch's elementwise ops round it, added in the order
 * of gradcheck_bi.sums.reduction.row_sum: blocks of `width` = min(max_block, next_pow2(D))
 * columns added one after another into a `width`-wide accumulator (a short last block adds
 * +0.0 past its end), then the accumulator folded in halves (element j meets j + w). Built
 * with -ffp-contract=off and without fast-math: no fused multiply-add, no reassociation, so
 * the bits are the torch path's on any vector width.
 */
#include <stdint.h>
#include <stdlib.h>

#define LEVEL_SUMS(T)                                                                        \
static inline void terms_set_##T(const T *yp, const T *yn, const double *c,                 \
                                 const double *g, double *ao, double *ae, int64_t n) {       \
    for (int64_t j = 0; j < n; j++) {                                                        \
        double a = (double)yp[j], b = (double)yn[j];                                         \
        ao[j] = (a - b) * g[j];                                                              \
        ae[j] = ((b - c[j]) + (a - c[j])) * g[j];                                            \
    }                                                                                        \
}                                                                                            \
                                                                                             \
static inline void terms_add_##T(const T *yp, const T *yn, const double *c,                 \
                                 const double *g, double *ao, double *ae, int64_t n,         \
                                 int64_t width) {                                            \
    for (int64_t j = 0; j < n; j++) {                                                        \
        double a = (double)yp[j], b = (double)yn[j];                                         \
        ao[j] += (a - b) * g[j];                                                             \
        ae[j] += ((b - c[j]) + (a - c[j])) * g[j];                                           \
    }                                                                                        \
    for (int64_t j = n; j < width; j++) { /* the zero padding of a short last block */     \
        ao[j] += 0.0;                                                                        \
        ae[j] += 0.0;                                                                        \
    }                                                                                        \
}                                                                                            \
                                                                                             \
int level_sums_##T(const T *ys, int64_t n_lev, int64_t n_m, int64_t n_r, int64_t n_cols,     \
                   const double *y0, const double *g, int odd, int even, int64_t max_block,  \
                   double *out, int64_t s0, int64_t s1, int64_t s2) {                        \
    int64_t width = 1;                                                                       \
    while (width < n_cols && width < max_block) width *= 2;                                  \
    int64_t n_blocks = (n_cols + width - 1) / width, plane = n_m * n_r * n_cols;             \
    double *ao = malloc(sizeof(double) * (size_t)width);                                     \
    double *ae = malloc(sizeof(double) * (size_t)width);                                     \
    if (ao == NULL || ae == NULL) {                                                          \
        free(ao);                                                                            \
        free(ae);                                                                            \
        return 1;                                                                            \
    }                                                                                        \
    for (int64_t m = 0; m < n_m; m++) {                                                      \
        for (int64_t r = 0; r < n_r; r++) {                                                  \
            const double *c = y0 + r * n_cols, *gr = g + r * n_cols;                         \
            for (int64_t k = 0; k < n_lev; k++) {                                            \
                const T *yp = ys + k * plane + (m * n_r + r) * n_cols;                       \
                const T *yn = yp + n_lev * plane;                                            \
                int64_t w;                                                                   \
                if (n_blocks > 1) { /* block 0, then += every further block */               \
                    terms_set_##T(yp, yn, c, gr, ao, ae, width);                             \
                    for (int64_t b = 1; b < n_blocks; b++) {                                 \
                        int64_t lo = b * width;                                              \
                        int64_t hi = lo + width < n_cols ? lo + width : n_cols;              \
                        terms_add_##T(yp + lo, yn + lo, c + lo, gr + lo, ao, ae, hi - lo,    \
                                      width);                                                \
                    }                                                                        \
                    w = width;                                                               \
                } else if (width > 1) { /* one block: its halves, the second padded */       \
                    w = width / 2;                                                           \
                    terms_set_##T(yp, yn, c, gr, ao, ae, w);                                 \
                    terms_add_##T(yp + w, yn + w, c + w, gr + w, ao, ae, n_cols - w, w);     \
                } else {                                                                     \
                    w = 1;                                                                   \
                    terms_set_##T(yp, yn, c, gr, ao, ae, 1);                                 \
                }                                                                            \
                while (w > 1) { /* fold in halves */                                         \
                    w /= 2;                                                                  \
                    for (int64_t j = 0; j < w; j++) {                                        \
                        ao[j] += ao[w + j];                                                  \
                        ae[j] += ae[w + j];                                                  \
                    }                                                                        \
                }                                                                            \
                if (odd) out[k * s0 + m * s1 + r * s2] = ao[0];                              \
                if (even) out[(n_lev * odd + k) * s0 + m * s1 + r * s2] = ae[0];             \
            }                                                                                \
        }                                                                                    \
    }                                                                                        \
    free(ao);                                                                                \
    free(ae);                                                                                \
    return 0;                                                                                \
}

LEVEL_SUMS(double)
LEVEL_SUMS(float)
