## gemm.cl: C = act(alpha * op(A) @ op(B) + beta * C + bias), batched, two tile variants.
## Parameters (template):
##   dtype            float32 | float64 | float16 | bfloat16 (the last two: storage
##                    only, float arithmetic)
##   variant          "reg": packed panels and register blocks, no local memory (CPUs)
##                    "local": local-memory tiles shared by a work-group (GPUs)
##   trans_a, trans_b A stored (K, M) / B stored (N, K)
##   act              epilogue activation (a name from clnn.ACTIVATIONS) or "none"
##   bias             "none", "col" (bias[n] to column n: dense layers) or "row"
##                    (bias[m] to row m: convolution output channels)
##   conv             "none" (plain GEMM) or the implicit-GEMM loaders of a convolution:
##                    "fwd", "dgrad" (data gradient), "wgrad" (weight gradient)
##   vec              ("local") width of the vector loads and stores of plain matrix
##                    operands: 1, 2 or 4, or 8 halves for a cp.async row's copies
##                    (the routine checks their alignment)
##   partial          ("local") write the raw sums of one K slice to a workspace, for
##                    clnn_gemm_splitk to add up in a fixed order (split-K)
##   tuning           the tile parameters below, as a dict (see clnn/tuning.py); a
##                    "local" row with "MMA" ("tf32", or "f16" for 16-bit storage:
##                    float16 and bfloat16) multiplies its tiles on NVIDIA's matrix
##                    engines (mma.sync, inline PTX), a warp per WM x WN block: chosen
##                    only for NVIDIA compute capability 8.0 and up; "LDSM" (ldmatrix)
##                    and "ASYNC" (cp.async tile pipelines) are its variants
## Kernels: "reg": clnn_pack_a, clnn_pack_b, clnn_gemm_packed, clnn_gemv,
##          clnn_gemm_direct, clnn_gemm_splitk (conv "none": 16-bit K slices' epilogue);
##          "local": clnn_gemm_tiled, clnn_gemm_splitk.
## Used by clnn/ops/gemm.py (and, through it, dense and convolution layers).
<%include file="_common.cl"/>
<%namespace name="mma" file="_mma.cl"/>\
<%
    t = dict(tuning)
    VW = t.get("VW", 1)
    # 512-bit tiles (VW 16 floats or 8 doubles: the routine takes them only where the
    # device's code has 512-bit vectors, tuning.gemm_problems) keep them in the
    # micro-kernel's registers; everything else (packing, the epilogue, the direct
    # kernel, the K slices' pass) works on vectors of at most 256 bits, HVW lanes,
    # which every helper serves (an accumulator's epilogue in halves)
    HVW = min(VW, cpu_lanes)
%>
<%namespace name="rb" file="_regblock.cl"/>
//
// Layouts are row-major with a leading dimension (row stride, in elements) and an
// element offset per operand, so blocks of rows or columns of bigger matrices work:
//   op(A) is M x K:  A(m, k) = a[m * lda + k]       or, transposed, a[k * lda + m]
//   op(B) is K x N:  B(k, n) = b[k * ldb + n]       or, transposed, b[n * ldb + k]
//   C is M x N:      C(m, n) = c[m * ldc + n]
// Every kernel takes a matrix operand as its buffer and one int4 descriptor, x_desc =
// (element offset, leading dimension, batch stride, unused) (clnn/ops/gemm.py's
// Operand.desc). Batches (the last dimension of the launch) add the batch stride per
// batch; a stride of 0 shares that operand across the batch. With beta == 0 the old C
// is never read, so NaN there cannot leak into the result.

% if variant == "reg":
// ---- tuning parameters (reg variant)
#define MWI ${t["MWI"]}    // rows of C per work-item (and per A panel)
#define NWI ${t["NWI"]}    // columns of C per work-item (and per B panel), a multiple of VW
#define VW ${VW}     // vector width of the B loads and the accumulators
#define HVW ${HVW}    // vector width of the rest: packing, epilogue, direct kernel (<= 256 bits)
#if NWI % VW != 0
#error "NWI must be a multiple of VW"
#endif

<% conv_sig, c_map = "", False %>
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

<%
    NVW = t["NWI"] // VW
    rvec = f"{acc}{VW}" if VW > 1 else acc
    comps = "0123456789abcdef"
    if VW > 2 * cpu_lanes:  # VW counts float32 lanes: tuning.template_tuning halves it
        raise ValueError(f"VW={VW} vectors of {acc} are wider than 512 bits "
                         f"(programs.CPU_LANES)")
    hvec = f"{acc}{HVW}" if HVW > 1 else acc
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
// acc_t, so 16-bit inputs (float16, bfloat16) are converted once here.
__kernel void clnn_pack_a(const int M, const int K, const int Mb, const int k0,
                          __global const real_t *a, const int4 a_desc,
                          __global acc_t *a_pk${conv_sig})
{
    const int k = (int)get_global_id(0);
    const int mb = (int)get_global_id(1);
    const int batch = (int)get_global_id(2);
    if (k >= K || mb >= Mb)
        return;
    const int lda = a_desc.s1;
    (void)lda;      // (the data and weight gradients' loaders read none)
    a += a_desc.s0 + batch * a_desc.s2;
    __global acc_t *dst = a_pk + ((batch * Mb + mb) * K + k) * MWI;
    if ((mb + 1) * MWI <= M) {
        // a whole panel: no bounds to check per element, so the work-group loop
        // vectorises across k (16-bit loads and their conversions included)
        for (int i = 0; i < MWI; ++i)
            dst[i] = CLNN_A(mb * MWI + i, k0 + k);
        return;
    }
    for (int i = 0; i < MWI; ++i) {
        const int m = mb * MWI + i;
        dst[i] = m < M ? CLNN_A(m, k0 + k) : (acc_t)0;
    }
}

__kernel void clnn_pack_b(const int N, const int K, const int Nb, const int k0,
                          const int n_base,
                          __global const real_t *b, const int4 b_desc,
                          __global acc_t *b_pk${conv_sig})
{
    const int k = (int)get_global_id(0);
    const int nb = (int)get_global_id(1);
    const int batch = (int)get_global_id(2);
    if (k >= K || nb >= Nb)
        return;
    const int ldb = b_desc.s1;
    (void)ldb;      // (the convolution loaders read none)
    b += b_desc.s0 + batch * b_desc.s2;
    __global acc_t *dst = b_pk + ((batch * Nb + nb) * K + k) * NWI;
% if conv == "none":
    if (n_base + (nb + 1) * NWI <= N) {      // a whole panel, as in clnn_pack_a
%   if not trans_b and HVW in (2, 4, 8):
        // rows of B run along n: whole vectors, 16-bit ones converted a vector at a time
        // (float16 through vload_halfN, F16C's conversion on x86: 10-30% faster than the
        // scalar loop below, which the work-group loop vectorises across k; clnn's own
        // conversion of vectors, before, took 3.5x that loop's time)
        __global const real_t *src = b + (k0 + k) * ldb + n_base + nb * NWI;
%     for v in range(t["NWI"] // HVW):
        *(__global ${hvec} *)(dst + ${v * HVW}) = CLNN_LOADV(${HVW}, src + ${v * HVW});
%     endfor
%   else:
        for (int j = 0; j < NWI; ++j)
            dst[j] = CLNN_B(k0 + k, n_base + nb * NWI + j);
%   endif
        return;
    }
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

typedef ${rvec} vec_t;
typedef ${hvec} hvec_t;
<%
    # C's rows are contiguous (plain GEMMs and weight gradients): a work-item stores a
    # whole vector of a row at once where the vector lies inside C
    vec_store = HVW in (2, 4, 8) and conv in ("none", "wgrad")
%>
// the fused epilogue: clnn_epilogue, and clnn_epilogue_v for runs of HVW columns where
// C's rows are contiguous
<%include file="_epilogue.cl" args="act=act, bias=bias, width=HVW if vec_store else 0, vector_act=True"/>

// Register-blocked micro-kernel for CPUs (_regblock.cl): a work-item's MWI x NWI block
// of C, from its A panel and its B panel. The work-items of a group (which PoCL runs
// one after another on one core) are consecutive row blocks that share one B panel
// while it is in cache. No local memory and no barriers: on a CPU local memory is
// ordinary memory and a barrier splits the work-item loop. b_pk panels start at
// multiples of NWI elements (a multiple of VW) from a buffer start, so the vector loads
// are aligned. Dimension 0 of the grid holds Nb groups of row blocks for every panel,
// in one of two orders: rows first (the groups of a panel run one after another, so
// every panel reads all of A) or panels first (the groups of a block of rows walk the
// panels, so every block of rows reads all of B); the routine picks the one that
// re-reads the smaller operand.
__kernel void clnn_gemm_packed(const int M, const int N, const int K,
                               const acc_t alpha, const acc_t beta, const acc_t act_p, const acc_t act_q,
                               const int Mb, const int Nb, const int a_bstride, const int b_bstride,
                               __global const acc_t *a_pk, __global const acc_t *b_pk,
                               __global const real_t *bias, const int bias_off,
                               __global real_t *c, const int4 c_desc,
                               const int n_base, const int panels_first${conv_sig})
{
    const int group = (int)get_group_id(0), wg = (int)get_local_size(0);
    const int Gm = (Mb + wg - 1) / wg;                     // groups of row blocks
    const int mb = (panels_first ? group / Nb : group % Gm) * wg + (int)get_local_id(0);
    const int nb = panels_first ? group % Nb : group / Gm;
    const int batch = (int)get_global_id(2);
    if (mb >= Mb || nb >= Nb)
        return;
    __global const acc_t *ap = a_pk + batch * a_bstride + mb * K * MWI;
    __global const acc_t *bp = b_pk + batch * b_bstride + nb * K * NWI;
    const int ldc = c_desc.s1;
    (void)ldc;      // (the convolution's C index reads none)
    c += c_desc.s0 + batch * c_desc.s2;
    bias += bias_off;

${rb.accumulators(t["MWI"], NVW)}\
    for (int k = 0; k < K; ++k) {
${rb.multiply(t["MWI"], NVW, VW, "bp + k * NWI", "ap[k * MWI + {i}]")}\
    }

    const int m0 = mb * MWI, n0 = n_base + nb * NWI;
${rb.epilogue(t["MWI"], NVW, VW, "c", "m0 + {i} < M", "CLNN_C_IDX(m0 + {i}, {n})", "m0 + {i}", "n0", "N", "whole" if vec_store else None, part=HVW)}\
}
% if conv == "none":
// y = alpha * op(A) x + beta * y for one vector: one work-item per output row. Row m
// of op(A) is contiguous when A is not transposed; when it is, neighbouring
// work-items read neighbouring addresses instead. beta == 0 never reads y.
__kernel void clnn_gemv(const int M, const int K, const acc_t alpha, const acc_t beta,
                        __global const real_t *a, const int4 a_desc,
                        __global const real_t *x, const int x_off,
                        __global real_t *y, const int y_off)
{
    const int lda = a_desc.s1;
    a += a_desc.s0;
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
% if conv == "none" and not trans_a:
<%
    DM = 2 if trans_b else 4    # rows of C per block (a work-item loops over all of M)
    DN = 4 if trans_b else 2    # columns of C per work-item (NN: vectors of HVW columns)
    def vload(ptr, idx):
        """HVW consecutive elements from ``ptr[idx]`` as one vector (element by element
        in the source: PoCL makes vloadN a call; the compiler merges these loads).
        16-bit storage: CLNN_LOADV, whose conversion of a whole vector (F16C's for
        float16) beats HVW scalar ones."""
        if HVW == 1:
            return f"CLNN_LOAD({ptr}, {idx})"
        if storage_only and HVW in (2, 4, 8):
            return f"CLNN_LOADV({HVW}, {ptr} + {idx})"
        return "(hvec_t)(" + ", ".join(f"CLNN_LOAD({ptr}, {idx} + {j})" for j in range(HVW)) + ")"
%>
// ---- direct (CPUs, op(A) not transposed, few rows of C: a batch of a few examples
// through a dense layer): op(A) and op(B) are read where they lie, without packing. A
// 64 x 2000 by 2000 x 5000 product's packing read and wrote B's 40 MB before the
// multiply read them again; here each work-item reads its columns' part of B once and
// keeps it in cache while it loops over every block of DM rows of C.
%   if trans_b:
// C(m, n) = sum_k A(m, k) B(n, k): rows of A and of B (W of a dense layer) run along k,
// so the sums are HVW lanes wide along k (lane j sums k = j mod HVW), added up across the
// lanes in a fixed order at the end, then the k past the last whole vector.
%   else:
// C(m, n .. n + HVW) += A(m, k) * B(k, n .. n + HVW): rows of B run along n.
%   endif
%   if HVW > 1:
#define CLNN_LANES_SUM(v) clnn_lanes_sum${HVW}(v)
%   else:
#define CLNN_LANES_SUM(v) (v)
%   endif

__kernel void clnn_gemm_direct(const int M, const int N, const int K,
                               const acc_t alpha, const acc_t beta, const acc_t act_p,
                               const acc_t act_q,
                               __global const real_t *a, const int4 a_desc,
                               __global const real_t *b, const int4 b_desc,
                               __global const real_t *bias, const int bias_off,
                               __global real_t *c, const int4 c_desc)
{
    const int batch = (int)get_global_id(1);
    const int lda = a_desc.s1, ldb = b_desc.s1, ldc = c_desc.s1;
    a += a_desc.s0 + batch * a_desc.s2;
    b += b_desc.s0 + batch * b_desc.s2;
    c += c_desc.s0 + batch * c_desc.s2;
    bias += bias_off;
%   if trans_b:
    const int n0 = (int)get_global_id(0) * ${DN};
    if (n0 >= N)
        return;
    // this work-item's rows of B; past N they repeat the last one (not stored)
%     for j in range(DN):
    __global const real_t *b${j} = b + min(n0 + ${j}, N - 1) * ldb;
%     endfor
    const int kv = K / HVW * HVW;
    for (int m0 = 0; m0 < M; m0 += ${DM}) {
%     for i in range(DM):
        __global const real_t *a${i} = a + min(m0 + ${i}, M - 1) * lda;
%     endfor
%     for i in range(DM):
        hvec_t ${", ".join(f"s{i}_{j} = (hvec_t)(0)" for j in range(DN))};
%     endfor
        for (int k = 0; k < kv; k += HVW) {
%     for i in range(DM):
            const hvec_t x${i} = ${vload(f"a{i}", "k")};
%     endfor
%     for j in range(DN):
            const hvec_t w${j} = ${vload(f"b{j}", "k")};
%       for i in range(DM):
            s${i}_${j} += x${i} * w${j};
%       endfor
%     endfor
        }
%     for i in range(DM):
%       for j in range(DN):
        acc_t t${i}_${j} = CLNN_LANES_SUM(s${i}_${j});
%       endfor
%     endfor
        for (int k = kv; k < K; ++k) {
%     for i in range(DM):
            const acc_t x${i} = CLNN_LOAD(a${i}, k);
%     endfor
%     for j in range(DN):
            const acc_t w${j} = CLNN_LOAD(b${j}, k);
%       for i in range(DM):
            t${i}_${j} += x${i} * w${j};
%       endfor
%     endfor
        }
%     for i in range(DM):
        if (m0 + ${i} < M) {
%       for j in range(DN):
            if (n0 + ${j} < N)
                clnn_epilogue(c, (m0 + ${i}) * ldc + n0 + ${j}, m0 + ${i}, n0 + ${j}, t${i}_${j},
                              alpha, beta, act_p, act_q, bias);
%       endfor
        }
%     endfor
    }
%   else:
    const int n0 = (int)get_global_id(0) * ${DN * HVW};
    if (n0 >= N)
        return;
    // columns past N (the last work-item's) load column N - 1 and are not stored
    const bool whole = n0 + ${DN * HVW} <= N;
%     for v in range(DN):
%       for j in range(HVW):
    const int n${v}_${j} = min(n0 + ${v * HVW + j}, N - 1);
%       endfor
%     endfor
    for (int m0 = 0; m0 < M; m0 += ${DM}) {
%     for i in range(DM):
        __global const real_t *a${i} = a + min(m0 + ${i}, M - 1) * lda;
%     endfor
%     for i in range(DM):
        hvec_t ${", ".join(f"s{i}_{v} = (hvec_t)(0)" for v in range(DN))};
%     endfor
<%def name="nn_k_step(whole, k, a_elem, pad)">\
${pad}{
${pad}    __global const real_t *bk = b + (${k}) * ldb${" + n0" if whole else ""};
%     for v in range(DN):
%       if whole:
${pad}    const hvec_t w${v} = ${vload("bk", str(v * HVW))};
%       else:
${pad}    const hvec_t w${v} = ${"(hvec_t)(" + ", ".join(f"CLNN_LOAD(bk, n{v}_{j})" for j in range(HVW)) + ")" if HVW > 1 else f"CLNN_LOAD(bk, n{v}_0)"};
%       endif
%     endfor
%     for i in range(DM):
${pad}    const hvec_t x${i} = (hvec_t)(${a_elem.format(i=i)});
%       for v in range(DN):
${pad}    s${i}_${v} += x${i} * w${v};
%       endfor
%     endfor
${pad}}
</%def>
<%def name="nn_k_loop(whole)">\
%     if storage_only and HVW in (2, 4, 8):
            // 16-bit A: HVW k of each row converted as one vector, then broadcast
            // lane by lane (a conversion per element took 1.7x the whole product's
            // time in float16, LeNet-5's dense data gradients)
            int k = 0;
            for (; k + ${HVW} <= K; k += ${HVW}) {
%       for i in range(DM):
                const hvec_t xs${i} = CLNN_LOADV(${HVW}, a${i} + k);
%       endfor
%       for j in range(HVW):
${nn_k_step(whole, f"k + {j}", "xs{i}.s" + "0123456789abcdef"[j], " " * 16)}\
%       endfor
            }
            for (; k < K; ++k)
${nn_k_step(whole, "k", "CLNN_LOAD(a{i}, k)", " " * 16)}\
%     else:
            for (int k = 0; k < K; ++k)
${nn_k_step(whole, "k", "CLNN_LOAD(a{i}, k)", " " * 16)}\
%     endif
</%def>
        if (whole) {
${nn_k_loop(True)}
        } else {
${nn_k_loop(False)}
        }
${rb.epilogue(DM, DN, HVW, "c", "m0 + {i} < M", "(m0 + {i}) * ldc + {n}", "m0 + {i}", "n0", "N", "whole" if vec_store else None, acc="s", indent=8)}\
    }
%   endif
}
% endif
% else:
<%
    MWG, NWG, KWG = t["MWG"], t["NWG"], t["KWG"]
    MDIMC, NDIMC = t["MDIMC"], t["NDIMC"]
    VWM, VWN = t.get("VWM", 1), t.get("VWN", 1)
    NT = MDIMC * NDIMC
    MWI, NWI = MWG // MDIMC, NWG // NDIMC
    MV, NV = MWI // VWM, NWI // VWN
    a_tab = conv in ("dgrad", "wgrad")      # A(m, k) = a[m * lda + ktab[k].w]
    b_tab = conv != "none"                  # B(k, j) gathered through ktab and colmap(j)
    c_map = conv in ("fwd", "dgrad")        # C(m, j) = c[m * ldc + colmap(j)]
    GVA = 1 if a_tab else vec
    GVB = 1 if b_tab else vec
    if t.get("MMA") == "tf32" and t.get("WGMMA"):
        # TF32 wgmma reads K-major tiles only: an operand stored along m (n) moves a
        # float at a time
        GVA = GVA if (a_tab or not trans_a) else 1
        GVB = GVB if trans_b else 1
    a_kfast = a_tab or not trans_a          # stored A runs along k: transposed into a_lm
    b_kfast = not b_tab and trans_b         # stored B runs along k: transposed into b_lm
    LDA = MWG + (4 if a_kfast else 0)       # the pad spreads transposed stores over banks
    LDB = NWG + (4 if b_kfast else 0)
    MMA = t.get("MMA", "none")              # matrix-engine inner product (NVIDIA only)
    EMULATE = bool(t.get("EMULATE"))        # the engine's semantics in OpenCL C (tests)
    if MMA != "none":
        # a warp per WM x WN block of the tile, in mma.sync tiles of 16 x 8 (x KI); a
        # lane (g, t4) = (lane / 4, lane % 4) reads the word at row t4 (+ 4), column g
        # (+ 8) of a local tile: rows of 8 modulo 32 words put the 32 lanes of a
        # fragment load in 32 different banks
        WM, WN = t["WM"], t["WN"]
        WARPS_N = NWG // WN
        MT, NTL = WM // 16, WN // 8
        KI = 8 if MMA == "tf32" else 16
        # WGMMA: a warpgroup (4 warps, 128 work-items) per WM x WN block instead of a
        # warp, in wgmma tiles of 64 x WN (x KI): MT of them along m
        WGMMA = bool(t.get("WGMMA"))
        PER_BLOCK = 128 if WGMMA else 32
        if WGMMA:
            MT = WM // 64
        if NT != PER_BLOCK * (MWG // WM) * WARPS_N or KWG % KI:
            raise ValueError(f"MMA tile {MWG}x{NWG}x{KWG} with warp blocks {WM}x{WN} "
                             f"needs {PER_BLOCK * (MWG // WM) * WARPS_N} work-items and KWG % {KI} == 0")
        # float16: local memory holds halves, a 32-bit word per (k pair, row) as the
        # fragments want them: LDA and LDB count words, the same 8 modulo 32 for both
        LDA, LDB = MWG + 8, NWG + 8
    # LDSM (float16 engines): tiles kept as plain halves, each operand in the layout its
    # global loads run along (an operand stored along k in rows of m or n that hold k,
    # else in rows of k), so a work-item stores its GV elements as one vector; rows
    # padded by 8 halves (16 bytes: the 8 rows one ldmatrix reads start 4 banks apart);
    # fragments loaded by ldmatrix (.trans from rows of k). RS* are the rows' lengths in
    # halves, SZ* a buffer's
    LDSM = MMA == "f16" and bool(t.get("LDSM"))
    if LDSM:
        if WN % 16:
            raise ValueError("LDSM loads B fragments two n-blocks at a time: WN % 16 == 0")
        RSA = KWG + 8 if a_kfast else MWG + 8
        RSB = KWG + 8 if b_kfast else NWG + 8
        SZA = MWG * RSA if a_kfast else KWG * RSA
        SZB = NWG * RSB if b_kfast else KWG * RSB
    # ASYNC (LDSM and TF32 rows): a pipeline of ASYNC tiles in local memory, filled by
    # cp.async (PTX: global to local without registers, 4, 8 or 16 bytes a copy, the
    # bytes past the source size zero-filled) ASYNC - 1 tiles ahead of the one
    # multiplied. Plain matrix operands only, as vectors of at least 4 bytes (halves in
    # pairs or more); a convolution's gathered operands and halves one at a time keep
    # the two register-staged buffers of their row. TF32 tiles then lie as the LDSM
    # rows' do, rows of k or rows of m (n) holding k, padded by 8 and 4 floats (a
    # fragment load's 32 lanes in 32 banks), and are rounded to TF32 as fragments load
    ITEM = 2 if MMA == "f16" else 4         # bytes per element of the tiles
    if MMA == "none":
        WGMMA = False
    STAGES = t.get("ASYNC", 0) if (LDSM or MMA == "tf32" or WGMMA) and conv == "none" and \
        vec * ITEM >= 4 else 0
    NBUF = STAGES or 2                       # tiles of each operand in local memory
    # WGMMA (Hopper's wgmma.mma_async, compute capability 9.0): the warpgroup's
    # operands come from local memory through 64-bit descriptors, in the canonical
    # layout without swizzling: "core matrices" of 8 rows of 16 bytes (8 halves or 4
    # floats), each 128 contiguous bytes. A tile of WX rows (m or n) by KWG: core
    # matrix (x / 8, k / KC) at ((k / KC) (WX / 8) + x / 8) 128 bytes, so the cores
    # along m (n) lie 128 bytes apart (the descriptor's stride byte offset, SBO) and
    # along k WX 16 bytes apart (its leading byte offset, LBO). Stored along k (rows
    # of m or n holding k: "K-major") a core's row is one x and KC k's; stored along
    # m (n) ("MN-major", float16 only: the instruction's transpose flag) one k and 8
    # x's. TF32 has no transpose: a float operand stored along m (n) is copied a float
    # at a time into the K-major layout. Only plain operands copied by cp.async: the
    # routine gives other launches an mma.sync row (ops/gemm.py)
    if WGMMA and not STAGES:
        raise ValueError("WGMMA rows take plain operands copied by cp.async "
                         "(at least 4 bytes a copy)")
    # WGWAIT (WGMMA rows): wgmma batches left in flight at the end of a step (0 or 1).
    # With 1, step t's batch still reads its tile while step t + 1 issues its own, so
    # the copies run AHEAD = ASYNC - 2 tiles ahead instead of ASYNC - 1 (the buffer
    # they fill is the one batch t - 1 read, which every work-item has waited for by
    # the barrier before the copies)
    WGW = int(t.get("WGWAIT", 0)) if WGMMA else 0
    AHEAD = STAGES - 1 - WGW
    if STAGES and AHEAD < 1:
        raise ValueError("WGWAIT 1 needs a pipeline of at least 3 tiles (ASYNC)")
    if STAGES and MMA == "tf32":
        RSA = KWG + 4 if a_kfast else MWG + 8
        RSB = KWG + 4 if b_kfast else NWG + 8
        SZA = MWG * RSA if a_kfast else KWG * RSA
        SZB = NWG * RSB if b_kfast else KWG * RSB
    LVA = max(VWM, 1 if a_kfast else GVA)   # widest vector access to a_lm
    LVB = max(VWN, 1 if b_kfast else GVB)
    # (tiles that MDIMC * VWM or NDIMC * VWN do not divide stop at the #error below)
    if LDA % LVA or LDB % LVB or (KWG % GVA if a_kfast else MWG % GVA) or \
            (KWG % GVB if b_kfast else NWG % GVB):
        raise ValueError(f"vec={vec} does not divide the tiles {MWG}x{NWG}x{KWG}")
    comps = "0123456789abcdef"
    def vt(n):
        return f"{acc}{n}" if n > 1 else "acc_t"
    def rt(n):
        return f"{real}{n}" if n > 1 else "real_t"
    def comp(name, n, i):
        return f"{name}.s{comps[i]}" if n > 1 else name
    def loadv(n, ptr, idx):
        if n == 1:
            return f"CLNN_LOAD({ptr}, {idx})"
        if storage_only:
            return f"CLNN_LOADV({n}, {ptr} + {idx})"
        return f"*(__global const {rt(n)} *)({ptr} + {idx})"
    # load slots: every work-item moves LA (LB) vectors of A (B) per tile
    TA = MWG * KWG // GVA
    TB = NWG * KWG // GVB
    LA, LB = -(-TA // NT), -(-TB // NT)
    # B gathered (b_tab): columns vary fastest; a work-item's slots then touch DC columns
    DC = 1
    if b_tab:
        if NT % NWG == 0:
            DC = 1
        elif NWG % NT == 0:
            DC = NWG // NT
        else:
            raise ValueError("a convolution tile needs NWG to divide or be a multiple of "
                             "the work-group size")
    g = dict(NT=NT, KWG=KWG, MWG=MWG, NWG=NWG, GVA=GVA, GVB=GVB, LA=LA, LB=LB, TA=TA, TB=TB,
             a_tab=a_tab, b_tab=b_tab, a_kfast=a_kfast, b_kfast=b_kfast, DC=DC, comp=comp,
             loadv=loadv, vt=vt, MMA=MMA, STAGES=STAGES, ITEM=ITEM,
             TRUNC=MMA == "tf32" and bool(t.get("TF32T")))
    if WGMMA:
        # the operands' layouts in local memory (see above): K-major unless float16
        # stored along m (n); RS* unused, SZ* a buffer's elements
        KC = 16 // ITEM
        KMA = a_kfast or MMA == "tf32"
        KMB = b_kfast or MMA == "tf32"
        RSA = RSB = 0
        SZA, SZB = MWG * KWG, NWG * KWG
        # WGSWZ: K-major tiles swizzled instead, as CUTLASS lays them: a row of m (n)
        # holds the tile's KWG elements, RB = 32, 64 or 128 bytes, 8 rows an atom; the
        # 16-byte chunk c of a row at byte L moves to c ^ (L / 128 % (RB / 16)) (the
        # swizzle modes of that width: no bank conflict where 8 rows are read or
        # written at one chunk). MN-major tiles keep the interleaved layout
        SWZ = bool(t.get("WGSWZ"))
        RB = KWG * ITEM
        if SWZ and RB not in (32, 64, 128):
            raise ValueError("a swizzled WGMMA tile needs KWG * item bytes of 32, 64 or 128")
    g.update(WGMMA=WGMMA)
    if LDSM or STAGES:
        g.update(RSA=RSA, RSB=RSB, SZA=SZA, SZB=SZB)
    if WGMMA:
        g.update(KC=KC, KMA=KMA, KMB=KMB, SWZ=SWZ, RB=RB)
%>
<%include file="_epilogue.cl" args="act=act, bias=bias, width=VWN if VWN > 1 and vec_c and not c_map else 0, aligned=True"/>

// ---- tuning parameters (local variant)
#define MWG ${MWG}    // rows of C per work-group tile
#define NWG ${NWG}    // columns of C per work-group tile
#define KWG ${KWG}    // K step: depth of the tiles held in local memory (two buffers)
#define MDIMC ${MDIMC}  // work-items along M
#define NDIMC ${NDIMC}  // work-items along N
#define VWM ${VWM}    // a work-item's rows come in runs of VWM (vector reads of a_lm)
#define VWN ${VWN}    // a work-item's columns come in runs of VWN (vector reads of b_lm)
#define CLNN_NT (MDIMC * NDIMC)                // work-items per work-group
#define MWI (MWG / MDIMC)  // rows of C per work-item
#define NWI (NWG / NDIMC)  // columns of C per work-item
#if MWG % (MDIMC * VWM) != 0 || NWG % (NDIMC * VWN) != 0
#error "MWG and NWG must be multiples of MDIMC * VWM and NDIMC * VWN"
#endif
// Global loads of plain matrices are ${vec} wide; local rows hold ${LDA} (A) and ${LDB} (B)
// elements${", padded against bank conflicts of the transposing stores" if LDA != MWG or LDB != NWG else ""}.
#define CLNN_LDA ${LDA}
#define CLNN_LDB ${LDB}
% if MMA != "none":

<%include file="_mma.cl" args="MMA=MMA, EMULATE=EMULATE, mma_sync=not WGMMA"/>
%   if MMA != "tf32":
%     if LDSM:
// ldmatrix (LDSM rows): the warp loads four 8 x 8 matrices of halves from local memory,
// lane l giving the address of row l % 8 of matrix l / 8 (16 contiguous bytes); lane l
// receives in register j the halves (l / 4, 2 (l % 4) + {0, 1}) of matrix j, or with
// .trans (2 (l % 4) + {0, 1}, l / 4): exactly an mma fragment register, from rows of k
// (.trans) or from rows of m or n that hold k. The address is the row's offset in the
// local (shared) window, which a __local pointer converted to an integer is.
%       if not EMULATE:
#define CLNN_LDSM_ASM(r, base, idx, trans) \
    __asm__ __volatile__("ldmatrix.sync.aligned.m8n8.x4" trans ".shared.b16 " \
                 "{%0,%1,%2,%3}, [%4];" \
                 : "=r"(r##_0), "=r"(r##_1), "=r"(r##_2), "=r"(r##_3) \
                 : "r"((uint)(size_t)((base) + (idx))))
#define CLNN_LDSM(r, base, idx) CLNN_LDSM_ASM(r, base, idx, "")
#define CLNN_LDSM_T(r, base, idx) CLNN_LDSM_ASM(r, base, idx, ".trans")
%       else:
// emulated: the lanes' row addresses (as indices from base) go through local memory,
// and each lane reads what ldmatrix would give it from the rows that the lanes named
inline uint4 clnn_ldsm_emulated(__local uint *warp_exchange, const int lane, const int xr,
                                __local const ushort *base, const int idx, const int trans)
{
    barrier(CLK_LOCAL_MEM_FENCE);                  // the previous reads are done
    warp_exchange[lane * xr] = (uint)idx;
    barrier(CLK_LOCAL_MEM_FENCE);
    uint r[4];
    for (int j = 0; j < 4; ++j) {
        const uint r0 = warp_exchange[(8 * j + (trans ? 2 * (lane % 4) : lane / 4)) * xr];
        const uint r1 = trans ? warp_exchange[(8 * j + 2 * (lane % 4) + 1) * xr] : r0;
        const uint lo = base[trans ? r0 + lane / 4 : r0 + 2 * (lane % 4)];
        const uint hi = base[trans ? r1 + lane / 4 : r0 + 2 * (lane % 4) + 1];
        r[j] = lo | (hi << 16);
    }
    return (uint4)(r[0], r[1], r[2], r[3]);
}
#define CLNN_LDSM_EMU(r, base, idx, trans) { \
    const uint4 v_ = clnn_ldsm_emulated(mma_exchange + (tid - lane) * CLNN_XR, lane, \
                                        CLNN_XR, base, idx, trans); \
    r##_0 = v_.s0; r##_1 = v_.s1; r##_2 = v_.s2; r##_3 = v_.s3; }
#define CLNN_LDSM(r, base, idx) CLNN_LDSM_EMU(r, base, idx, 0)
#define CLNN_LDSM_T(r, base, idx) CLNN_LDSM_EMU(r, base, idx, 1)
%       endif
%     endif
%   endif
%   if STAGES:
// cp.async (ASYNC rows): each work-item copies its vectors of the next tiles from
// global to local memory without passing them through registers; CLNN_CP_ASYNC<bytes>
// (dst, src, valid) copies the first `valid` bytes of the vector at src and zeroes
// the rest. A work-item's copies form a group at each commit; wait_group n waits until
// at most its n newest groups are still in flight; then a barrier makes every
// work-item's copies visible to the group.
%     if not EMULATE:
// (.cg, through L2 only, takes 16-byte copies; .ca the others)
#define CLNN_CP_ASYNC_ASM(op, dst, src, valid) \
    __asm__ __volatile__(op " %2;" \
                 :: "r"((uint)(size_t)(dst)), "l"((ulong)(size_t)(src)), "r"(valid) \
                 : "memory")
#define CLNN_CP_ASYNC16(dst, src, valid) CLNN_CP_ASYNC_ASM("cp.async.cg.shared.global [%0], [%1], 16,", dst, src, valid)
#define CLNN_CP_ASYNC8(dst, src, valid) CLNN_CP_ASYNC_ASM("cp.async.ca.shared.global [%0], [%1], 8,", dst, src, valid)
#define CLNN_CP_ASYNC4(dst, src, valid) CLNN_CP_ASYNC_ASM("cp.async.ca.shared.global [%0], [%1], 4,", dst, src, valid)
#define CLNN_CP_COMMIT() __asm__ __volatile__("cp.async.commit_group;" ::: "memory")
#define CLNN_CP_WAIT(n) __asm__ __volatile__("cp.async.wait_group " #n ";" ::: "memory")
%     else:
// emulated: a work-item queues its copies (cpq_*, a ring of ${STAGES} groups' worth) and
// makes them at the wait that lets them land, not before: a tile read before its wait
// and barrier reads stale data, and the tests see it
#define CLNN_CPQ ${STAGES * (LA + LB)}
#define CLNN_CP_QUEUE(n, dst, src, valid) { \
    const int q_ = cpq_tail++ % CLNN_CPQ; \
    cpq_dst[q_] = (__local uchar *)(dst); cpq_src[q_] = (__global const uchar *)(src); \
    cpq_len[q_] = (n); cpq_valid[q_] = (valid); cpq_group[q_] = cpq_groups; }
#define CLNN_CP_ASYNC16(dst, src, valid) CLNN_CP_QUEUE(16, dst, src, valid)
#define CLNN_CP_ASYNC8(dst, src, valid) CLNN_CP_QUEUE(8, dst, src, valid)
#define CLNN_CP_ASYNC4(dst, src, valid) CLNN_CP_QUEUE(4, dst, src, valid)
%       if t.get("EAGER"):
// EAGER (tests): every copy lands as soon as it is committed, the earliest the hardware
// may land it, so a copy into a tile still being read gives wrong products
#define CLNN_CP_COMMIT() { ++cpq_groups; CLNN_CP_WAIT(0); }
%       else:
#define CLNN_CP_COMMIT() (++cpq_groups)
%       endif
#define CLNN_CP_WAIT(n) \
    for (; cpq_head < cpq_tail && cpq_group[cpq_head % CLNN_CPQ] < cpq_groups - (n); ++cpq_head) { \
        const int q_ = cpq_head % CLNN_CPQ; \
        for (int e_ = 0; e_ < cpq_len[q_]; ++e_) \
            cpq_dst[q_][e_] = e_ < cpq_valid[q_] ? cpq_src[q_][e_] : (uchar)0; \
    }
%     endif
%   endif
%   if WGMMA:
<%
    T = "tf32" if MMA == "tf32" else ("bf16" if dtype == "bfloat16" else "f16")
    NA = WN // 2                      # accumulator registers per work-item, per wgmma tile
    SWAP, SWAPT = bool(t.get("WGSWAP")), bool(t.get("WGSWAPT"))
    flags = "" if MMA == "tf32" else f", {0 if KMA else 1}, {0 if KMB else 1}"
%>

// ---- Hopper's warpgroup engines (WGMMA rows, compute capability 9.0): wgmma.mma_async
// multiplies a 64 x KI tile of A by a KI x ${WN} tile of B, both read from local memory
// through descriptors, into a 64 x ${WN} tile of C held by the warpgroup's 128 work-items:
// warp w (of 4) holds rows 16 w .. 16 w + 15 as mma.sync's 16 x 8 tiles, ${NTL} of them
// along n (register 4 j + r: row g + 8 (r / 2), column 8 j + 2 t4 + r % 2). A descriptor
// is 64 bits: the start address / 16 (bits 0-13), the leading byte offset / 16 (16-29:
// between core matrices along k), the stride byte offset / 16 (32-45: along m or n),
// the swizzling mode (62-63: 0 none, 1, 2, 3 rows of 128, 64, 32 bytes; a swizzled
// K-major tile's rows hold all of its k, so its leading offset is unused, 16 bytes,
// and its stride offset is 8 rows). WGSWAP (K-major tiles) and WGSWAPT (MN-major) swap
// the two offsets' fields: probes of the hardware's reading for a GPU session (the
// emulation reads them the same way)${": here " + ", ".join(n for n, v in (("WGSWAP", SWAP), ("WGSWAPT", SWAPT)) if v) if SWAP or SWAPT else ""}.
// The copies that filled the tiles went through the generic proxy; wgmma reads through
// the async proxy, hence fence.proxy.async before the barrier that publishes them. A
// batch of wgmma's is fenced, committed and waited for within the step, so the next
// step's copies never overwrite a tile still being read.${" TF32 operands are the floats' top 19 bits (truncated, not rounded: wgmma reads them from local memory as they are)." if MMA == "tf32" else ""}
inline ulong clnn_wg_desc(const uint addr, const uint lbo, const uint sbo, const int swap,
                          const uint mode)
{
    return (ulong)((addr & 0x3ffffu) >> 4) | ((ulong)((swap ? sbo : lbo) >> 4) << 16) |
           ((ulong)((swap ? lbo : sbo) >> 4) << 32) | ((ulong)mode << 62);
}
%     if not EMULATE:
#define CLNN_SMEM_ADDR(p) ((uint)(size_t)(p))
#define CLNN_WG_PROXY() __asm__ __volatile__("fence.proxy.async.shared::cta;" ::: "memory")
// Built with CLNN_PTX_PATCH (NVIDIA's OpenCL compiler: its PTX targets plain sm_90,
// which has no wgmma; programs.PTX_PATCH_OPTION), each wgmma instruction is a PTX
// comment, its operands substituted, that clnn uncomments for sm_90a before the build
// from that PTX
#ifdef CLNN_PTX_PATCH
#define CLNN_WG_OP "//clnn-ptx "
#else
#define CLNN_WG_OP ""
#endif
#define CLNN_WG_FENCE() __asm__ __volatile__(CLNN_WG_OP "wgmma.fence.sync.aligned;" ::: "memory")
#define CLNN_WG_COMMIT() __asm__ __volatile__(CLNN_WG_OP "wgmma.commit_group.sync.aligned;" ::: "memory")
#define CLNN_WG_WAIT(n) __asm__ __volatile__(CLNN_WG_OP "wgmma.wait_group.sync.aligned " #n ";" ::: "memory")
// after a wait for every batch: the accumulators are written, and no use of them may
// move above the wait (with a batch left in flight, only after the loop's last wait)
<% regs = [f"d{i}_{j}_{r}" for i in range(MT) for j in range(NTL) for r in range(4)] %>\
#define CLNN_WG_DONE() { \
%       for q in range(0, len(regs), 8):
    __asm__ __volatile__("" : ${", ".join(f'"+f"({x})' for x in regs[q:q + 8])} :: "memory"); \
%       endfor
}
%       for i in range(MT):
#define CLNN_WGMMA_${i}(da, db) \
    __asm__ __volatile__("{\n.reg .pred p;\nsetp.ne.b32 p, %${NA + 2}, 0;\n" \
                 CLNN_WG_OP "wgmma.mma_async.sync.aligned.m64n${WN}k${KI}.f32.${T}.${T} " \
                 "{${", ".join(f"%{q}" for q in range(NA))}}, %${NA}, %${NA + 1}, p, 1, 1${flags};\n}\n" \
                 : ${", ".join(f'"+f"(d{i}_{q // 4}_{q % 4})' for q in range(NA))} \
                 : "l"(da), "l"(db), "r"(1))
%       endfor
%     else:
// emulated: each work-item computes the outputs it holds from the tiles in local memory,
// reading them through the descriptors as the hardware would (the tests check the
// layouts, the descriptors and the accumulators' places against float64 products).
// As the hardware may, it reads them as late as it can: a work-item queues its wgmma's
// (wgq_*) and multiplies them at the wait that needs them done, so a tile overwritten
// before then (copies land as early as they can with EAGER) gives wrong products
#define CLNN_SMEM_ADDR(p) ((uint)((__local const uchar *)(p) - (__local const uchar *)wg_smem))
#define CLNN_WG_PROXY()
#define CLNN_WG_FENCE()
#define CLNN_WG_DONE()
#define CLNN_WGQ ${(WGW + 1) * (KWG // KI) * MT}
#define CLNN_WG_COMMIT() (++wgq_groups)
#define CLNN_WG_WAIT(n) \
    for (; wgq_head < wgq_tail && wgq_g[wgq_head % CLNN_WGQ] < wgq_groups - (n); ++wgq_head) { \
        const int q_ = wgq_head % CLNN_WGQ; \
        float s_[${NA}]; \
        clnn_wgmma_emulated(s_, (__local const uchar *)wg_smem, wgq_a[q_], wgq_b[q_], wq, lane); \
<%
    adds = [f"if (wgq_i[q_] == {i}) {{ " + " ".join(f"d{i}_{q // 4}_{q % 4} += s_[{q}];"
                                                   for q in range(NA)) + " }"
            for i in range(MT)]
%>\
        ${" else ".join(adds)} \
    }
inline float clnn_wg_at(__local const uchar *smem, const ulong desc, const int x, const int k,
                        const int kmajor)
{
    const uint start = (uint)(desc & 0x3fff) << 4;
    const uint f1 = (uint)((desc >> 16) & 0x3fff) << 4, f2 = (uint)((desc >> 32) & 0x3fff) << 4;
    const int swap = kmajor ? ${int(SWAP)} : ${int(SWAPT)};
    const uint lbo = swap ? f2 : f1, sbo = swap ? f1 : f2;
    const uint mode = (uint)(desc >> 62);
    uint off;
    if (mode) {             // rows of rb bytes, chunks swizzled by the address's bits 7-9
        const uint rb = 256u >> mode;
        off = start + (uint)(x / 8) * sbo + (uint)(x % 8) * rb + (uint)k * ${ITEM};
        off ^= ((off >> 7) & (rb / 16 - 1)) << 4;
    } else {
        off = start + (uint)(x / 8) * sbo +
            (kmajor ? (uint)(k / ${KC}) * lbo + (uint)(x % 8) * 16 + (uint)(k % ${KC}) * ${ITEM}
                    : (uint)(k / 8) * lbo + (uint)(k % 8) * 16 + (uint)(x % 8) * 2);
    }
%       if MMA == "tf32":
    return as_float(*(__local const uint *)(smem + off) & 0xffffe000u);
%       else:
    return CLNN_LOAD_AT(__local, (__local const real_t *)(smem + off), 0);
%       endif
}
inline void clnn_wgmma_emulated(float *s, __local const uchar *smem, const ulong da,
                                const ulong db, const int wq, const int lane)
{
#pragma unroll 1
    for (int q = 0; q < ${NA}; ++q) {
        const int row = 16 * wq + 8 * (q % 4 / 2) + lane / 4, col = 8 * (q / 4) + 2 * (lane % 4) + q % 2;
        float acc = 0.0f;
#pragma unroll 1
        for (int k = 0; k < ${KI}; ++k)
            acc += clnn_wg_at(smem, da, row, k, ${int(KMA)}) * clnn_wg_at(smem, db, col, k, ${int(KMB)});
        s[q] = acc;
    }
}
%       for i in range(MT):
#define CLNN_WGMMA_${i}(da, db) { \
    const int q_ = wgq_tail++ % CLNN_WGQ; \
    wgq_a[q_] = (da); wgq_b[q_] = (db); wgq_i[q_] = ${i}; wgq_g[q_] = wgq_groups; }
%       endfor
%     endif
%   endif
% endif

% if conv != "none":
// ---- convolution as an implicit GEMM (${conv}). x is (N, C, H, W), w (M, C, R, S),
// y (N, M, P, Q), with h = p * sh + r - ph and w = q * sw + s - pw (the lecture's loops
// with stride and padding):
//   forward          y (M x NPQ)  = w (M x CRS)          @ unroll(x) (CRS x NPQ)
//   data gradient    dx (C x NHW) = w gathered (C x MRS) @ dy gathered (MRS x NHW),
//                    one launch per stride phase of (h, w), over the taps that reach it
//   weight gradient  dw (M x CRS) = dy (M x NPQ)         @ unroll(x)^T (NPQ x CRS)
// The unrolled operand is never stored: B(k, j) is loaded from its source while a tile
// is loaded, as
//   B(k, j) = src[bc(j) + kt.x]  if 0 <= hc(j) + kt.y < Hs and 0 <= wc(j) + kt.z < Ws, else 0
// with kt = ktab[k], a table of what each reduction index k adds (built once per call
// by clnn_conv_ktab in conv.cl), and (bc, hc, wc) what each column j adds, from the column map
// `cols`: j = (i, u, v) over an (images, U, V) grid gives
//   bc = i*bn + u*bu + v*bv + b0,   hc = u*hu + h0,   wc = v*wv + w0,
// and, where C is the convolution's output, C(m, j) = c[m * ldc + i*cn + u*cu + v*cv + c0].
// A column is split once per work-item, a k once per call: no divisions in the k loop.
//   cols = (U, V, bn, bu, bv, b0, hu, h0, wv, w0, Hs, Ws, cn, cu, cv, c0)
%   if a_tab:
// A(m, k) = a[m * lda + ktab[k].w]: dy or the filters, gathered the same way.
%   endif

// (bc, hc, wc) of column j; hc is far out of range for j >= N, so its loads give 0
inline int3 clnn_colmap(const int j, const int N, const int16 *cols)
{
    const int i = j / (cols->s0 * cols->s1), uv = j % (cols->s0 * cols->s1);
    const int u = uv / cols->s1, v = uv % cols->s1;
    return (int3)(i * cols->s2 + u * cols->s3 + v * cols->s4 + cols->s5,
                  j < N ? u * cols->s6 + cols->s7 : -(1 << 30), v * cols->s8 + cols->s9);
}

inline acc_t clnn_gathered(__global const real_t *src, const int3 col, const int4 kt,
                           const int Hs, const int Ws)
{
    return ((uint)(col.y + kt.y) < (uint)Hs && (uint)(col.z + kt.z) < (uint)Ws)
        ? CLNN_LOAD(src, col.x + kt.x) : (acc_t)0;
}

<% conv_sig = ", __global const int4 *ktab, const int16 cols" %>
% else:
<% conv_sig = "" %>
% endif

% if c_map:
// where C(m, j) lives, for the convolution's output
inline int clnn_c_index(const int m, const int j, const int ldc, const int16 *cols)
{
    const int i = j / (cols->s0 * cols->s1), uv = j % (cols->s0 * cols->s1);
    return m * ldc + i * cols->sc + (uv / cols->s1) * cols->sd + (uv % cols->s1) * cols->se
        + cols->sf;
}
#define CLNN_C_IDX(m, j) clnn_c_index(m, j, ldc, &cols)
% else:
#define CLNN_C_IDX(m, n) ((m) * ldc + (n))
% endif

<%def name="matrix_load(dst, gv, ptr, row, col, ld, rlim, clim, guarded, g)">
<% loadv, comp = g["loadv"], g["comp"] %>\
## gv elements of a stored matrix along its contiguous axis: (row, col .. col + gv - 1),
## zeros outside row < rlim, col < clim when guarded
% if guarded:
                if (${row} < ${rlim} && ${col} + ${gv - 1} < ${clim})
                    ${dst} = ${loadv(gv, ptr, f"{row} * {ld} + {col}")};
                else {
%   for i in range(gv):
                    ${comp(dst, gv, i)} = (${row} < ${rlim} && ${col} + ${i} < ${clim})
                        ? CLNN_LOAD(${ptr}, ${row} * ${ld} + ${col} + ${i}) : (acc_t)0;
%   endfor
                }
% else:
                ${dst} = ${loadv(gv, ptr, f"{row} * {ld} + {col}")};
% endif
</%def>

<%def name="slots(g, X)">\
## operand X's load slots (X = "A" or "B"): work-item tid moves slot idx = tid + l * NT
## of the tile's T elements (or vectors of them) for l = 0 .. L - 1, the last slot only
## if it lies in the tile; the caller's body does one slot (a gathered B computes its
## own k and column from tid, and needs idx only for that last test)
<%
    NT, TX, L = g["NT"], g["T" + X], g["L" + X]
    tab = X == "B" and g["b_tab"]
%>\
% for l in range(L):
        {
%   if not tab or (TX % NT and l == L - 1):
            const int idx = tid + ${l * NT};
%   endif
%   if TX % NT and l == L - 1:
            if (idx < ${TX})
%   endif
            {
${caller.body(l=l)}\
            }
        }
% endfor
</%def>\
<%def name="load_a(guarded, g)">
<%
    # a def sees only its arguments and the template's parameters: unpack the tiling
    NT, KWG, MWG, NWG, GVA, GVB = (g[k] for k in ("NT", "KWG", "MWG", "NWG", "GVA", "GVB"))
    a_tab, b_tab, a_kfast, b_kfast, DC, comp, loadv, vt = (g[k] for k in (
        "a_tab", "b_tab", "a_kfast", "b_kfast", "DC", "comp", "loadv", "vt"))
%>
<%call expr="slots(g, 'A')" args="l">\
%   if a_kfast:
                const int mm = idx / ${KWG // GVA}, k = k0 + idx % ${KWG // GVA} * ${GVA};
                const int m = m0 + mm;
%     if a_tab:
                ra${l} = ${"(m < M && k < kend) ? " if guarded else ""}CLNN_LOAD(a, m * lda + ktab[k].w)${" : (acc_t)0" if guarded else ""};
%     else:
${matrix_load(f"ra{l}", GVA, "a", "m", "k", "lda", "M", "kend", guarded, g)}
%     endif
%   else:
                const int k = k0 + idx / ${MWG // GVA}, m = m0 + idx % ${MWG // GVA} * ${GVA};
${matrix_load(f"ra{l}", GVA, "a", "k", "m", "lda", "kend", "M", guarded, g)}
%   endif
</%call>\
<%call expr="slots(g, 'B')" args="l">\
%   if b_tab:
            const int k = k0 + ${f"tid / {NWG} + {l * (NT // NWG)}" if DC == 1 else f"{l // DC}"};
            rb${l} = ${"k < kend ? " if guarded else ""}clnn_gathered(b, col${l % DC}, ktab[k], cols.sa, cols.sb)${" : (acc_t)0" if guarded else ""};
%   elif b_kfast:
                const int n = n0 + idx / ${KWG // GVB}, k = k0 + idx % ${KWG // GVB} * ${GVB};
${matrix_load(f"rb{l}", GVB, "b", "n", "k", "ldb", "N", "kend", guarded, g)}
%   else:
                const int k = k0 + idx / ${NWG // GVB}, n = n0 + idx % ${NWG // GVB} * ${GVB};
${matrix_load(f"rb{l}", GVB, "b", "k", "n", "ldb", "kend", "N", guarded, g)}
%   endif
</%call>\
</%def>

<%def name="to_tf32(g)">
## TF32 engines: round the registers of the next tiles once, before they go to local memory
## (TF32T rows leave them: the engine reads their top 19 bits)
% if g["MMA"] == "tf32" and not g["TRUNC"]:
%   for l in range(g["LA"]):
%     for c in range(g["GVA"]):
        ${g["comp"](f"ra{l}", g["GVA"], c)} = clnn_tf32(${g["comp"](f"ra{l}", g["GVA"], c)});
%     endfor
%   endfor
%   for l in range(g["LB"]):
%     for c in range(1 if g["b_tab"] else g["GVB"]):
        ${g["comp"](f"rb{l}", 1 if g["b_tab"] else g["GVB"], c)} = clnn_tf32(${g["comp"](f"rb{l}", 1 if g["b_tab"] else g["GVB"], c)});
%     endfor
%   endfor
% endif
</%def>

<%def name="store_half_pairs(buf, g, X)">
<%
    # one operand's tile (X = "A" or "B") as the float16 engines keep it
    NT, KWG, GV = g["NT"], g["KWG"], g["GV" + X]
    kfast, comp = g["a_kfast" if X == "A" else "b_kfast"], g["comp"]
    reg, lm, LD = ("ra", "a_lmw", "CLNN_LDA") if X == "A" else ("rb", "b_lmw", "CLNN_LDB")
    WX = g["MWG"] if X == "A" else g["NWG"]
    tab = X == "B" and g["b_tab"]
    DC, NWG = g["DC"], g["NWG"]
%>
## element (k, m) of a tile is half k % 2 of word (k / 2, m); runs along k go out as
## pairs of halves (one 32-bit store), runs along m half by half
<%call expr="slots(g, X)" args="l">\
%   if tab:
                const int k = ${f"tid / {NWG} + {l * (NT // NWG)}" if DC == 1 else f"{l // DC}"};
                const int n = ${f"tid % {NWG}" if DC == 1 else f"tid + {(l % DC) * NT}"};
                CLNN_STORE_AT(__local, ${reg}${l}, (__local real_t *)(${lm} + (${buf} * ${KWG // 2} + k / 2) * ${LD} + n), k % 2);
%   elif kfast and GV == 1:
                const int k = idx % ${KWG};
                CLNN_STORE_AT(__local, ${reg}${l}, (__local real_t *)(${lm} + (${buf} * ${KWG // 2} + k / 2) * ${LD} + idx / ${KWG}), k % 2);
%   elif kfast:
                __local real_t *dst = (__local real_t *)(${lm} + (${buf} * ${KWG // 2} + idx % ${KWG // GV} * ${GV // 2}) * ${LD} + idx / ${KWG // GV});
%     for p in range(GV // 2):
                CLNN_STOREV_AT(__local, 2, (float2)(${comp(f"{reg}{l}", GV, 2 * p)}, ${comp(f"{reg}{l}", GV, 2 * p + 1)}), dst + ${2 * p} * ${LD});
%     endfor
%   else:
                const int k = idx / ${WX // GV}, col = idx % ${WX // GV} * ${GV};
                __local real_t *dst = (__local real_t *)(${lm} + (${buf} * ${KWG // 2} + k / 2) * ${LD} + col) + k % 2;
%     for c in range(GV):
                CLNN_STORE_AT(__local, ${comp(f"{reg}{l}", GV, c)}, dst, ${2 * c});
%     endfor
%   endif
</%call>\
</%def>

<%def name="store_ldsm(buf, g, X)">
<%
    # one operand's tile (X = "A" or "B") as the LDSM rows keep it: plain halves, rows
    # of m (n) holding k for an operand stored along k, else rows of k
    NT, KWG, GV = g["NT"], g["KWG"], g["GV" + X]
    kfast, comp = g["a_kfast" if X == "A" else "b_kfast"], g["comp"]
    reg, lm = ("ra", "a_lmh") if X == "A" else ("rb", "b_lmh")
    RS, SZ = g["RS" + X], g["SZ" + X]
    WX = g["MWG"] if X == "A" else g["NWG"]
    tab = X == "B" and g["b_tab"]
    DC, NWG = g["DC"], g["NWG"]
%>
<%call expr="slots(g, X)" args="l">\
%   if tab:
                const int k = ${f"tid / {NWG} + {l * (NT // NWG)}" if DC == 1 else f"{l // DC}"};
                const int n = ${f"tid % {NWG}" if DC == 1 else f"tid + {(l % DC) * NT}"};
                __local real_t *dst = (__local real_t *)(${lm} + ${buf} * ${SZ} + k * ${RS} + n);
%   elif kfast:
                __local real_t *dst = (__local real_t *)(${lm} + ${buf} * ${SZ} + idx / ${KWG // GV} * ${RS} + idx % ${KWG // GV} * ${GV});
%   else:
                __local real_t *dst = (__local real_t *)(${lm} + ${buf} * ${SZ} + idx / ${WX // GV} * ${RS} + idx % ${WX // GV} * ${GV});
%   endif
%   if GV == 1 or tab:
                CLNN_STORE_AT(__local, ${reg}${l}, dst, 0);
%   else:
                CLNN_STOREV_AT(__local, ${GV}, ${reg}${l}, dst);
%   endif
</%call>\
</%def>

<%def name="copy_async(buf, guarded, g, X)">
<%
    # one operand's next tile (X = "A" or "B") by cp.async, into local memory laid out
    # as store_ldsm lays it out: GV elements (halves, or floats for TF32) a copy,
    # zero-filled past the matrix's edge (rows from rlim, columns from clim: the
    # slice's K end included)
    KWG, GV, ITEM = g["KWG"], g["GV" + X], g["ITEM"]
    kfast = g["a_kfast" if X == "A" else "b_kfast"]
    lt, h = ("ushort", "h") if ITEM == 2 else ("float", "f")
    ptr, ld, lm = ("a", "lda", f"a_lm{h}") if X == "A" else ("b", "ldb", f"b_lm{h}")
    m0, lim = ("m0", "M") if X == "A" else ("n0", "N")
    RS, SZ = g["RS" + X], g["SZ" + X]
    WX = g["MWG"] if X == "A" else g["NWG"]
    per = (KWG if kfast else WX) // GV       # copies per local row
    row, col = (f"{m0} + idx / {per}", f"k0 + idx % {per} * {GV}") if kfast else \
        (f"k0 + idx / {per}", f"{m0} + idx % {per} * {GV}")
    rlim, clim = (lim, "kend") if kfast else ("kend", lim)
    dst = f"idx / {per} * {RS} + idx % {per} * {GV}"
    if g["WGMMA"]:
        # the core-matrix layout (see the template's head): 8 neighbouring work-items
        # fill the 8 rows of one core matrix (128 contiguous bytes of local memory),
        # and a warp's copies read 8 rows of 4 neighbouring vectors in global memory
        KC = g["KC"]
        if g["KMA" if X == "A" else "KMB"] and not kfast:
            # TF32 stored along m (n): a float per copy (GV 1) into the K-major layout;
            # a warp's 32 copies take 8 neighbouring x's (32 bytes of a row in global
            # memory) of 4 k's, which lie in the 32 different banks of a core matrix
            x = f"(idx / 32 % {WX // 8} * 8 + idx % 8)"
            k = f"(idx / 32 / {WX // 8} * 4 + idx / 8 % 4)"
            row, col = f"k0 + {k}", f"{m0} + {x}"
        elif kfast:
            x, k = f"(idx / {8 * per} * 8 + idx % 8)", f"(idx / 8 % {per} * {GV})"
            row, col = f"{m0} + {x}", f"k0 + {k}"
        else:
            # float16 stored along m (n): MN-major cores, 8 k's of 8 halves
            k, x = f"(idx / {8 * per} * 8 + idx % 8)", f"(idx / 8 % {per} * {GV})"
            row, col = f"k0 + {k}", f"{m0} + {x}"
        if g["KMA" if X == "A" else "KMB"] and g["SWZ"]:
            RB, ITEM = g["RB"], g["ITEM"]
            L = f"({x} * {RB} + {k} * {ITEM})"
            dst = f"(({L} ^ (({L} >> 7) & {RB // 16 - 1}) << 4) / {ITEM})"
        elif g["KMA" if X == "A" else "KMB"]:
            dst = f"({k} / {KC} * {WX // 8} + {x} / 8) * {8 * KC} + {x} % 8 * {KC} + {k} % {KC}"
        else:
            dst = f"({k} / 8 * {WX // 8} + {x} / 8) * 64 + {k} % 8 * 8 + {x} % 8"
%>
<%call expr="slots(g, X)" args="l">\
                const int r = ${row}, c = ${col};
                __local ${lt} *dst = ${lm} + ${buf} * ${SZ} + ${dst};
%   if guarded:
                const int valid = r < ${rlim} ? clamp(${clim} - c, 0, ${GV}) : 0;
                CLNN_CP_ASYNC${ITEM * GV}(dst, ${ptr} + (valid ? r * ${ld} + c : 0), ${ITEM} * valid);
%   else:
                CLNN_CP_ASYNC${ITEM * GV}(dst, ${ptr} + r * ${ld} + c, ${ITEM * GV});
%   endif
</%call>\
</%def>

<%def name="issue_async(buf, g)">
## the copies of both tiles at k0 into buffer buf (the caller commits them as a group)
        if (inside && k0 + KWG <= kend) {
${copy_async(buf, False, g, "A")}${copy_async(buf, False, g, "B")}
        } else {
${copy_async(buf, True, g, "A")}${copy_async(buf, True, g, "B")}
        }
</%def>

<%def name="store_local(buf, g)">
<%
    # a def sees only its arguments and the template's parameters: unpack the tiling
    NT, KWG, MWG, NWG, GVA, GVB = (g[k] for k in ("NT", "KWG", "MWG", "NWG", "GVA", "GVB"))
    a_tab, b_tab, a_kfast, b_kfast, DC, comp, loadv, vt = (g[k] for k in (
        "a_tab", "b_tab", "a_kfast", "b_kfast", "DC", "comp", "loadv", "vt"))
%>
<%call expr="slots(g, 'A')" args="l">\
%   if a_kfast:
                __local acc_t *dst = a_lm + (${buf} * KWG + idx % ${KWG // GVA} * ${GVA}) * CLNN_LDA + idx / ${KWG // GVA};
%     for c in range(GVA):
                dst[${c} * CLNN_LDA] = ${comp(f"ra{l}", GVA, c)};
%     endfor
%   else:
                *(__local ${vt(GVA)} *)(a_lm + (${buf} * KWG + idx / ${MWG // GVA}) * CLNN_LDA + idx % ${MWG // GVA} * ${GVA}) = ra${l};
%   endif
</%call>\
<%call expr="slots(g, 'B')" args="l">\
%   if b_tab:
            b_lm[(${buf} * KWG + ${f"tid / {NWG} + {l * (NT // NWG)}" if DC == 1 else f"{l // DC}"}) * CLNN_LDB + ${f"tid % {NWG}" if DC == 1 else f"tid + {(l % DC) * NT}"}] = rb${l};
%   elif b_kfast:
                __local acc_t *dst = b_lm + (${buf} * KWG + idx % ${KWG // GVB} * ${GVB}) * CLNN_LDB + idx / ${KWG // GVB};
%     for c in range(GVB):
                dst[${c} * CLNN_LDB] = ${comp(f"rb{l}", GVB, c)};
%     endfor
%   else:
                *(__local ${vt(GVB)} *)(b_lm + (${buf} * KWG + idx / ${NWG // GVB}) * CLNN_LDB + idx % ${NWG // GVB} * ${GVB}) = rb${l};
%   endif
</%call>\
</%def>

// Local-memory tiled GEMM for GPUs. A work-group of MDIMC x NDIMC work-items computes
// an MWG x NWG tile of C, over the K range of its slice (all of K unless split-K splits
// it). Per K step the group copies an MWG x KWG tile of op(A) and a KWG x NWG tile of
// op(B) into local memory, and each work-item accumulates its MWI x NWI outputs from
// there: the lecture's three loops, with the two outer ones cut into tiles.
// - Double buffering: while the tiles of step t are multiplied out of one local buffer,
//   the loads of step t + 1 are already in flight into registers; they go to the other
//   buffer afterwards, so one barrier per step suffices.
// - Work-item (tm, tn) owns rows (tm + i MDIMC) VWM + v and columns (tn + j NDIMC) VWN + u:
//   its reads of the tiles are VWM- and VWN-wide vectors, neighbouring work-items read
//   neighbouring vectors, and its stores of C are vectors too.
// - Tiles inside the matrices load without bounds checks; the edge tiles (a uniform
//   branch per work-group) check every element and load zeros outside.
__kernel __attribute__((reqd_work_group_size(${NT}, 1, 1)))
void clnn_gemm_tiled(const int M, const int N, const int K, const int splits,
                     const int k_split, const acc_t alpha, const acc_t beta,
                     const acc_t act_p, const acc_t act_q,
                     __global const real_t *a, const int4 a_desc,
                     __global const real_t *b, const int4 b_desc,
                     __global const real_t *bias, const int bias_off,
                     __global ${"acc_t" if partial else "real_t"} *c, const int4 c_desc${conv_sig})
{
    // operand descriptors: (element offset, leading dimension, batch stride, unused)
% if WGMMA:
    // ${NBUF} buffers of each tile in the core-matrix layout, A's then B's, in one array
    // (16-byte aligned, as descriptors need)
    __local uint4 wg_smem[${NBUF * (SZA + SZB) * ITEM // 16}]${" __attribute__((aligned(1024)))" if SWZ else ""};
%   if ITEM == 2:
    __local ushort *a_lmh = (__local ushort *)wg_smem;
    __local ushort *b_lmh = a_lmh + ${NBUF * SZA};
%   else:
    __local float *a_lmf = (__local float *)wg_smem;
    __local float *b_lmf = a_lmf + ${NBUF * SZA};
%   endif
% elif LDSM:
    // ${NBUF} buffers of each tile, as halves (16-byte aligned: ldmatrix reads 16-byte rows)
    __local uint4 a_lmq[${NBUF * SZA // 8}];
    __local uint4 b_lmq[${NBUF * SZB // 8}];
    __local ushort *a_lmh = (__local ushort *)a_lmq;
    __local ushort *b_lmh = (__local ushort *)b_lmq;
% elif STAGES:
    // ${NBUF} buffers of each tile, as floats (16-byte aligned for 16-byte copies)
    __local float4 a_lmq[${NBUF * SZA // 4}];
    __local float4 b_lmq[${NBUF * SZB // 4}];
    __local float *a_lmf = (__local float *)a_lmq;
    __local float *b_lmf = (__local float *)b_lmq;
% elif MMA == "f16":
    // two buffers of KWG / 2 rows of words, each two halves: (k, k + 1) of one row of op(A)
    __local uint a_lmw[${KWG * LDA}];
    __local uint b_lmw[${KWG * LDB}];
% else:
    __local ${vt(LVA)} a_lmv[${2 * KWG * LDA // LVA}];
    __local ${vt(LVB)} b_lmv[${2 * KWG * LDB // LVB}];
    __local acc_t *a_lm = (__local acc_t *)a_lmv;
    __local acc_t *b_lm = (__local acc_t *)b_lmv;
% endif
    const int tid = (int)get_local_id(0);
% if MMA == "none":
    const int tn = tid % NDIMC, tm = tid / NDIMC;
% endif
% if t.get("GROUPM", 1) > 1:
    // tiles in bands of ${t["GROUPM"]} rows, walked a column at a time (GROUPM): the
    // work-groups running together share fewer, squarer panels of A and B, which stay
    // in the L2 cache (dispatch order runs along dimension 0 first)
    const int nt_ = (int)get_num_groups(0), mt_ = (int)get_num_groups(1);
    const int lin_ = (int)get_group_id(1) * nt_ + (int)get_group_id(0);
    const int first_ = lin_ / (${t["GROUPM"]} * nt_) * ${t["GROUPM"]};
    const int band_ = min(mt_ - first_, ${t["GROUPM"]}), in_ = lin_ % (${t["GROUPM"]} * nt_);
    const int n0 = in_ / band_ * NWG;
    const int m0 = (first_ + in_ % band_) * MWG;
% else:
    const int n0 = (int)get_group_id(0) * NWG;
    const int m0 = (int)get_group_id(1) * MWG;
% endif
    const int batch = (int)get_group_id(2) / splits, split = (int)get_group_id(2) % splits;
    const int lda = a_desc.s1;
% if not b_tab:
    const int ldb = b_desc.s1;
% endif
    a += a_desc.s0 + batch * a_desc.s2;
    b += b_desc.s0 + batch * b_desc.s2;
    const int kbeg = split * k_split, kend = min(K, kbeg + k_split);
    const bool inside = m0 + MWG <= M && n0 + NWG <= N;
% if b_tab:
%   for d in range(DC):
    const int3 col${d} = clnn_colmap(n0 + ${"tid % NWG" if DC == 1 else f"tid + {d * NT}"}, N, &cols);
%   endfor
% endif

% if MMA != "none":
    // warp (wm, wn) of the group owns rows wm0 .. wm0 + WM and columns wn0 .. wn0 + WN
    // of the tile; d{i}_{j} is its mma tile (i, j), four floats per lane
    const int lane = tid % 32, warp = tid / 32;
%   if EMULATE and not WGMMA:
    __local uint mma_exchange[${(4 * MT + 2 * NTL) * NT}];
#define CLNN_XR ${4 * MT + 2 * NTL}
%   endif
    const int grp = lane / 4, t4 = lane % 4;
%   if WGMMA:
    // warpgroup wgi owns the WM x WN block at (wg_m0, wn0); its warp wq holds rows
    // wm0 + 64 i .. + 15 of each of its ${MT} wgmma tiles
    const int wq = warp % 4, wgi = warp / 4;
    const int wg_m0 = wgi / ${WARPS_N} * ${WM}, wn0 = wgi % ${WARPS_N} * ${WN};
    const int wm0 = wg_m0 + 16 * wq;
%   else:
    const int wm0 = warp / ${WARPS_N} * ${WM}, wn0 = warp % ${WARPS_N} * ${WN};
%   endif
%   for i in range(MT):
%     for j in range(NTL):
    float ${", ".join(f"d{i}_{j}_{r} = 0.0f" for r in range(4))};
%     endfor
%   endfor
% else:
% for i in range(MWI):
%   for j in range(NV):
    ${vt(VWN)} c${i}_${j} = (${vt(VWN)})0;
%   endfor
% endfor
% endif
% if STAGES and EMULATE:
    __local uchar *cpq_dst[CLNN_CPQ];
    __global const uchar *cpq_src[CLNN_CPQ];
    int cpq_len[CLNN_CPQ], cpq_valid[CLNN_CPQ], cpq_group[CLNN_CPQ];
    int cpq_head = 0, cpq_tail = 0, cpq_groups = 0;
% endif
% if WGMMA and EMULATE:
    ulong wgq_a[CLNN_WGQ], wgq_b[CLNN_WGQ];
    int wgq_i[CLNN_WGQ], wgq_g[CLNN_WGQ];
    int wgq_head = 0, wgq_tail = 0, wgq_groups = 0;
% endif
% if not STAGES:
%   for l in range(LA):
    ${vt(GVA)} ra${l};
%   endfor
%   for l in range(LB):
    ${"acc_t" if b_tab else vt(GVB)} rb${l};
%   endfor
% endif

    const int steps = kend > kbeg ? (kend - kbeg + KWG - 1) / KWG : 0;
% if STAGES:
    // the pipeline's first ${AHEAD} tiles in flight (a group each, empty past the
    // slice's end, so that a wait counts groups the same way at every step)
    for (int s = 0; s < ${AHEAD}; ++s) {
        const int k0 = kbeg + s * KWG;
        if (s < steps) {
${issue_async("s", g)}
        }
        CLNN_CP_COMMIT();
    }
% else:
    if (steps > 0) {
        int k0 = kbeg;
        if (inside && k0 + KWG <= kend) {
${load_a(False, g)}
        } else {
${load_a(True, g)}
        }
${to_tf32(g)}
${store_ldsm(0, g, "A") + store_ldsm(0, g, "B") if LDSM else store_half_pairs(0, g, "A") + store_half_pairs(0, g, "B") if MMA == "f16" else store_local(0, g)}
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% endif
    for (int step = 0; step < steps; ++step) {
% if STAGES:
        const int buf = step % ${STAGES};
        CLNN_CP_WAIT(${AHEAD - 1});    // this work-item's copies of tile `step` are in
% if WGMMA:
        CLNN_WG_PROXY();               // visible to wgmma's reads (the async proxy)
% endif
        barrier(CLK_LOCAL_MEM_FENCE);  // everyone's are, and no one still reads step - 1's
        {                              // buffer, which tile step + ${AHEAD} now fills
            const int ahead = step + ${AHEAD}, k0 = kbeg + ahead * KWG;
            if (ahead < steps) {
${issue_async(f"(ahead % {STAGES})", g)}
            }
            CLNN_CP_COMMIT();
        }
% else:
        const int buf = step & 1;
        const int k0 = kbeg + (step + 1) * KWG;
        if (step + 1 < steps) {           // the next tiles, into registers
            if (inside && k0 + KWG <= kend) {
${load_a(False, g)}
            } else {
${load_a(True, g)}
            }
        }
% endif
% if WGMMA:
<%
    # byte offsets in a buffer: the block's first core matrix along m (n) and the k
    # step's along k (cores KC or, MN-major, 8 k's deep; WX * 16 bytes per core column;
    # in a swizzled tile, the k step's bytes within its rows)
    # the descriptors' offsets read the other way round (probes, see above)
    SWA = int(bool(t.get("WGSWAP" if KMA else "WGSWAPT")))
    SWB = int(bool(t.get("WGSWAP" if KMB else "WGSWAPT")))
    MODE = {128: 1, 64: 2, 32: 3}.get(RB, 0) if SWZ else 0
    def desc(base, X, kk, extra):
        # (address, leading, stride, swap, mode) of operand X's tile at k step kk
        km, sw, W = (KMA, SWA, MWG) if X == "A" else (KMB, SWB, NWG)
        if km and SWZ:
            return f"clnn_wg_desc({base} + {kk * ITEM + extra // 128 * 8 * RB}, 16, {8 * RB}, 0, {MODE})"
        kc = KC if km else 8
        return f"clnn_wg_desc({base} + {kk // kc * W * 16 + extra}, {W * 16}, 128, {sw}, 0)"
    h = "h" if ITEM == 2 else "f"
%>
        {
            // this step's tiles; the warpgroup's wgmma tiles read them through descriptors
            // (the block's first row of m (n): 16 bytes a row in the interleaved layout,
            // RB in the swizzled one)
            const uint a_sa = CLNN_SMEM_ADDR(a_lm${h} + buf * ${SZA}) + (uint)wg_m0 * ${RB if SWZ and KMA else 16};
            const uint b_sa = CLNN_SMEM_ADDR(b_lm${h} + buf * ${SZB}) + (uint)wn0 * ${RB if SWZ and KMB else 16};
            CLNN_WG_FENCE();
%   for kk in range(0, KWG, KI):
%     for i in range(MT):
            CLNN_WGMMA_${i}(${desc("a_sa", "A", kk, 1024 * i)},
                          ${desc("b_sa", "B", kk, 0)});
%     endfor
%   endfor
            CLNN_WG_COMMIT();
            CLNN_WG_WAIT(${WGW});
%   if not WGW:
            CLNN_WG_DONE();
%   endif
        }
% elif MMA != "none":
%   if LDSM:
        // this lane's row of each ldmatrix: matrices (m 0-7, k 0-7), (m 8-15, k 0-7),
        // (m 0-7, k 8-15), (m 8-15, k 8-15) of A; (k 0-7, n 0-7), (k 8-15, n 0-7),
        // (k 0-7, n 8-15), (k 8-15, n 8-15) of B, the four registers of a fragment of A
        // and two fragments of B (lane l gives row l % 8 of matrix l / 8)
        const int q8 = lane % 8, qa = lane / 8 % 2, qb = lane / 16;
        __local const ushort *a_h = a_lmh + buf * ${SZA};
        __local const ushort *b_h = b_lmh + buf * ${SZB};
%     if a_kfast:
        const int a_row = (wm0 + q8 + 8 * qa) * ${RSA} + 8 * qb;     // rows of m, + kk
%     else:
        const int a_row = (q8 + 8 * qb) * ${RSA} + wm0 + 8 * qa;     // rows of k, + kk rows
%     endif
%     if b_kfast:
        const int b_row = (wn0 + q8 + 8 * qb) * ${RSB} + 8 * qa;     // rows of n, + kk
%     else:
        const int b_row = (q8 + 8 * qa) * ${RSB} + wn0 + 8 * qb;     // rows of k, + kk rows
%     endif
%   elif MMA == "f16":
        __local const uint *a_w = a_lmw + buf * ${KWG // 2} * CLNN_LDA + wm0 + grp;
        __local const uint *b_w = b_lmw + buf * ${KWG // 2} * CLNN_LDB + wn0 + grp;
%   elif STAGES:
        // TF32 tiles as the copies left them: rows of k, or rows of m (n) holding k
        __local const float *a_s = a_lmf + buf * ${SZA} + ${f"(wm0 + grp) * {RSA} + t4" if a_kfast else f"t4 * {RSA} + wm0 + grp"};
        __local const float *b_s = b_lmf + buf * ${SZB} + ${f"(wn0 + grp) * {RSB} + t4" if b_kfast else f"t4 * {RSB} + wn0 + grp"};
%   else:
        __local const acc_t *a_s = a_lm + (buf * KWG + t4) * CLNN_LDA + wm0 + grp;
        __local const acc_t *b_s = b_lm + (buf * KWG + t4) * CLNN_LDB + wn0 + grp;
%   endif
%   if not EMULATE:
#pragma unroll
%   endif
        for (int kk = 0; kk < KWG; kk += ${KI}) {
%   if MMA == "tf32":
<%
    # A(g + 8 (r % 2) + 16 i, t4 + 4 (r / 2)) and B(t4 + 4 r, g + 8 j) (a_s and b_s add
    # the lane's g and t4) from rows of k or, on ASYNC rows, rows of m (n) holding k;
    # an ASYNC row rounds them to TF32 here (no register saw its copies)
    RA, RB = (RSA, RSB) if STAGES else ("CLNN_LDA", "CLNN_LDB")
    tf = "clnn_tf32" if STAGES and not g["TRUNC"] else ""
    def at(i, r):
        m, k = 16 * i + 8 * (r % 2), 4 * (r // 2)
        return f"{m} * {RA} + kk + {k}" if STAGES and a_kfast else f"(kk + {k}) * {RA} + {m}"
    def bt(j, r):
        n, k = 8 * j, 4 * r
        return f"{n} * {RB} + kk + {k}" if STAGES and b_kfast else f"(kk + {k}) * {RB} + {n}"
%>
%     for i in range(MT):
            const uint ${", ".join(f"a{i}_{r} = as_uint({tf}(a_s[{at(i, r)}]))" for r in range(4))};
%     endfor
%     for j in range(NTL):
            const uint ${", ".join(f"b{j}_{r} = as_uint({tf}(b_s[{bt(j, r)}]))" for r in range(2))};
%     endfor
%   elif LDSM:
            uint ${", ".join(f"a{i}_{r}" for i in range(MT) for r in range(4))};
            uint ${", ".join(f"b{j}_{r}" for j in range(NTL) for r in range(2))};
%     for i in range(MT):
%       if a_kfast:
            CLNN_LDSM(a${i}, a_h, a_row + ${16 * i} * ${RSA} + kk);
%       else:
            CLNN_LDSM_T(a${i}, a_h, a_row + kk * ${RSA} + ${16 * i});
%       endif
%     endfor
%     for j in range(0, NTL, 2):
            {
                uint bq_0, bq_1, bq_2, bq_3;
%       if b_kfast:
                CLNN_LDSM(bq, b_h, b_row + ${8 * j} * ${RSB} + kk);
%       else:
                CLNN_LDSM_T(bq, b_h, b_row + kk * ${RSB} + ${8 * j});
%       endif
                b${j}_0 = bq_0; b${j}_1 = bq_1; b${j + 1}_0 = bq_2; b${j + 1}_1 = bq_3;
            }
%     endfor
%   else:
%     for i in range(MT):
            const uint ${", ".join(f"a{i}_{r} = a_w[(kk / 2 + t4 + {4 * (r // 2)}) * CLNN_LDA + {16 * i + 8 * (r % 2)}]" for r in range(4))};
%     endfor
%     for j in range(NTL):
            const uint ${", ".join(f"b{j}_{r} = b_w[(kk / 2 + t4 + {4 * r}) * CLNN_LDB + {8 * j}]" for r in range(2))};
%     endfor
%   endif
${mma.step(MT, NTL, "tid", "grp", EMULATE)}\
        }
% else:
        __local const ${vt(VWM)} *a_v = (__local const ${vt(VWM)} *)(a_lm + buf * KWG * CLNN_LDA);
        __local const ${vt(VWN)} *b_v = (__local const ${vt(VWN)} *)(b_lm + buf * KWG * CLNN_LDB);
#pragma unroll
        for (int kk = 0; kk < KWG; ++kk) {
% for i in range(MV):
            const ${vt(VWM)} a${i} = a_v[kk * ${LDA // VWM} + tm + ${i * MDIMC}];
% endfor
% for j in range(NV):
            const ${vt(VWN)} b${j} = b_v[kk * ${LDB // VWN} + tn + ${j * NDIMC}];
% endfor
% for i in range(MV):
%   for v in range(VWM):
%     for j in range(NV):
            c${i * VWM + v}_${j} = mad((${vt(VWN)})(${comp(f"a{i}", VWM, v)}), b${j}, c${i * VWM + v}_${j});
%     endfor
%   endfor
% endfor
        }
% endif
% if not STAGES:
        if (step + 1 < steps) {
${to_tf32(g)}
${store_ldsm("(buf ^ 1)", g, "A") + store_ldsm("(buf ^ 1)", g, "B") if LDSM else store_half_pairs("(buf ^ 1)", g, "A") + store_half_pairs("(buf ^ 1)", g, "B") if MMA == "f16" else store_local("(buf ^ 1)", g)}
        }
        // the next step overwrites the buffer that others may still be reading
        barrier(CLK_LOCAL_MEM_FENCE);
% endif
    }
% if WGMMA and WGW:
    CLNN_WG_WAIT(0);                   // the last step's wgmma's
    CLNN_WG_DONE();
% endif

% if partial:
    // the raw sums of this K slice, for clnn_gemm_splitk: ws[batch, split] is M x N
    c += (batch * splits + split) * M * N;
% else:
    const int ldc = c_desc.s1;
    c += c_desc.s0 + batch * c_desc.s2;
    bias += bias_off;
% endif
% if MMA != "none":
%   for i in range(MT):
%     for j in range(NTL):
%       for r in range(4):
    {
        const int m = m0 + wm0 + ${(64 if WGMMA else 16) * i + 8 * (r // 2)} + grp, n = n0 + wn0 + ${8 * j + r % 2} + 2 * t4;
        if (m < M && n < N)
%         if partial:
            c[m * N + n] = d${i}_${j}_${r};
%         else:
            clnn_epilogue(c, CLNN_C_IDX(m, n), m, n, d${i}_${j}_${r}, alpha, beta, act_p, act_q, bias);
%         endif
    }
%       endfor
%     endfor
%   endfor
% elif partial:
%   for i in range(MV):
%     for v in range(VWM):
    {
        const int m = m0 + (tm + ${i * MDIMC}) * VWM + ${v};
%       for j in range(NV):
        {
            const int n = n0 + (tn + ${j * NDIMC}) * VWN;
%         if VWN > 1:
            if (m < M && n + ${VWN - 1} < N && N % VWN == 0)
                *(__global ${vt(VWN)} *)(c + m * N + n) = c${i * VWM + v}_${j};
            else if (m < M) {
%           for u in range(VWN):
                if (n + ${u} < N)
                    c[m * N + n + ${u}] = ${comp(f"c{i * VWM + v}_{j}", VWN, u)};
%           endfor
            }
%         else:
            if (m < M && n < N)
                c[m * N + n] = c${i * VWM + v}_${j};
%         endif
        }
%       endfor
    }
%     endfor
%   endfor
% else:
%   for i in range(MV):
%     for v in range(VWM):
    {
        const int m = m0 + (tm + ${i * MDIMC}) * VWM + ${v};
%       for j in range(NV):
        {
            const int n = n0 + (tn + ${j * NDIMC}) * VWN;
            const ${vt(VWN)} s = c${i * VWM + v}_${j};
%         if VWN > 1 and vec_c and not c_map:
            // whole vectors at once (the routine checked that C's rows are aligned to VWN)
            if (m < M && n + ${VWN} <= N)
                clnn_epilogue_v(c, m * ldc + n, 1, m, n, ${VWN}, s, alpha, beta, act_p, act_q,
                                bias);
            else
%         endif
            if (m < M) {
%         for u in range(VWN):
                if (n + ${u} < N)
                    clnn_epilogue(c, CLNN_C_IDX(m, n + ${u}), m, n + ${u}, ${comp("s", VWN, u)}, alpha, beta, act_p, act_q, bias);
%         endfor
            }
        }
%       endfor
    }
%     endfor
%   endfor
% endif
}
% endif
% if variant == "local" or conv == "none":

// Split-K, second stage: C = act(alpha * (sum of the slices' sums, in slice order) +
// beta * C + bias). A fixed order and no atomics: bitwise the same result every run.
// (The reg variant's K slices of 16-bit storage add up in one float32 workspace and
// come here with splits = 1: partial sums rounded to halves would lose bits.)
__kernel void clnn_gemm_splitk(const int M, const int N, const int splits,
                               const acc_t alpha, const acc_t beta, const acc_t act_p, const acc_t act_q,
                               __global const acc_t *ws,
                               __global const real_t *bias, const int bias_off,
                               __global real_t *c, const int4 c_desc${", const int16 cols" if c_map else ""})
{
% if variant == "reg" and HVW in (2, 4, 8):
    // CPUs: ${HVW} neighbouring columns per work-item, the epilogue on vectors (PoCL calls
    // a scalar math built-in once per element: a column at a time, the tutorial's
    // 1000 x 5000 tanh took 76 ms)
    const int n = (int)get_global_id(0) * ${HVW}, m = (int)get_global_id(1);
    const int batch = (int)get_global_id(2);
    if (n >= N || m >= M)
        return;
    ws += batch * splits * M * N + m * N + n;
    const int nv = min(${HVW}, N - n);
    ${acc}${HVW} sum = (${acc}${HVW})0;
    for (int s = 0; s < splits; ++s) {
        if (nv == ${HVW}) {
            sum += vload${HVW}(0, ws + s * M * N);
        } else {
            acc_t tail[${HVW}] = {0};
            for (int j = 0; j < nv; ++j)
                tail[j] = ws[s * M * N + j];
            sum += vload${HVW}(0, tail);
        }
    }
    const int ldc = c_desc.s1;
    c += c_desc.s0 + batch * c_desc.s2;
    clnn_epilogue_v(c, CLNN_C_IDX(m, n), 1, m, n, nv, sum, alpha, beta, act_p, act_q,
                    bias + bias_off);
% else:
    const int n = (int)get_global_id(0), m = (int)get_global_id(1);
    const int batch = (int)get_global_id(2);
    if (n >= N || m >= M)
        return;
    ws += batch * splits * M * N + m * N + n;
    acc_t sum = (acc_t)0;
    for (int s = 0; s < splits; ++s)
        sum += ws[s * M * N];
    const int ldc = c_desc.s1;
    c += c_desc.s0 + batch * c_desc.s2;
    clnn_epilogue(c, CLNN_C_IDX(m, n), m, n, sum, alpha, beta, act_p, act_q, bias + bias_off);
% endif
}
% endif
