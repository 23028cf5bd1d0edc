## gemm.cl: C = act(alpha * op(A) @ op(B) + beta * C + bias), batched, two tile variants.
## Parameters (template):
##   dtype            float32 | float64 | float16 (half storage, float arithmetic)
##   variant          "reg": register-blocked, no local memory, no barriers (CPUs)
##                    "local": local-memory tiles shared by a work-group (GPUs)
##   trans_a, trans_b A stored (K, M) / B stored (N, K)
##   act              epilogue activation (a name from clnn.ACTIVATIONS) or "none"
##   bias             "none", "col" (bias[n] to column n: dense layers) or "row"
##                    (bias[m] to row m: convolution output channels)
##   conv             "none" (plain GEMM) or the implicit-GEMM loaders of a convolution:
##                    "fwd", "dgrad" (data gradient), "wgrad" (weight gradient)
##   even             ("local") M, N, K are multiples of MWG, NWG, KWG: the fast path
##                    without guarded loads and stores
##   tuning           the tile parameters below, as a dict (see clnn/tuning.py)
## Used by clnn/ops/gemm.py (and, through it, dense and convolution layers).
<%include file="_common.cl"/>
<%include file="_activation.cl" args="act=act"/>
<%
    t = dict(tuning)
    VW = t.get("VW", 1)
%>
//
// Layouts are row-major with a leading dimension (row stride, in elements) and an
// element offset per operand, so blocks of rows or columns of bigger matrices work:
//   op(A) is M x K:  A(m, k) = a[m * lda + k]       or, transposed, a[k * lda + m]
//   op(B) is K x N:  B(k, n) = b[k * ldb + n]       or, transposed, b[n * ldb + k]
//   C is M x N:      C(m, n) = c[m * ldc + n]
// Batches (dimension 2 of the launch) add *_bstride elements per batch; a stride of 0
// shares that operand across the batch. With beta == 0 the old C is never read, so
// NaN there cannot leak into the result.
//
// ---- tuning parameters (${variant} variant)
% if variant == "reg":
#define MWI ${t["MWI"]}    // rows of C per work-item (and per A panel)
#define NWI ${t["NWI"]}    // columns of C per work-item (and per B panel), a multiple of VW
#define VW ${VW}     // vector width of the B loads and the accumulators
#if NWI % VW != 0
#error "NWI must be a multiple of VW"
#endif
% else:
#define MWG ${t["MWG"]}    // rows of C per work-group tile
#define NWG ${t["NWG"]}    // columns of C per work-group tile
#define KWG ${t["KWG"]}    // K step: depth of the tiles held in local memory
#define MDIMC ${t["MDIMC"]}  // work-items along M
#define NDIMC ${t["NDIMC"]}  // work-items along N
#define MWI (MWG / MDIMC)  // rows of C per work-item (strided by MDIMC)
#define NWI (NWG / NDIMC)  // columns of C per work-item (strided by NDIMC)
#if MWG % MDIMC != 0 || NWG % NDIMC != 0
#error "MWG and NWG must be multiples of MDIMC and NDIMC"
#endif
% endif

<% conv_sig = "" %>
% if conv in ("none", "wgrad"):
#define CLNN_C_IDX(m, n) ((m) * ldc + (n))
% endif
% if conv == "none":
%   if trans_a:
#define CLNN_A(m, k) CLNN_LOAD(a, (k) * lda + (m))
%   else:
#define CLNN_A(m, k) CLNN_LOAD(a, (m) * lda + (k))
%   endif
%   if trans_b:
#define CLNN_B(k, n) CLNN_LOAD(b, (n) * ldb + (k))
%   else:
#define CLNN_B(k, n) CLNN_LOAD(b, (k) * ldb + (n))
%   endif
% else:
<%
    conv_sig = (", const int cv_C, const int cv_H, const int cv_W, const int cv_M,"
                " const int cv_P, const int cv_Q, const int cv_R, const int cv_S,"
                " const int cv_sh, const int cv_sw, const int cv_ph, const int cv_pw")
%>
// ---- convolution as an implicit GEMM (${conv}): the loaders below compute where
// an element of the conceptual unrolled matrix lives in the input while a tile (or,
// for the CPU variant, a panel) is loaded, so the unrolled matrix is never stored.
// x is (N, C, H, W), w is (M, C, R, S), y is (N, M, P, Q), with
//   h = p * sh + r - ph,  w = q * sw + s - pw   (the lecture's loops, with stride and padding)
%   if conv == "fwd":
// y (M x NPQ) = w (M x CRS) @ unroll(x) (CRS x NPQ): the columns run over every image
// and output position, so a layer with few positions still makes one wide GEMM.
#define CLNN_A(m, k) CLNN_LOAD(a, (m) * lda + (k))
inline acc_t clnn_unrolled_x(__global const real_t *x, const int k, const int j,
                             const int cv_C, const int cv_H, const int cv_W,
                             const int cv_Q, const int cv_R, const int cv_S,
                             const int cv_sh, const int cv_sw, const int cv_ph,
                             const int cv_pw)
{
    const int c = k / (cv_R * cv_S), rs = k % (cv_R * cv_S);
    const int h = (j / cv_Q) * cv_sh + rs / cv_S - cv_ph;
    const int w = (j % cv_Q) * cv_sw + rs % cv_S - cv_pw;
    return (h >= 0 && h < cv_H && w >= 0 && w < cv_W) ? CLNN_LOAD(x, (c * cv_H + h) * cv_W + w)
                                                   : (acc_t)0;
}
#define CLNN_B(k, j) clnn_unrolled_x(b + (j) / (cv_P * cv_Q) * (cv_C * cv_H * cv_W), k, (j) % (cv_P * cv_Q), cv_C, cv_H, cv_W, cv_Q, cv_R, cv_S, cv_sh, cv_sw, cv_ph, cv_pw)
// column j = (n, p, q) of C is y[n, m, p, q]
#define CLNN_C_IDX(m, j) (((j) / (cv_P * cv_Q) * M + (m)) * (cv_P * cv_Q) + (j) % (cv_P * cv_Q))
%   elif conv == "dgrad":
// dx (C x NHW) = A (C x MRS) @ B (MRS x NHW) with A(c, (m,r,s)) = w[m, c, r, s] and
// B((m,r,s), (n,h,w)) = dy[n, m, p, q] where h = p sh + r - ph and w = q sw + s - pw,
// zero where no such (p, q) exists: every dx element gathers what it received, no
// atomics.
#define CLNN_A(c, k) CLNN_LOAD(a, ((k) / (cv_R * cv_S) * cv_C + (c)) * cv_R * cv_S + (k) % (cv_R * cv_S))
inline acc_t clnn_gathered_dy(__global const real_t *dy, const int k, const int j,
                              const int cv_W, const int cv_P, const int cv_Q,
                              const int cv_R, const int cv_S, const int cv_sh,
                              const int cv_sw, const int cv_ph, const int cv_pw)
{
    const int m = k / (cv_R * cv_S), rs = k % (cv_R * cv_S);
    const int hp = j / cv_W + cv_ph - rs / cv_S;     // p * sh
    const int wq = j % cv_W + cv_pw - rs % cv_S;     // q * sw
    if (hp < 0 || wq < 0 || hp % cv_sh || wq % cv_sw)
        return (acc_t)0;
    const int p = hp / cv_sh, q = wq / cv_sw;
    return (p < cv_P && q < cv_Q) ? CLNN_LOAD(dy, (m * cv_P + p) * cv_Q + q) : (acc_t)0;
}
#define CLNN_B(k, j) clnn_gathered_dy(b + (j) / (cv_H * cv_W) * (cv_M * cv_P * cv_Q), k, (j) % (cv_H * cv_W), cv_W, cv_P, cv_Q, cv_R, cv_S, cv_sh, cv_sw, cv_ph, cv_pw)
// column j = (n, h, w) of C is dx[n, c, h, w]
#define CLNN_C_IDX(c, j) (((j) / (cv_H * cv_W) * M + (c)) * (cv_H * cv_W) + (j) % (cv_H * cv_W))
%   elif conv == "wgrad":
// dw (M x CRS) = A (M x NPQ) @ B (NPQ x CRS) with A(m, (n,p,q)) = dy[n, m, p, q] and
// B((n,p,q), (c,r,s)) = x[n, c, h, w]: the sum over images and positions runs inside one
// work-item, in a fixed order, so dw is bitwise reproducible.
#define CLNN_A(m, k) CLNN_LOAD(a, ((k) / (cv_P * cv_Q) * cv_M + (m)) * cv_P * cv_Q + (k) % (cv_P * cv_Q))
inline acc_t clnn_unrolled_xt(__global const real_t *x, const int k, const int j,
                              const int cv_C, const int cv_H, const int cv_W,
                              const int cv_P, const int cv_Q, const int cv_R, const int cv_S,
                              const int cv_sh, const int cv_sw, const int cv_ph,
                              const int cv_pw)
{
    const int n = k / (cv_P * cv_Q), pq = k % (cv_P * cv_Q);
    const int c = j / (cv_R * cv_S), rs = j % (cv_R * cv_S);
    const int h = (pq / cv_Q) * cv_sh + rs / cv_S - cv_ph;
    const int w = (pq % cv_Q) * cv_sw + rs % cv_S - cv_pw;
    return (h >= 0 && h < cv_H && w >= 0 && w < cv_W)
        ? CLNN_LOAD(x, ((n * cv_C + c) * cv_H + h) * cv_W + w) : (acc_t)0;
}
#define CLNN_B(k, j) clnn_unrolled_xt(b, k, j, cv_C, cv_H, cv_W, cv_P, cv_Q, cv_R, cv_S, cv_sh, cv_sw, cv_ph, cv_pw)
%   else:
<% raise ValueError("unknown conv mode " + conv) %>
%   endif
% endif

// The fused epilogue for one element of C.
inline void clnn_epilogue(__global real_t *c, const int idx, const int m, const int n,
                          const acc_t acc, const acc_t alpha, const acc_t beta,
                          const acc_t act_p, __global const real_t *bias)
{
    acc_t v = alpha * acc;
    if (beta != (acc_t)0)
        v += beta * CLNN_LOAD(c, idx);
% if bias == "col":
    v += CLNN_LOAD(bias, n);     // one bias per column: dense layers, batch-first
% elif bias == "row":
    v += CLNN_LOAD(bias, m);     // one bias per row: output channels of a convolution
% endif
% if act != "none":
    v = clnn_f(v, act_p);
% endif
    CLNN_STORE(v, c, idx);
}

% if variant == "reg":
<%
    NVW = t["NWI"] // VW
    vec = f"{acc}{VW}" if VW > 1 else acc
    comps = "0123456789abcdef"
%>
// ---- packing: the CPU variant first copies A and B into panels, like BLIS does.
// A panel holds MWI rows of op(A) interleaved along k, a B panel NWI columns of op(B),
// for K rows of the reduction starting at k0 (the routine bounds the workspace by
// packing a group of batches or a slice of K at a time):
//   a_pk[((batch * Mb + mb) * K + k) * MWI + i] = op(A)(mb * MWI + i, k0 + k)
//   b_pk[((batch * Nb + nb) * K + k) * NWI + j] = op(B)(k0 + k, nb * NWI + j)
// zero past the edges of the matrices. The micro-kernel then streams two contiguous
// panels (the prefetcher's best case, no cache-set conflicts for power-of-two leading
// dimensions), needs no edge checks, and transposes cost nothing extra. Panels hold
// acc_t, so half inputs are converted once here.
__kernel void clnn_pack_a(const int M, const int K, const int Mb, const int k0,
                          __global const real_t *a, const int a_off, const int lda,
                          const int a_bstride, __global acc_t *a_pk${conv_sig})
{
    const int k = (int)get_global_id(0);
    const int mb = (int)get_global_id(1);
    const int batch = (int)get_global_id(2);
    if (k >= K || mb >= Mb)
        return;
    a += a_off + batch * a_bstride;
    __global acc_t *dst = a_pk + ((batch * Mb + mb) * K + k) * MWI;
    for (int i = 0; i < MWI; ++i) {
        const int m = mb * MWI + i;
        dst[i] = m < M ? CLNN_A(m, k0 + k) : (acc_t)0;
    }
}

__kernel void clnn_pack_b(const int N, const int K, const int Nb, const int k0,
                          const int n_base,
                          __global const real_t *b, const int b_off, const int ldb,
                          const int b_bstride, __global acc_t *b_pk${conv_sig})
{
    const int k = (int)get_global_id(0);
    const int nb = (int)get_global_id(1);
    const int batch = (int)get_global_id(2);
    if (k >= K || nb >= Nb)
        return;
    b += b_off + batch * b_bstride;
    __global acc_t *dst = b_pk + ((batch * Nb + nb) * K + k) * NWI;
% if conv == "none":
    for (int j = 0; j < NWI; ++j) {
        const int n = n_base + nb * NWI + j;
        dst[j] = n < N ? CLNN_B(k0 + k, n) : (acc_t)0;
    }
% else:
    // The convolution loaders of CLNN_B, with the divisions hoisted: the row index k
    // is split once per work-item, and the column index steps through the panel (the
    // generic loader divides for every element, which cost 80% of the time here).
    const int kk = k0 + k, n0 = n_base + nb * NWI;
%   if conv == "fwd":
    const int c = kk / (cv_R * cv_S), r = kk % (cv_R * cv_S) / cv_S, s = kk % cv_S;
    // column n0 + j is (image, p, q)
    __global const real_t *x_c = b + (n0 / (cv_P * cv_Q) * cv_C + c) * cv_H * cv_W;
    int p = n0 % (cv_P * cv_Q) / cv_Q, q = n0 % cv_Q;
    for (int j = 0; j < NWI; ++j) {
        const int h = p * cv_sh + r - cv_ph, w = q * cv_sw + s - cv_pw;
        dst[j] = (n0 + j < N && h >= 0 && h < cv_H && w >= 0 && w < cv_W)
            ? CLNN_LOAD(x_c, h * cv_W + w) : (acc_t)0;
        if (++q == cv_Q) {
            q = 0;
            if (++p == cv_P) { p = 0; x_c += cv_C * cv_H * cv_W; }   // the next image
        }
    }
%   elif conv == "dgrad":
    const int m = kk / (cv_R * cv_S), r = kk % (cv_R * cv_S) / cv_S, s = kk % cv_S;
    // column n0 + j is (image, h, w)
    __global const real_t *dy_m = b + (n0 / (cv_H * cv_W) * cv_M + m) * cv_P * cv_Q;
    int h = n0 % (cv_H * cv_W) / cv_W, w = n0 % cv_W;
    if (cv_sh == 1 && cv_sw == 1) {
        // unit stride: (p, q) = (h + ph - r, w + pw - s), no divisions at all
        for (int j = 0; j < NWI; ++j) {
            const int p = h + cv_ph - r, q = w + cv_pw - s;
            dst[j] = (n0 + j < N && p >= 0 && q >= 0 && p < cv_P && q < cv_Q)
                ? CLNN_LOAD(dy_m, p * cv_Q + q) : (acc_t)0;
            if (++w == cv_W) {
                w = 0;
                if (++h == cv_H) { h = 0; dy_m += cv_M * cv_P * cv_Q; }   // the next image
            }
        }
        return;
    }
    for (int j = 0; j < NWI; ++j) {
        const int hp = h + cv_ph - r, wq = w + cv_pw - s;   // p * sh, q * sw
        acc_t v = (acc_t)0;
        if (n0 + j < N && hp >= 0 && wq >= 0 && hp % cv_sh == 0 && wq % cv_sw == 0) {
            const int p = hp / cv_sh, q = wq / cv_sw;
            if (p < cv_P && q < cv_Q)
                v = CLNN_LOAD(dy_m, p * cv_Q + q);
        }
        dst[j] = v;
        if (++w == cv_W) {
            w = 0;
            if (++h == cv_H) { h = 0; dy_m += cv_M * cv_P * cv_Q; }       // the next image
        }
    }
%   elif conv == "wgrad":
    const int n = kk / (cv_P * cv_Q), p = kk % (cv_P * cv_Q) / cv_Q, q = kk % cv_Q;
    __global const real_t *x_n = b + n * cv_C * cv_H * cv_W;
    int c = n0 / (cv_R * cv_S), r = n0 % (cv_R * cv_S) / cv_S, s = n0 % cv_S;  // (c, r, s)
    for (int j = 0; j < NWI; ++j) {
        const int h = p * cv_sh + r - cv_ph, w = q * cv_sw + s - cv_pw;
        dst[j] = (n0 + j < N && h >= 0 && h < cv_H && w >= 0 && w < cv_W)
            ? CLNN_LOAD(x_n, (c * cv_H + h) * cv_W + w) : (acc_t)0;
        if (++s == cv_S) { s = 0; if (++r == cv_R) { r = 0; ++c; } }
    }
%   endif
% endif
}

typedef ${vec} vec_t;

// Register-blocked micro-kernel for CPUs. Each work-item owns an MWI x NWI block of C
// in MWI * NVW vector registers (unrolled by the template, so the compiler keeps every
// accumulator in a register). Per k it loads NVW vectors from its B panel and MWI
// scalars from its A panel and does MWI * NVW vector multiply-adds: the lecture's
// loop nest with the two loops over the output block kept in registers. Work-groups
// run along M, so the work-items of a group (which PoCL runs one after another on one
// core) share one B panel while it is in cache. No local memory and no barriers: on a
// CPU local memory is ordinary memory and a barrier splits the work-item loop.
// b_pk panels start at multiples of NWI elements (a multiple of VW) from a buffer
// start, so the vector loads are aligned.
__kernel void clnn_gemm(const int M, const int N, const int K,
                        const acc_t alpha, const acc_t beta, const acc_t act_p,
                        const int Mb, const int Nb, const int a_batched, const int b_batched,
                        __global const acc_t *a_pk, __global const acc_t *b_pk,
                        __global const real_t *bias, const int bias_off,
                        __global real_t *c, const int c_off, const int ldc,
                        const int c_bstride, const int n_base${conv_sig})
{
    const int mb = (int)get_global_id(0);
    const int nb = (int)get_global_id(1);
    const int batch = (int)get_global_id(2);
    if (mb >= Mb || nb >= Nb)
        return;
    __global const acc_t *ap = a_pk + ((a_batched * batch * Mb + mb) * K) * MWI;
    __global const acc_t *bp = b_pk + ((b_batched * batch * Nb + nb) * K) * NWI;
    c += c_off + batch * c_bstride;
    bias += bias_off;

% for i in range(t["MWI"]):
    vec_t ${" ".join(f"c{i}_{v} = (vec_t)(0){',' if v < NVW - 1 else ';'}" for v in range(NVW))}
% endfor
    for (int k = 0; k < K; ++k) {
% for v in range(NVW):
        const vec_t b${v} = *(__global const vec_t *)(bp + k * NWI + ${v * VW});
% endfor
% for i in range(t["MWI"]):
        {
            const vec_t a_pm = (vec_t)(ap[k * MWI + ${i}]);
%   for v in range(NVW):
            c${i}_${v} += a_pm * b${v};
%   endfor
        }
% endfor
    }

    const int m0 = mb * MWI, n0 = n_base + nb * NWI;
% for i in range(t["MWI"]):
    if (m0 + ${i} < M) {
%   for v in range(NVW):
%     for j in range(VW):
        if (n0 + ${v * VW + j} < N)
            clnn_epilogue(c, CLNN_C_IDX(m0 + ${i}, n0 + ${v * VW + j}), m0 + ${i},
                          n0 + ${v * VW + j}, c${i}_${v}${f".s{comps[j]}" if VW > 1 else ""},
                          alpha, beta, act_p, bias);
%     endfor
%   endfor
    }
% endfor
}
% else:

// Local-memory tiled GEMM for GPUs. A work-group of MDIMC x NDIMC work-items computes
// an MWG x NWG tile of C. For each K step the group copies an MWG x KWG tile of A and
// a KWG x NWG tile of B into local memory (${"sizes divide the tiles: no guards" if even else "zero outside the matrices"}), waits at a
// barrier, and each work-item accumulates its MWI x NWI outputs from local memory.
// Work-item (tm, tn) owns rows tm + i * MDIMC and columns tn + j * NDIMC, so
// neighbouring work-items touch neighbouring addresses when they store C.
__kernel __attribute__((reqd_work_group_size(MDIMC, NDIMC, 1)))
void clnn_gemm(const int M, const int N, const int K,
               const acc_t alpha, const acc_t beta, const acc_t act_p,
               __global const real_t *a, const int a_off, const int lda, const int a_bstride,
               __global const real_t *b, const int b_off, const int ldb, const int b_bstride,
               __global const real_t *bias, const int bias_off,
               __global real_t *c, const int c_off, const int ldc, const int c_bstride${conv_sig})
{
    __local acc_t a_lm[KWG][MWG];
    __local acc_t b_lm[KWG][NWG];
    const int tm = (int)get_local_id(0);
    const int tn = (int)get_local_id(1);
    const int tid = tn * MDIMC + tm;
    const int m0 = (int)get_group_id(0) * MWG;
    const int n0 = (int)get_group_id(1) * NWG;
    const int batch = (int)get_group_id(2);
    a += a_off + batch * a_bstride;
    b += b_off + batch * b_bstride;
    c += c_off + batch * c_bstride;
    bias += bias_off;

    acc_t acc[MWI][NWI];
    for (int i = 0; i < MWI; ++i)
        for (int j = 0; j < NWI; ++j)
            acc[i][j] = (acc_t)0;

    for (int k0 = 0; k0 < K; k0 += KWG) {
        // Cooperative loads; consecutive work-items read consecutive addresses of
        // the stored (possibly transposed) matrix.
        for (int idx = tid; idx < MWG * KWG; idx += MDIMC * NDIMC) {
% if trans_a:
            const int mm = idx % MWG, kk = idx / MWG;
% else:
            const int kk = idx % KWG, mm = idx / KWG;
% endif
            const int m = m0 + mm, k = k0 + kk;
% if even:
            a_lm[kk][mm] = CLNN_A(m, k);
% else:
            a_lm[kk][mm] = (m < M && k < K) ? CLNN_A(m, k) : (acc_t)0;
% endif
        }
        for (int idx = tid; idx < NWG * KWG; idx += MDIMC * NDIMC) {
% if trans_b:
            const int kk = idx % KWG, nn = idx / KWG;
% else:
            const int nn = idx % NWG, kk = idx / NWG;
% endif
            const int n = n0 + nn, k = k0 + kk;
% if even:
            b_lm[kk][nn] = CLNN_B(k, n);
% else:
            b_lm[kk][nn] = (n < N && k < K) ? CLNN_B(k, n) : (acc_t)0;
% endif
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < KWG; ++kk) {
            acc_t b_pm[NWI];
            for (int j = 0; j < NWI; ++j)
                b_pm[j] = b_lm[kk][tn + j * NDIMC];
            for (int i = 0; i < MWI; ++i) {
                const acc_t a_pm = a_lm[kk][tm + i * MDIMC];
                for (int j = 0; j < NWI; ++j)
                    acc[i][j] = mad(a_pm, b_pm[j], acc[i][j]);
            }
        }
        // the next iteration overwrites the tiles others may still be reading
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int i = 0; i < MWI; ++i) {
        const int m = m0 + tm + i * MDIMC;
        for (int j = 0; j < NWI; ++j) {
            const int n = n0 + tn + j * NDIMC;
% if not even:
            if (m < M && n < N)
% endif
                clnn_epilogue(c, CLNN_C_IDX(m, n), m, n, acc[i][j], alpha, beta, act_p, bias);
        }
    }
}
% endif

% if conv == "none":
// y = alpha * op(A) x + beta * y for one vector: one work-item per output row. Row m
// of op(A) is contiguous when A is not transposed; when it is, neighbouring
// work-items read neighbouring addresses instead. beta == 0 never reads y.
__kernel void clnn_gemv(const int M, const int K, const acc_t alpha, const acc_t beta,
                        __global const real_t *a, const int a_off, const int lda,
                        __global const real_t *x, const int x_off,
                        __global real_t *y, const int y_off)
{
    a += a_off;
    x += x_off;
    for (int m = (int)get_global_id(0); m < M; m += (int)get_global_size(0)) {
        acc_t acc = (acc_t)0;
        for (int k = 0; k < K; ++k)
            acc = mad(CLNN_A(m, k), CLNN_LOAD(x, k), acc);
        acc_t v = alpha * acc;
        if (beta != (acc_t)0)
            v += beta * CLNN_LOAD(y, y_off + m);
        CLNN_STORE(v, y, y_off + m);
    }
}
% endif
