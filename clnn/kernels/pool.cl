## pool.cl: 2-D max and average pooling, forward and backward.
## Parameters:  dtype  float32 | float64 | float16
##              mode   "max" | "avg"
## Used by clnn/ops/pool.py.
<%include file="_common.cl"/>
//
// x (N, C, H, W) -> y (N, C, P, Q) over KH x KW windows with stride (SH, SW) and zero
// padding (PH, PW); planes = N * C. One work-item per output row forward, one per
// input row backward (each element gathers over the windows that contain it), so
// nothing is written twice and no atomics are needed. Max pooling over 2x2 windows
// with stride 2 and no padding has its own kernels at the end: a work-item per element.
% if mode == "max":
// Max pooling ignores padding; a window's maximum is its first maximal element in
// row-major order, the same rule forward and backward, so ties route the gradient to
// exactly one input, deterministically.
% else:
// Average pooling divides by KH * KW, padding included (PyTorch's default).
% endif
//
<%
    pool_args = ("const int planes, const int H, const int W, const int P, const int Q,\n"
                 "        const int KH, const int KW, const int SH, const int SW, const int PH,\n"
                 "        const int PW")
%>
% if mode == "max":
// the flat index (h * W + w) of the maximum of window (p, q) of one plane, or -1
inline int clnn_argmax(__global const real_t *x, const int H, const int W, const int p,
                       const int q, const int KH, const int KW, const int SH, const int SW,
                       const int PH, const int PW)
{
    int best = -1;
    acc_t v_best = (acc_t)0;
    for (int r = 0; r < KH; ++r) {
        const int h = p * SH + r - PH;
        if (h < 0 || h >= H)
            continue;
        for (int s = 0; s < KW; ++s) {
            const int w = q * SW + s - PW;
            if (w < 0 || w >= W)
                continue;
            const acc_t v = CLNN_LOAD(x, h * W + w);
            if (best < 0 || v > v_best || (isnan(v) && !isnan(v_best))) {
                best = h * W + w;
                v_best = v;
            }
        }
    }
    return best;
}
% endif

__kernel void clnn_pool_forward(
        ${pool_args},
                                __global const real_t *x, const int x_off,
                                __global real_t *y, const int y_off)
{
    // one work-item per output row (plane, p): the index arithmetic is per row
    for (int i = (int)get_global_id(0); i < planes * P; i += (int)get_global_size(0)) {
        const int plane = i / P, p = i % P;
        __global const real_t *xp = x + x_off + plane * H * W;
        for (int q = 0; q < Q; ++q) {
% if mode == "max":
            const int best = clnn_argmax(xp, H, W, p, q, KH, KW, SH, SW, PH, PW);
            CLNN_STORE(best < 0 ? (acc_t)0 : CLNN_LOAD(xp, best), y, y_off + i * Q + q);
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
            CLNN_STORE(sum / (acc_t)(KH * KW), y, y_off + i * Q + q);
% endif
        }
    }
}

// dx[plane, h, w] = sum of dy over the windows (p, q) that contain (h, w)
% if mode == "max":
//                   and whose maximum it is.
% else:
//                   each divided by KH * KW.
% endif
__kernel void clnn_pool_backward(
        ${pool_args},
                                 __global const real_t *x, const int x_off,
                                 __global const real_t *dy, const int dy_off,
                                 __global real_t *dx, const int dx_off)
{
    // one work-item per input row (plane, h): its windows p0..p1 are found once
    for (int i = (int)get_global_id(0); i < planes * H; i += (int)get_global_size(0)) {
        const int plane = i / H, h = i % H;
        // windows p with p * SH - PH <= h < p * SH - PH + KH
        const int p0 = max(0, (h + PH - KH + SH) / SH), p1 = min(P - 1, (h + PH) / SH);
% if mode == "max":
        __global const real_t *xp = x + x_off + plane * H * W;
% endif
        if (SH >= KH && SW >= KW) {
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
                        best = clnn_argmax(xp, H, W, p, q, KH, KW, SH, SW, PH, PW);
                        best_q = q;
                    }
                    if (best == h * W + w)
                        g = CLNN_LOAD(dy, dy_off + (plane * P + p) * Q + q);
% else:
                    g = CLNN_LOAD(dy, dy_off + (plane * P + p) * Q + q) / (acc_t)(KH * KW);
% endif
                }
                CLNN_STORE(g, dx, dx_off + i * W + w);
                if (++rq == SW) {
                    rq = 0;
                    ++q;
                }
            }
            continue;
        }
        for (int w = 0; w < W; ++w) {
            const int q0 = max(0, (w + PW - KW + SW) / SW), q1 = min(Q - 1, (w + PW) / SW);
            acc_t g = (acc_t)0;
            for (int p = p0; p <= p1; ++p) {
                for (int q = q0; q <= q1; ++q) {
% if mode == "max":
                    if (clnn_argmax(xp, H, W, p, q, KH, KW, SH, SW, PH, PW) == h * W + w)
                        g += CLNN_LOAD(dy, dy_off + (plane * P + p) * Q + q);
% else:
                    g += CLNN_LOAD(dy, dy_off + (plane * P + p) * Q + q);
% endif
                }
            }
% if mode == "avg":
            g /= (acc_t)(KH * KW);
% endif
            CLNN_STORE(g, dx, dx_off + i * W + w);
        }
    }
}

% if mode == "max":
// ---- 2x2 windows, stride 2, no padding (LeNet's pooling, and most CNNs'): a
// work-item per element with no loops, so PoCL can run a work-group's work-items as
// one vectorised loop. Same rules as above: the first maximum in row-major order wins,
// a NaN beats any number.
inline bool clnn_beats(const acc_t v, const acc_t best)
{
    // v != v is IEEE's NaN test (no fast-math here): PoCL makes isnan() a call, and
    // a call in the body keeps it from vectorising the work-items
    return (v > best) | ((v != v) & (best == best));
}

inline int clnn_argmax22(__global const real_t *x, const int W, const int p, const int q)
{
    const int i0 = 2 * p * W + 2 * q;
    const acc_t a = CLNN_LOAD(x, i0), b = CLNN_LOAD(x, i0 + 1);
    const acc_t c = CLNN_LOAD(x, i0 + W), d = CLNN_LOAD(x, i0 + W + 1);
    int best = i0;
    acc_t v = a;
    best = clnn_beats(b, v) ? i0 + 1 : best;
    v = clnn_beats(b, v) ? b : v;
    best = clnn_beats(c, v) ? i0 + W : best;
    v = clnn_beats(c, v) ? c : v;
    best = clnn_beats(d, v) ? i0 + W + 1 : best;
    return best;
}

__kernel void clnn_pool22_forward(const int planes, const int H, const int W, const int P,
                                  const int Q, __global const real_t *x, const int x_off,
                                  __global real_t *y, const int y_off)
{
    const int q = (int)get_global_id(0);
    const int row = (int)get_global_id(1);       // plane * P + p
    if (q >= Q || row >= planes * P)
        return;
    __global const real_t *xp = x + x_off + row / P * H * W;
    CLNN_STORE(CLNN_LOAD(xp, clnn_argmax22(xp, W, row % P, q)), y, y_off + row * Q + q);
}

__kernel void clnn_pool22_backward(const int planes, const int H, const int W, const int P,
                                   const int Q, __global const real_t *x, const int x_off,
                                   __global const real_t *dy, const int dy_off,
                                   __global real_t *dx, const int dx_off)
{
    const int w = (int)get_global_id(0);
    const int row = (int)get_global_id(1);       // plane * H + h
    if (w >= W || row >= planes * H)
        return;
    const int plane = row / H, h = row % H, p = h / 2, q = w / 2;
    acc_t g = (acc_t)0;
    if (p < P && q < Q) {
        __global const real_t *xp = x + x_off + plane * H * W;
        const acc_t d = CLNN_LOAD(dy, dy_off + (plane * P + p) * Q + q);
        g = clnn_argmax22(xp, W, p, q) == h * W + w ? d : (acc_t)0;
    }
    CLNN_STORE(g, dx, dx_off + row * W + w);
}
% endif
