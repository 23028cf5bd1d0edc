## pool.cl: 2-D max and average pooling, forward and backward.
## Parameters:  dtype  float32 | float64 | float16 | bfloat16
##              mode   "max" | "avg"
##              per    "row": a work-item per row of outputs (forward) or inputs
##                     (backward), CPUs; "element": a work-item per element, GPUs (the
##                     2x2 kernels: per row of blocks of four windows, or per block)
##              act    the backward kernels: "none", or the activation whose output x
##                     is (its parameters ap, aq): dx times its derivative from x, in
##                     the same pass (activation_backward's, a launch and a pass fewer
##                     for a convolution's activation under the pooling)
## Used by clnn/ops/pool.py.
<%include file="_common.cl"/>
<%include file="_activation.cl" args="act=act, derivative_from='a', vector=4"/>
//
// x (N, C, H, W) -> y (N, C, P, Q) over KH x KW windows with stride (SH, SW), zero
// padding (PH, PW) and dilation (DH, DW): tap (r, s) of window (p, q) reads
// (p SH - PH + r DH, q SW - PW + s DW); planes = N * C. The host sizes P and Q (with
// PyTorch's ceil_mode, the last window may reach past the padding; the kernels skip
// what lies outside the input). Each output, and each element of dx (gathering over the
// windows that contain it), is written by one work-item, so no atomics are needed: on
// CPUs a work-item takes a row of them (the index arithmetic is per row), on GPUs one
// element (neighbouring work-items, neighbouring addresses: a row per work-item would
// leave most of a GPU idle and its loads uncoalesced). Max and average pooling over
// 2x2 windows with stride 2 and no padding have their own kernels at the end, which
// take four windows along a row at a time.
% if mode == "max":
// Max pooling ignores padding; a window's maximum is its first maximal element in
// row-major order, the same rule forward and backward, so ties route the gradient to
// exactly one input, deterministically.
% else:
// Average pooling divides by PyTorch's divisor (clnn_divisor): div_mode 0 counts the
// window's taps inside the padded input (KH * KW but for a ceil_mode window past the
// padding), 1 only those inside the input (count_include_pad=False), 2 is ``divisor``
// (divisor_override).
% endif
//
<%
    pool_args = ("const int planes, const int H, const int W, const int P, const int Q,\n"
                 "        const int KH, const int KW, const int SH, const int SW, const int PH,\n"
                 "        const int PW, const int DH, const int DW, const int div_mode,\n"
                 "        const int divisor")
%>
% if mode == "max":
// columns of a row per pass of the CPU's backward pass over overlapping max windows
#define CLNN_POOL_CW 32
// the flat index (h * W + w) of the maximum of window (p, q) of one plane, or -1
inline int clnn_argmax(__global const real_t *x, const int H, const int W, const int p,
                       const int q, const int KH, const int KW, const int SH, const int SW,
                       const int PH, const int PW, const int DH, const int DW)
{
    int best = -1;
    acc_t v_best = (acc_t)0;
    for (int r = 0; r < KH; ++r) {
        const int h = p * SH + r * DH - PH;
        if (h < 0 || h >= H)
            continue;
        for (int s = 0; s < KW; ++s) {
            const int w = q * SW + s * DW - PW;
            if (w < 0 || w >= W)
                continue;
            const acc_t v = CLNN_LOAD(x, h * W + w);
            // (v != v: IEEE's NaN test, no fast-math here; PoCL links isnan() as a call)
            if (best < 0 || v > v_best || (v != v && v_best == v_best)) {
                best = h * W + w;
                v_best = v;
            }
        }
    }
    return best;
}
#define CLNN_ARGMAX(p, q) clnn_argmax(xp, H, W, p, q, KH, KW, SH, SW, PH, PW, DH, DW)
% else:
// PyTorch's divisor of window (p, q) (see above)
inline acc_t clnn_divisor(const int H, const int W, const int p, const int q,
                          const int KH, const int KW, const int SH, const int SW,
                          const int PH, const int PW, const int div_mode, const int divisor)
{
    if (div_mode == 2)
        return (acc_t)divisor;
    int h0 = p * SH - PH, w0 = q * SW - PW;
    int h1 = min(h0 + KH, H + PH), w1 = min(w0 + KW, W + PW);
    if (div_mode == 1) {
        h0 = max(h0, 0);
        w0 = max(w0, 0);
        h1 = min(h1, H);
        w1 = min(w1, W);
    }
    return (acc_t)((h1 - h0) * (w1 - w0));
}
#define CLNN_DIVISOR(p, q) clnn_divisor(H, W, p, q, KH, KW, SH, SW, PH, PW, div_mode, divisor)
% endif

<%def name="forward_one()">
% if mode == "max":
            const int best = CLNN_ARGMAX(p, q);
            // a dilated window may have no tap inside the input: -inf, as PyTorch's
            CLNN_STORE(best < 0 ? (acc_t)(-INFINITY) : CLNN_LOAD(xp, best), y, y_off + i * Q + q);
            if (want_idx)
                idx[idx_off + i * Q + q] = best;
% else:
            acc_t sum = (acc_t)0;
            for (int r = 0; r < KH; ++r) {
                const int h = p * SH + r - PH;
                for (int s = 0; s < KW; ++s) {
                    const int w = q * SW + s - PW;
                    if (h >= 0 && h < H && w >= 0 && w < W)
                        sum += CLNN_LOAD(xp, h * W + w);
                }
            }
            CLNN_STORE(sum / CLNN_DIVISOR(p, q), y, y_off + i * Q + q);
% endif
</%def>
__kernel void clnn_pool_forward(
        ${pool_args},
                                __global const real_t *x, const int x_off,
                                __global real_t *y, const int y_off,
                                __global int *idx, const int idx_off, const int want_idx)
{
% if per == "element":
    // one work-item per output element (plane, p, q), i = plane * P + p its row
    for (int e = (int)get_global_id(0); e < planes * P * Q; e += (int)get_global_size(0)) {
        const int i = e / Q, q = e % Q;
        const int plane = i / P, p = i % P;
        __global const real_t *xp = x + x_off + plane * H * W;
        {
${forward_one()}
        }
    }
% else:
    // one work-item per output row (plane, p): the index arithmetic is per row
    for (int i = (int)get_global_id(0); i < planes * P; i += (int)get_global_size(0)) {
        const int plane = i / P, p = i % P;
        __global const real_t *xp = x + x_off + plane * H * W;
        for (int q = 0; q < Q; ++q) {
${forward_one()}
        }
    }
% endif
}

// dx[plane, h, w] = sum of dy over the windows (p, q) that contain (h, w)
% if mode == "max":
//                   and whose maximum it is.
% else:
//                   each divided by its divisor.
% endif
<%def name="gather_one()">
            acc_t g = (acc_t)0;
            for (int r = 0; r < KH; ++r) {
                const int tp = h + PH - r * DH;
                if (tp < 0 || tp % SH != 0 || tp / SH >= P)
                    continue;
                const int p = tp / SH;
                for (int s = 0; s < KW; ++s) {
                    const int tq = w + PW - s * DW;
                    if (tq < 0 || tq % SW != 0 || tq / SW >= Q)
                        continue;
                    const int q = tq / SW;
                    const acc_t d = CLNN_LOAD(dy, dy_off + (plane * P + p) * Q + q);
% if mode == "max":
                    if (CLNN_ARGMAX(p, q) == h * W + w)
                        g += d;
% else:
                    g += d / CLNN_DIVISOR(p, q);
% endif
                }
            }
</%def>
<%def name="store_dx(g, at)">\
% if act == "none":
            CLNN_STORE(${g}, dx, dx_off + ${at});
% else:
            CLNN_STORE(${g} * clnn_df(CLNN_LOAD(x, x_off + ${at}), ap, aq), dx, dx_off + ${at});
% endif
</%def>
__kernel void clnn_pool_backward(
        ${pool_args},
                                 __global const real_t *x, const int x_off,
                                 __global const real_t *dy, const int dy_off,
                                 __global real_t *dx, const int dx_off, const acc_t ap,
                                 const acc_t aq, __global const int *idx)
{
% if per == "element":
    // one work-item per element (plane, h, w) of dx, i = plane * H + h its row: the
    // general gather over the taps that reach it
    for (int e = (int)get_global_id(0); e < planes * H * W; e += (int)get_global_size(0)) {
        const int i = e / W, w = e % W;
        const int plane = i / H, h = i % H;
%   if mode == "max":
        __global const real_t *xp = x + x_off + plane * H * W;
%   endif
        {
${gather_one()}
${store_dx("g", "i * W + w")}\
        }
    }
% else:
    // one work-item per input row (plane, h)
    for (int i = (int)get_global_id(0); i < planes * H; i += (int)get_global_size(0)) {
        const int plane = i / H, h = i % H;
%   if mode == "max":
        __global const real_t *xp = x + x_off + plane * H * W;
%   endif
        if (SH >= KH && SW >= KW && DH == 1 && DW == 1) {
            // Windows that do not overlap (the usual 2x2 stride 2): (h, w) lies in at
            // most one window (p, q), found by counting instead of dividing, and
            // each window's maximum is found once for all of this row's w in it.
            // (Per element with divisions this was 2 ms of a 7 ms LeNet-5 step.)
            const int p = (h + PH) / SH;
            const bool in_p = (h + PH) % SH < KH && p < P;
            int q = PW / SW, rq = PW % SW;        // w + PW = q * SW + rq
% if mode == "max":
            int best = -1, best_q = -1;
% endif
            for (int w = 0; w < W; ++w) {
                acc_t g = (acc_t)0;
                if (in_p && rq < KW && q < Q) {
% if mode == "max":
                    if (q != best_q) {
                        best = CLNN_ARGMAX(p, q);
                        best_q = q;
                    }
                    if (best == h * W + w)
                        g = CLNN_LOAD(dy, dy_off + (plane * P + p) * Q + q);
% else:
                    g = CLNN_LOAD(dy, dy_off + (plane * P + p) * Q + q) / CLNN_DIVISOR(p, q);
% endif
                }
${store_dx("g", "i * W + w")}\
                if (++rq == SW) {
                    rq = 0;
                    ++q;
                }
            }
            continue;
        }
% if mode == "max":
        // Overlapping windows (3x3 at stride 2: ResNet's stem), CLNN_POOL_CW columns
        // at a time: each window over them adds dy to its maximum's element where that
        // lies in this row, in a private row of sums. The gather below finds each
        // element's windows in the order r, then s, ascending (p, then q, descending),
        // and the windows here go in that order, so the sums are the same; each
        // window's maximum comes from idx (clnn_pool_forward's indices, found once),
        // not once per element it might reach.
        for (int w0 = 0; w0 < W; w0 += CLNN_POOL_CW) {
            const int wn = min(CLNN_POOL_CW, W - w0), lo = w0 + PW - (KW - 1) * DW;
            const int q_lo = lo <= 0 ? 0 : (lo + SW - 1) / SW;
            const int q_hi = min(Q - 1, (w0 + wn - 1 + PW) / SW);
            acc_t g[CLNN_POOL_CW];
            for (int j = 0; j < CLNN_POOL_CW; ++j)
                g[j] = (acc_t)0;
            for (int r = 0; r < KH; ++r) {
                const int tp = h + PH - r * DH;
                if (tp < 0 || tp % SH != 0 || tp / SH >= P)
                    continue;
                const int p = tp / SH;
                for (int q = q_hi; q >= q_lo; --q) {
                    const int j = idx[(plane * P + p) * Q + q] - (h * W + w0);  // -1: none
                    if (j >= 0 && j < wn)
                        g[j] += CLNN_LOAD(dy, dy_off + (plane * P + p) * Q + q);
                }
            }
            for (int j = 0; j < wn; ++j) {
${store_dx("g[j]", "i * W + w0 + j")}\
            }
        }
% else:
        // the general case: tap r of window p covers h when p SH - PH + r DH = h
        for (int w = 0; w < W; ++w) {
${gather_one()}
${store_dx("g", "i * W + w")}\
        }
% endif
    }
% endif
}

<%
    v4, v8 = f"{acc}4", f"{acc}8"
    m4 = "long4" if dtype == "float64" else "int4"      # what comparing two v4 gives
    # CPUs, 16-bit storage: a row's last partial block of windows overlaps the one
    # before, as vectors, where one window at a time converts each element alone
    # (LeNet-5's float16 rows of 14 windows on PoCL: forward 0.10 -> 0.09 ms, backward
    # 0.24-0.26 -> 0.18; float32's scalar windows cost no more than the vector block)
    overlap = per == "row" and storage_only
%>
## load8(t, ptr): t_e and t_o, the even and odd ones of the 8 elements at ptr (as one
## vector of 8 where that is 256 bits, else as two of 4: see programs.CPU_LANES);
## store8(ptr, a, b): a.s0, b.s0, a.s1, b.s1, ... a.s3, b.s3 to the 8 elements at ptr
<%def name="load8(t, ptr)">
% if cpu_lanes == 8:
        const ${v8} ${t} = CLNN_LOADV(8, ${ptr});
        const ${v4} ${t}_e = ${t}.even, ${t}_o = ${t}.odd;
% else:
        const ${v4} ${t}_l = CLNN_LOADV(4, ${ptr}), ${t}_h = CLNN_LOADV(4, ${ptr} + 4);
        const ${v4} ${t}_e = (${v4})(${t}_l.even, ${t}_h.even);
        const ${v4} ${t}_o = (${v4})(${t}_l.odd, ${t}_h.odd);
% endif
</%def>
## blocks(rows): the loop over a work-item's blocks of 4 (q0) in its row (row) of
## `rows`: on CPUs ("row") every block of one row, the row's index arithmetic done once
## and PoCL's cost per work-item paid once per row; on GPUs one block per work-item,
## i = row * Q4 + q0 / 4 (neighbouring work-items, neighbouring addresses). The body
## ends a block with continue.
<%def name="blocks(rows)">
% if per == "row":
    const int row = (int)get_global_id(0);
    if (row >= ${rows})
        return;
    for (int qb = 0; qb < 4 * Q4; qb += 4) {
        int q0 = qb;                         // (a last partial block may move it back)
% else:
    const int i = (int)get_global_id(0);
    if (i >= ${rows} * Q4)
        return;
    const int row = i / Q4;
    for (int q0 = (i - row * Q4) * 4, once = 1; once; once = 0) {
% endif
</%def>
<%def name="store8(ptr, a, b)">
% if cpu_lanes == 8:
        CLNN_STOREV(8, (${v8})(${a}.s0, ${b}.s0, ${a}.s1, ${b}.s1, ${a}.s2, ${b}.s2, ${a}.s3, ${b}.s3),
                    ${ptr});
% else:
        CLNN_STOREV(4, (${v4})(${a}.s0, ${b}.s0, ${a}.s1, ${b}.s1), ${ptr});
        CLNN_STOREV(4, (${v4})(${a}.s2, ${b}.s2, ${a}.s3, ${b}.s3), ${ptr} + 4);
% endif
</%def>
// ---- 2x2 windows, stride 2, no padding (LeNet's pooling, and most CNNs'), max or
// average (``div``: the divisor, 4 or divisor_override; a sum of the window's four
// elements in row-major order divided by it, as the general kernels'): blocks of 4
// windows along a row, loading the two rows of x under them as vectors of 8 and
// storing vectors, so PoCL does not have to vectorise across work-items (its scattered
// stride-2 accesses there ran 7x slower); a block at the right edge, and the last row
// or column of an odd H or W, goes element by element. A work-item takes a block on
// GPUs, a whole row of blocks on CPUs (per "row"; with the backward pass's selects
// below, on PoCL: LeNet C1's forward pass 0.100 -> 0.072 ms, backward 0.207 -> 0.152;
// 56x56 planes, 32 x 64 of them, 1.54 -> 1.17 and 3.57 -> 2.74 ms). Same rules as above:
// the first maximum in row-major order wins, a NaN beats any number.
% if mode == "max":
inline bool clnn_beats(const acc_t v, const acc_t best)
{
    // v != v is IEEE's NaN test (no fast-math here): PoCL makes isnan() a call
    return (v > best) | ((v != v) & (best == best));
}

inline ${m4} clnn_beats4(const ${v4} v, const ${v4} best)
{
    return (v > best) | ((v != v) & (best == best));
}
% endif

// Forward: each window's maximum as a value (loading x at the winner's index instead,
// an address that depends on the data, ran 3.5x slower on PoCL), or its mean. Block q0
// of row (plane, p) covers y[plane, p, q0 .. q0 + 3].
__kernel void clnn_pool22_forward(const int planes, const int H, const int W, const int P,
                                  const int Q, __global const real_t *x, const int x_off,
                                  __global real_t *y, const int y_off, const acc_t div)
{
    const int Q4 = (Q + 3) / 4;
${blocks("planes * P")}\
        const int plane = row / P, p = row - plane * P;       // row = plane * P + p
% if overlap:
        // a last partial block overlaps the one before (its windows again, the same
        // values, by this work-item): vectors instead of a window at a time
        if (q0 + 4 > Q && Q >= 4)
            q0 = Q - 4;
% endif
        const int i0 = x_off + plane * H * W + 2 * p * W + 2 * q0;
        if (q0 + 4 <= Q) {
${load8("t", "x + i0")}\
${load8("u", "x + i0 + W")}\
% if mode == "max":
            ${v4} v = t_e;                    // CLNN_SELECT(a, b, m): b where m, else a
            v = CLNN_SELECT(v, t_o, clnn_beats4(t_o, v));
            v = CLNN_SELECT(v, u_e, clnn_beats4(u_e, v));
            v = CLNN_SELECT(v, u_o, clnn_beats4(u_o, v));
% else:
            const ${v4} v = (t_e + t_o + u_e + u_o) / div;
% endif
            CLNN_STOREV(4, v, y + y_off + row * Q + q0);
            continue;
        }
        for (int q = q0; q < Q; ++q) {
            const int j = i0 + 2 * (q - q0);
            acc_t v = CLNN_LOAD(x, j);
            const acc_t b = CLNN_LOAD(x, j + 1), c = CLNN_LOAD(x, j + W);
            const acc_t d = CLNN_LOAD(x, j + W + 1);
% if mode == "max":
            v = clnn_beats(b, v) ? b : v;
            v = clnn_beats(c, v) ? c : v;
            v = clnn_beats(d, v) ? d : v;
% else:
            v = (v + b + c + d) / div;
% endif
            CLNN_STORE(v, y, y_off + row * Q + q);
        }
    }
}

// Backward: the windows of dx, ceil(H/2) x ceil(W/2) of them (a last odd row or
// column lies in none and gets zeros), in blocks of 4 along a row of ceil(W/2) of
// them: the winner of each is found once and its four elements written (a work-item
// per element of dx found it four times).
__kernel void clnn_pool22_backward(const int planes, const int H, const int W, const int P,
                                   const int Q, __global const real_t *x, const int x_off,
                                   __global const real_t *dy, const int dy_off,
                                   __global real_t *dx, const int dx_off, const acc_t ap,
                                   const acc_t aq, const acc_t div)
{
    const int P2 = (H + 1) / 2, Q2 = (W + 1) / 2, Q4 = (Q2 + 3) / 4;
${blocks("planes * P2")}\
        const int plane = row / P2, p = row - plane * P2;
% if overlap:
        // a last partial block of whole windows overlaps the one before (as forward);
        // a window past Q (an odd W's last column) is left to the loop below
        if (p < P && q0 < Q && q0 + 4 > Q && Q >= 4)
            q0 = Q - 4;
% endif
        int qs = q0;                         // the first window the loop below takes
        const int at = plane * H * W + 2 * p * W + 2 * q0;
        if (p < P && q0 + 4 <= Q) {
% if mode == "max" or act != "none":
${load8("t", "x + x_off + at")}\
${load8("u", "x + x_off + at + W")}\
% endif
% if mode == "max":
            ${v4} g = CLNN_LOADV(4, dy + dy_off + (plane * P + p) * Q + q0);
            // m1, m2, m3: the second, third, fourth element beats those before it;
            // the last that does is the window's first maximum, so g goes to the
            // fourth where m3, else to the third where m2, ... (selects only: a mask
            // combined as m2 & ~m3 was miscomputed by Oclgrind; a winner's index as
            // a vector and four comparisons with it took 30% longer on PoCL)
            const ${m4} m1 = clnn_beats4(t_o, t_e);
            ${v4} v = CLNN_SELECT(t_e, t_o, m1);
            const ${m4} m2 = clnn_beats4(u_e, v);
            v = CLNN_SELECT(v, u_e, m2);
            const ${m4} m3 = clnn_beats4(u_o, v);
% if act != "none":
            // the activation's derivative at each window's winner (the others get 0)
            g *= clnn_df4(CLNN_SELECT(v, u_o, m3), ap, aq);
% endif
            const ${v4} z = (${v4})(0);
            const ${v4} r3 = CLNN_SELECT(z, g, m3);
            ${v4} rest = CLNN_SELECT(g, z, m3);      // g where no later element won
            const ${v4} r2 = CLNN_SELECT(z, rest, m2);
            rest = CLNN_SELECT(rest, z, m2);
            const ${v4} r1 = CLNN_SELECT(z, rest, m1), r0 = CLNN_SELECT(rest, z, m1);
% else:
            // each window's dy over the divisor to its four elements (times the
            // activation's derivative at each)
            const ${v4} g = CLNN_LOADV(4, dy + dy_off + (plane * P + p) * Q + q0) / div;
%   if act == "none":
            const ${v4} r0 = g, r1 = g, r2 = g, r3 = g;
%   else:
            const ${v4} r0 = g * clnn_df4(t_e, ap, aq), r1 = g * clnn_df4(t_o, ap, aq);
            const ${v4} r2 = g * clnn_df4(u_e, ap, aq), r3 = g * clnn_df4(u_o, ap, aq);
%   endif
% endif
${store8("dx + dx_off + at", "r0", "r1")}\
${store8("dx + dx_off + at + W", "r2", "r3")}\
% if overlap:
            qs = q0 + 4;                     // an odd W's last column, if in the block
% else:
            continue;
% endif
        }
        for (int q = qs; q < min(${"qb" if per == "row" else "q0"} + 4, Q2); ++q) {
            const int o = dx_off + at + 2 * (q - q0);
            if (p < P && q < Q) {
                const int i0 = x_off + at + 2 * (q - q0);
% if mode == "avg":
                const acc_t g = CLNN_LOAD(dy, dy_off + (plane * P + p) * Q + q) / div;
%   for d in ("", " + 1", " + W", " + W + 1"):
%     if act == "none":
                CLNN_STORE(g, dx, o${d});
%     else:
                CLNN_STORE(g * clnn_df(CLNN_LOAD(x, i0${d}), ap, aq), dx, o${d});
%     endif
%   endfor
                (void)i0;
% else:
                const acc_t a = CLNN_LOAD(x, i0), b = CLNN_LOAD(x, i0 + 1);
                const acc_t c = CLNN_LOAD(x, i0 + W), d = CLNN_LOAD(x, i0 + W + 1);
                int best = 0;
                acc_t v = a;
                best = clnn_beats(b, v) ? 1 : best;
                v = clnn_beats(b, v) ? b : v;
                best = clnn_beats(c, v) ? 2 : best;
                v = clnn_beats(c, v) ? c : v;
                best = clnn_beats(d, v) ? 3 : best;
% if act == "none":
                const acc_t g = CLNN_LOAD(dy, dy_off + (plane * P + p) * Q + q);
% else:
                v = clnn_beats(d, v) ? d : v;
                const acc_t g = CLNN_LOAD(dy, dy_off + (plane * P + p) * Q + q) *
                    clnn_df(v, ap, aq);
% endif
                CLNN_STORE(best == 0 ? g : (acc_t)0, dx, o);
                CLNN_STORE(best == 1 ? g : (acc_t)0, dx, o + 1);
                CLNN_STORE(best == 2 ? g : (acc_t)0, dx, o + W);
                CLNN_STORE(best == 3 ? g : (acc_t)0, dx, o + W + 1);
% endif
            } else {                 // the last row or column of an odd H or W
                CLNN_STORE((acc_t)0, dx, o);
                if (2 * q + 1 < W)
                    CLNN_STORE((acc_t)0, dx, o + 1);
                if (2 * p + 1 < H) {
                    CLNN_STORE((acc_t)0, dx, o + W);
                    if (2 * q + 1 < W)
                        CLNN_STORE((acc_t)0, dx, o + W + 1);
                }
            }
        }
    }
}
