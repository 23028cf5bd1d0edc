## conv.cl: convolution as an implicit GEMM whose unrolled operand is gathered straight
## into registers (the CPU path; GPUs use gemm.cl's tiled loaders).
## Parameters (template):
##   dtype        float32 | float64 | float16 | bfloat16 (16-bit storage, float arithmetic)
##   padded       the gathered input has zero padding: loads are bounds-checked
##                (the routine usually copies the input with its border instead)
##   line         a work-item's rows are consecutive along an output line and share
##                one pointer (else each row keeps its own offset)
##   vstore       C is a panel-wide scratch matrix stored as whole vectors (dcol)
##   x_acc        the gathered input is an acc_t copy (float16: converted once by
##                clnn_conv_pad, not once per filter tap)
##   act          epilogue activation (a name from clnn.ACTIVATIONS) or "none"
##   bias         "none" or "col" (bias[col] added to every row: output channels)
##   tuning       MWI, NWI, VW (clnn/ops/conv.py picks them per shape; CONV_TABLE in
##                clnn/tuning.py holds VW and the work-group size)
## Kernels: clnn_conv_pack (B panels and the k offset table), clnn_conv_gather (the
## GEMM), clnn_conv_col2im (the data gradient from dcol; clnn_conv_col2im_rows from
## dcol transposed, a CPU's strided data gradient), clnn_conv_pad (a copy of
## the input with a zero border), clnn_conv_subsample (a 1x1 convolution's strided
## positions, for batched GEMMs), and clnn_conv_ktab (the k table of gemm.cl's tiled
## convolution loaders, which GPUs use). Used by clnn/ops/conv.py for the forward pass, the
## data gradient (a forward pass over padded dy with the filters flipped, or dcol and
## col2im) and the weight gradient.
<%include file="_common.cl"/>
<%
    t = dict(tuning)
    MWI, NWI, VW = t["MWI"], t["NWI"], t["VW"]
    NVW = NWI // VW
    vec = f"{acc}{VW}" if VW > 1 else acc
    if bias not in ("none", "col"):
        raise ValueError(f"the gathered convolution adds a bias per column, not {bias!r}")
    if VW > 2 * cpu_lanes:  # VW counts float32 lanes: conv.py halves it for float64
        raise ValueError(f"VW={VW} vectors of {acc} are wider than 512 bits "
                         f"(programs.CPU_LANES)")
    # 512-bit tiles (where the device's code has them: tuning.gemm_problems) keep them
    # in the micro-kernel's registers and store them as halves of 256 bits, HVW lanes
    # (as gemm.cl's packed kernel does)
    HVW = min(VW, cpu_lanes)
    hvec = f"{acc}{HVW}" if HVW > 1 else acc
%>
<%namespace name="rb" file="_regblock.cl"/>
## the fused epilogue (clnn_epilogue, and clnn_epilogue_v on a vector of HVW columns)
<%include file="_epilogue.cl" args="act=act, bias=bias, width=HVW if HVW > 1 and not vstore else 0, vector_act=True"/>
//
// ---- tuning parameters
#define MWI ${MWI}    // rows of C per work-item, each gathered from the input
#define NWI ${NWI}    // columns of C per work-item (and per packed B panel)
#define VW ${VW}     // vector width of the B loads and the accumulators
#if NWI % VW != 0
#error "NWI must be a multiple of VW"
#endif
//
// C (rows x cols) = A (rows x K) @ B (K x cols), where A is the unrolled (im2col)
// input, never stored: every element of A is a load from x (N or C images of H x W),
//   A(row, k) = x[base(row) + off(k)]  at image position (hrow + hk, wrow + wk),
// zero where that position is in the padding. A row and a k index each split into
// three parts (a, b, c); the routine passes their sizes and steps as int4
// descriptors, row_split (rows / (R2 R3), R2, R3), row_steps (RA, RBH, RCW), k_split
// (K1, K2, K3) and k_steps (KA, KBH, KCW), with x_geom (H, W, ph, pw), and out_steps
// (OA, OB, OC, OM): row (a, b, c) and column m go to out[a OA + b OB + c OC + m OM].
//   base(row) = a * RA + (b * RBH - ph) * W + c * RCW - pw,  hrow = b * RBH - ph, ...
//   off(k)    = k1 * KA + k2 * KBH * W + k3 * KCW,           hk = k2 * KBH, ...
// forward:         rows (n, p, q), k (c, r, s), cols m:  y = unroll(x)^T @ w^T
// weight gradient: rows (c, r, s), k (n, p, q), cols m:  dw^T = unroll(x) @ dy^T
// (the same loads with the roles of output position and filter tap swapped). B is
// small (the filters, or dy transposed) and packed by clnn_conv_pack into panels of
// NWI columns, so the micro-kernel is gemm.cl's: per k, NWI / VW vector loads of B
// and MWI broadcast values of A feed MWI * NWI / VW vector multiply-adds. What the
// packed GEMM spends writing and re-reading R * S copies of the input, this kernel
// spends on MWI scalar loads per k, which hit the cache: the input rows a work-item
// touches are a few kilobytes.

<%include file="_convpack.cl"/>

typedef ${vec} vec_t;
typedef ${hvec} hvec_t;
% if x_acc:
typedef acc_t x_t;
#define CLNN_XLOAD(p, i) ((p)[i])
#define CLNN_XSTORE(v, p, i) ((p)[i] = (v))
% else:
typedef real_t x_t;
#define CLNN_XLOAD(p, i) CLNN_LOAD(p, i)
#define CLNN_XSTORE(v, p, i) CLNN_STORE(v, p, i)
% endif

% if padded:
// A gathered value whose position may lie in the padding (ok false): that loads
// p[i0], which is in bounds, and is then replaced by zero: both are selects, no
// branch per element.
inline acc_t clnn_gathered(__global const x_t *p, const int i, const bool ok, const int i0)
{
    const acc_t v = CLNN_XLOAD(p, ok ? i : i0);
    return ok ? v : (acc_t)0;
}
% endif
<%
    # A's value for row i of a work-item's block at this k (the micro-kernel's a_elem)
    if padded and line:
        a_elem = "clnn_gathered(xrow, off + {i}, hv && (uint)(wrow + {i} + wk) < (uint)W, x0)"
    elif padded:
        a_elem = "clnn_gathered(x, base{i} + off, hv{i} && (uint)(wrow{i} + wk) < (uint)W, 0)"
    elif line:
        a_elem = "CLNN_XLOAD(xrow, off + {i})"
    else:
        a_elem = "CLNN_XLOAD(x, base{i} + off)"
%>
## One k step of the micro-kernel (_regblock.cl): NVW vector loads of B, MWI gathered
## values of A.
<%def name="step(indent=16)">${rb.multiply(MWI, NVW, VW, "bp + k * NWI", a_elem, indent=indent)}</%def>

// One work-item: MWI consecutive rows x NWI columns of C in MWI * NWI / VW vector
// registers (the order of the work-items below).
__kernel void clnn_conv_gather(const int4 row_split, const int4 row_steps,
                               const int4 k_split, const int4 k_steps,
                               __global const x_t *x, const int x_off, const int4 x_geom,
                               const int zlo, const int zhi,
                               const int cols, const int Rb, const int panels_first,
                               __global const acc_t *b_pk, __global const int *koff,
                               __global ${'acc_t' if vstore else 'real_t'} *out,
                               const int out_off, const int4 out_steps,
                               const acc_t alpha, const acc_t beta, const acc_t act_p, const acc_t act_q,
                               __global const real_t *bias, const int bias_off)
{
    // the descriptors' parts under the names the comment at the top uses
    const int R2 = row_split.s1, R3 = row_split.s2, rows = row_split.s0 * R2 * R3;
    const int RA = row_steps.s0, RBH = row_steps.s1, RCW = row_steps.s2;
    const int K1 = k_split.s0, K2 = k_split.s1, K3 = k_split.s2;
    const int KA = k_steps.s0, KBH = k_steps.s1, KCW = k_steps.s2;
    const int H = x_geom.s0, W = x_geom.s1, ph = x_geom.s2, pw = x_geom.s3;
    const int OA = out_steps.s0, OB = out_steps.s1, OC = out_steps.s2, OM = out_steps.s3;
    (void)H, (void)RCW, (void)KA, (void)KBH, (void)KCW, (void)OM;  // (not every variant
                                                                   // reads every part)
    // A 1-D grid of Rb row blocks by Nb panels. Panels first: consecutive work-items
    // share their rows and walk the panels, so the input they gather stays in cache
    // while every panel reads it; else they share a panel and walk the rows, which
    // keeps a long panel in cache instead (the routine picks: conv._panels_first).
    const int Nb = (cols + NWI - 1) / NWI, gid = (int)get_global_id(0);
    const int rb = panels_first ? gid / Nb : gid % Rb;
    const int nb = panels_first ? gid % Nb : gid / Rb;
    if (nb >= Nb)
        return;
    x += x_off;
    out += out_off;
    bias += bias_off;
    const int K = K1 * K2 * K3;
    __global const acc_t *bp = b_pk + nb * K * NWI;
% if line:
    // "line" layout: the MWI rows of a work-item are consecutive along the last row
    // index c (RCW == 1, R3 >= MWI), so one pointer and constant offsets address all
    // of them. The last block of a line starts at R3 - MWI, overlapping the one
    // before, and stores only the rows that block did not.
    const int Cb = (R3 + MWI - 1) / MWI;
    if (rb >= rows / R3 * Cb)
        return;
    const int ab = rb / Cb, cb = rb % Cb;
    const int a = ab / R2, b = ab % R2, c0 = min(cb * MWI, R3 - MWI);
    const int first = cb * MWI - c0;      // rows below this were stored by block cb - 1
    const int hrow = b * RBH - ph, wrow = c0 - pw;
    __global const x_t *xrow = x + a * RA + hrow * W + wrow;
    const int orow = a * OA + b * OB + c0 * OC;
% if padded:
    const int x0 = -(a * RA + hrow * W + wrow);   // xrow[x0] is x[0], always in bounds
% endif
% else:
    const int row0 = rb * MWI;
    if (row0 >= rows)
        return;
    // Where each row's gathered elements start. Rows past the end repeat the last
    // row (their loads stay in bounds) and are not stored.
%   for i in range(MWI):
    int base${i}, hrow${i}, wrow${i}, oidx${i};
    {
        const int row = min(row0 + ${i}, rows - 1);
        const int a = row / (R2 * R3), b = row / R3 % R2, c = row % R3;
        hrow${i} = b * RBH - ph;
        wrow${i} = c * RCW - pw;
        base${i} = a * RA + hrow${i} * W + wrow${i};
        oidx${i} = a * OA + b * OB + c * OC;
    }
%   endfor
% endif

${rb.accumulators(MWI, NVW)}\
% if padded:
    int k = 0;
    for (int k1 = 0; k1 < K1; ++k1) {
        for (int k2 = 0; k2 < K2; ++k2) {
            const int hk = k2 * KBH, off2 = k1 * KA + hk * W;
%   if line:
            const bool hv = (uint)(hrow + hk) < (uint)H;
%   else:
%     for i in range(MWI):
            const bool hv${i} = (uint)(hrow${i} + hk) < (uint)H;
%     endfor
%   endif
            for (int k3 = 0; k3 < K3; ++k3, ++k) {
                const int wk = k3 * KCW, off = off2 + wk;
${step()}\
            }
        }
    }
% else:
%   if line:
    // Input rows outside [zlo, zhi) are a padded copy's zero border. The rows of a
    // line share one input row per k2, so the k2 whose row is all zeros are skipped
    // (the border is half of the data gradient's flipped pass on LeNet's C3).
    const int k2lo = KBH > 0 ? max(0, (zlo - hrow + KBH - 1) / KBH) : 0;
    const int k2hi = KBH > 0 ? min(K2, (zhi - hrow + KBH - 1) / KBH) : K2;
    if (hrow < zlo || hrow + (K2 - 1) * KBH >= zhi) {
        for (int k1 = 0; k1 < K1; ++k1) {
            const int kend = (k1 * K2 + k2hi) * K3;
            for (int k = (k1 * K2 + k2lo) * K3; k < kend; ++k) {
                const int off = koff[k];
${step()}\
            }
        }
    } else
%   endif
    {
        // One flat loop over k, the offsets from clnn_conv_pack's table: nested loops
        // over (c, r, s) have trip counts of a filter's width, and their exits cost a
        // third of the time on LeNet's layers.
        for (int k = 0; k < K; ++k) {
            const int off = koff[k];
${step(12)}\
        }
    }
% endif

<%
    # row i of a work-item's block: whether it is stored, and where its row of C starts
    row_ok, row_out = ("{i} >= first", "orow + {i} * OC") if line else \
        ("row0 + {i} < rows", "oidx{i}")
%>\
% if vstore:
    // C is a scratch matrix whose rows are whole panels (OC and OA multiples of
    // NWI, OM == 1, no epilogue): every accumulator goes out as one aligned vector
    // (a 512-bit one as its halves).
%   for i in range(MWI):
    if (${row_ok.format(i=i)}) {
        __global hvec_t *o = (__global hvec_t *)(out + ${row_out.format(i=i)} + nb * NWI);
%     for v in range(NVW):
%       if HVW == VW:
        o[${v}] = c${i}_${v};
%       else:
        o[${2 * v}] = c${i}_${v}.lo;
        o[${2 * v + 1}] = c${i}_${v}.hi;
%       endif
%     endfor
    }
%   endfor
% else:
    // C(row, col) is out[a * OA + b * OB + c * OC + col * OM]
    const int col0 = nb * NWI;
${rb.epilogue(MWI, NVW, VW, "out", row_ok, row_out + " + ({n}) * OM", "0", "col0", "cols", "all" if VW > 1 else None, step="OM", part=HVW)}\
% endif
}

// The data gradient's second half. With dcol (NPQ x CRS) = dy^T @ w from the kernel
// above, every dx element gathers the unrolled entries it was copied to:
//   dx[n, c, h, w] = sum over (r, s) of dcol[(n, p, q), (c, r, s)]
// where h = p * sh + r - ph and w = q * sw + s - pw for some output position (p, q).
// A work-item owns COL2IM_W consecutive elements of one dx row (n, c, h) in private
// accumulators, and walks the dcol entries that land there in order: for each tap
// row r, for each q, the S taps (c, r, 0..S-1) are contiguous in dcol. Every sum
// runs in a fixed order (no atomics, reproducible), every dcol entry is read once,
// and the loop trip counts are the same across a row (a work-item per element
// measured 4x slower on PoCL: its short, varying loops mispredicted at every exit).
// dcol holds images n0 .. (its row 0 is image n0's first position); rows counts the
// dx rows (n - n0, c, h) of those images.
#define COL2IM_W 64
__kernel void clnn_conv_col2im(const int n0, const int rows, const int C, const int H,
                               const int W, const int P, const int Q, const int R,
                               const int S, const int sh, const int sw, const int ph,
                               const int pw, __global const acc_t *dcol, const int ldcol,
                               __global real_t *dx, const int dx_off)
{
    const int w0 = (int)get_global_id(0) * COL2IM_W;
    const int row = (int)get_global_id(1);
    if (w0 >= W || row >= rows)
        return;
    const int h = row % H, c = row / H % C, n = row / (C * H);
    const int wn = min(COL2IM_W, W - w0);
    acc_t acc[COL2IM_W];
    for (int i = 0; i < COL2IM_W; ++i)
        acc[i] = (acc_t)0;
    __global const acc_t *col = dcol + n * P * Q * ldcol + c * R * S;
    for (int r = 0; r < R; ++r) {
        const int hp = h + ph - r;                // p * sh
        if (hp < 0 || hp % sh != 0 || hp / sh >= P)
            continue;
        // the q whose taps can reach [w0, w0 + wn): w0 <= q * sw + s - pw < w0 + wn
        const int lo = w0 + pw - (S - 1);
        const int q_lo = lo <= 0 ? 0 : (lo + sw - 1) / sw;
        const int q_hi = min(Q - 1, (w0 + wn - 1 + pw) / sw);
        __global const acc_t *e = col + (hp / sh) * Q * ldcol + r * S;
        for (int q = q_lo; q <= q_hi; ++q) {
            const int i0 = q * sw - pw - w0;      // where tap s = 0 lands
            for (int s = 0; s < S; ++s) {
                const int i = i0 + s;
                if (i >= 0 && i < wn)
                    acc[i] += e[q * ldcol + s];
            }
        }
    }
    dx += dx_off + (n0 * C * H + row) * W + w0;
    for (int i = 0; i < wn; ++i)
        CLNN_STORE(acc[i], dx, i);
}

// col2im on CPUs for a strided data gradient whose dcol is transposed: dcol[(n - n0, c,
// r, s), (p, q)] (acc_t; one batched GEMM of w^T and dy per group of images wrote it,
// its rows of P Q positions contiguous). A work-item per dx row (n, c, h) takes the
// row's columns phase by phase, w = b, b + sw, ... (b < sw): those receive only from
// the taps s = s0 + sw l, from q = j + d - l for column b + sw j, so each tap adds a
// contiguous run of dcol's row to a vector of the phase's columns. Every dcol entry
// is read once, as part of a whole vector (clnn_conv_col2im's reads of the untransposed
// dcol took one element of each cache line per work-item: 11.9 ms for the ResNet
// stage's 3x3 stride-2 layer). Sums in a fixed order; no atomics.
<%
    V = cpu_lanes
    hexl = "0123456789abcdef"

    def zip2(a, b, half):
        """lanes half * V / 2 .. of a and b interleaved (a's first), as OpenCL C: clang's
        __builtin_shufflevector, else a vector literal"""
        picks = [(src, half * V // 2 + i) for i in range(V // 2) for src in (0, 1)]
        return ("#ifdef __clang__\n" +
                f"__builtin_shufflevector({a}, {b}, " +
                ", ".join(str(src * V + i) for src, i in picks) + ")\n#else\n" +
                f"({acc}{V})(" + ", ".join(f"{(a, b)[src]}.s{hexl[i]}" for src, i in picks) +
                ")\n#endif\n")

    def store_v(v, ptr):
        """the vector v stored at ptr: in one store (16-bit storage, which this path
        never takes, element by element)"""
        if storage_only:
            return " ".join(f"CLNN_STORE({v}.s{hexl[i]}, {ptr}, {i});" for i in range(V))
        return f"CLNN_ELEMS_STORE{V}({acc}, {v}, {ptr});"
%>\
typedef ${acc}${V} c2v_t;
// Phase b's columns b + sw j, j = j0 .. j0 + ${V - 1}, of dx row (c, h) from dcol's rows
// col (that image and channel's taps): the taps s = s0 + sw l reach them from q = j +
// d - l, a contiguous run of each tap's row p (zeros past dy's edges).
inline c2v_t clnn_col2im_phase(__global const acc_t *col, const int h, const int b,
                               const int j0, const int P, const int Q, const int R,
                               const int S, const int sh, const int sw, const int ph,
                               const int pw)
{
    const int s0 = (b + pw) % sw, d = (b + pw - s0) / sw;
    c2v_t acc = (c2v_t)0;
    for (int r = 0; r < R; ++r) {
        const int hp = h + ph - r;            // p * sh
        if (hp < 0 || hp % sh != 0 || hp / sh >= P)
            continue;
        __global const acc_t *e = col + r * S * P * Q + hp / sh * Q;
        for (int s = s0, l = 0; s < S; s += sw, ++l) {
            const int q0 = j0 + d - l;
            __global const acc_t *v = e + s * P * Q + q0;
            if (q0 >= 0 && q0 + ${V} <= Q)
                acc += CLNN_ELEMS_LOAD${V}(${acc}, v);
            else
                acc += (c2v_t)(${", ".join(f"(uint)(q0 + {i}) < (uint)Q ? v[{i}] : (acc_t)0" for i in range(V))});
        }
    }
    return acc;
}

// A work-item per dx row: ${V} columns of every phase at a time, stored as whole
// vectors at strides 1 and 2 (the two phases' vectors interleaved), else (a row's
// last columns, strides of 3 and more) element by element.
__kernel void clnn_conv_col2im_rows(const int n0, const int rows, const int C, const int H,
                                    const int W, const int P, const int Q, const int R,
                                    const int S, const int sh, const int sw, const int ph,
                                    const int pw, __global const acc_t *dcol,
                                    __global real_t *dx, const int dx_off)
{
    const int row = (int)get_global_id(0);     // (n - n0, c, h)
    if (row >= rows)
        return;
    const int h = row % H, nc = row / H;
    __global const acc_t *col = dcol + nc * R * S * P * Q;
    __global real_t *out = dx + dx_off + (n0 * C * H + row) * W;
    for (int j0 = 0; j0 * sw < W; j0 += ${V}) {
        __global real_t *o = out + j0 * sw;
        if (sw == 1 && j0 + ${V} <= W) {
            const c2v_t a = clnn_col2im_phase(col, h, 0, j0, P, Q, R, S, sh, 1, ph, pw);
            ${store_v("a", "o")}
            continue;
        }
        if (sw == 2 && 2 * (j0 + ${V}) <= W) {
            const c2v_t a0 = clnn_col2im_phase(col, h, 0, j0, P, Q, R, S, sh, 2, ph, pw);
            const c2v_t a1 = clnn_col2im_phase(col, h, 1, j0, P, Q, R, S, sh, 2, ph, pw);
            const c2v_t lo =
${zip2("a0", "a1", 0)}\
                ;
            const c2v_t hi =
${zip2("a0", "a1", 1)}\
                ;
            ${store_v("lo", "o")}
            ${store_v("hi", f"(o + {V})")}
            continue;
        }
        for (int b = 0; b < sw; ++b) {
            const c2v_t a = clnn_col2im_phase(col, h, b, j0, P, Q, R, S, sh, sw, ph, pw);
% for i in range(V):
            if (b + (j0 + ${i}) * sw < W)
                CLNN_STORE(a.s${hexl[i]}, o, b + ${i} * sw);
% endfor
        }
    }
}

// dy with a zero border, for the data gradient at unit stride: xp (N, C, H + 2 ph,
// W + 2 pw) holds x in its middle, so the gathered kernel reads it without checks.
// One work-item per padded row (a work-item per element spent most of its time in
// PoCL's per-work-group overhead: 0.8 ms against 0.1 ms for LeNet's C3 at batch 64).
__kernel void clnn_conv_pad(const int rows, const int H, const int W, const int ph,
                            const int pw, __global const real_t *x, const int x_off,
                            __global x_t *xp)
{
    const int Wp = W + 2 * pw, Hp = H + 2 * ph;
    const int row = (int)get_global_id(0);    // nc * Hp + h + ph
    if (row >= rows)
        return;
    const int h = row % Hp - ph;
    __global x_t *dst = xp + row * Wp;
    // (through CLNN_LOAD/STORE: half is storage only, its values never assigned)
    if (h < 0 || h >= H) {
        for (int w = 0; w < Wp; ++w)
            CLNN_XSTORE((acc_t)0, dst, w);
        return;
    }
    __global const real_t *src = x + x_off + (row / Hp * H + h) * W - pw;
    for (int w = 0; w < pw; ++w)
        CLNN_XSTORE((acc_t)0, dst, w);
    for (int w = pw; w < pw + W; ++w)
        CLNN_XSTORE(CLNN_LOAD(src, w), dst, w);
    for (int w = pw + W; w < Wp; ++w)
        CLNN_XSTORE((acc_t)0, dst, w);
}

// Every sh-th row and sw-th column of x, for a 1x1 convolution at a stride: xs (N, C,
// P, Q) holds x[n, c, p sh, q sw], which batched GEMMs read as plain matrices (an
// acc_t copy where x_acc). One work-item per row of xs, as clnn_conv_pad.
__kernel void clnn_conv_subsample(const int rows, const int H, const int W, const int P,
                                  const int Q, const int sh, const int sw,
                                  __global const real_t *x, const int x_off,
                                  __global x_t *xs)
{
    const int row = (int)get_global_id(0);    // nc * P + p
    if (row >= rows)
        return;
    __global const real_t *src = x + x_off + (row / P * H + row % P * sh) * W;
    __global x_t *dst = xs + row * Q;
    for (int q = 0; q < Q; ++q)
        CLNN_XSTORE(CLNN_LOAD(src, q * sw), dst, q);
}

// The k table of gemm.cl's tiled convolution loaders (the GPU path): k = (k1, k2, k3)
// over (K1, K2, K3) adds k1 * X1 + k2 * X2 + k3 * X3 + X0 to each of (src offset, h, w,
// A offset); coef holds (X1, X2, X3, X0) for each of the four (clnn/ops/conv.py says
// what they are for the forward pass, each data-gradient phase and the weight gradient).
__kernel void clnn_conv_ktab(const int K, const int K2, const int K3, const int16 coef,
                             __global int4 *ktab)
{
    const int k = (int)get_global_id(0);
    if (k >= K)
        return;
    const int k3 = k % K3, k2 = (k / K3) % K2, k1 = k / (K2 * K3);
    ktab[k] = (int4)(k1 * coef.s0 + k2 * coef.s1 + k3 * coef.s2 + coef.s3,
                     k1 * coef.s4 + k2 * coef.s5 + k3 * coef.s6 + coef.s7,
                     k1 * coef.s8 + k2 * coef.s9 + k3 * coef.sa + coef.sb,
                     k1 * coef.sc + k2 * coef.sd + k3 * coef.se + coef.sf);
}

// col2im for the GPU path's data gradient: dcol holds, for images n0 .. n0 + count /
// (C H W) - 1, the unrolled gradient transposed, dcol[(n - n0, c, r, s), (p, q)] (one
// batched GEMM of w^T and dy wrote it, its rows of P Q positions contiguous). A
// work-item per dx element gathers the entries that land on it, in a fixed order:
// no atomics, and neighbouring work-items read neighbouring positions.
__kernel void clnn_conv_col2im_t(const int n0, const int count, const int C, const int H,
                                 const int W, const int P, const int Q, const int R,
                                 const int S, const int sh, const int sw, const int ph,
                                 const int pw, __global const real_t *dcol,
                                 __global real_t *dx, const int dx_off)
{
    for (int e = (int)get_global_id(0); e < count; e += (int)get_global_size(0)) {
        const int w = e % W, h = e / W % H, nc = e / (W * H);   // nc = (n - n0) * C + c
        acc_t acc = (acc_t)0;
        for (int r = 0; r < R; ++r) {
            const int hp = h + ph - r;                // p * sh
            if (hp < 0 || hp % sh != 0 || hp / sh >= P)
                continue;
            __global const real_t *row = dcol + ((nc * R + r) * S) * P * Q + hp / sh * Q;
            for (int s = 0; s < S; ++s) {
                const int wq = w + pw - s;            // q * sw
                if (wq >= 0 && wq % sw == 0 && wq / sw < Q)
                    acc += CLNN_LOAD(row, s * P * Q + wq / sw);
            }
        }
        CLNN_STORE(acc, dx, dx_off + n0 * C * H * W + e);
    }
}
