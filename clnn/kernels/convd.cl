## convd.cl: direct convolution for grouped (depthwise) and dilated convolutions: each
## output element summed by one work-item straight from the input, no unrolled matrix.
## Parameters:  dtype  float32 | float64 | float16 | bfloat16
##              act    the activation fused into the forward pass ("none" or a name of
##                     clnn.ACTIVATIONS)
##              wg     work-items per weight element in the weight gradient (power of 2)
##              QB     output columns a work-item keeps in registers (forward)
## Used by clnn/ops/conv.py when groups > 1 or dilation > 1. A depthwise convolution
## (groups = C) is memory-bound: a direct kernel reads each input element R S times
## from cache, which an implicit GEMM of K = R S could not beat.
<%include file="_common.cl"/>
<%include file="_activation.cl" args="act=act"/>
<%
    QB = 32
    L = min(8, cpu_lanes)       # the CPU weight gradient's lanes of sums
%>
//
// x (N, C, H, W), w (M, C / G, R, S), y (N, M, P, Q): output channel m belongs to group
// g = m / (M / G) and reads input channels g (C / G) ... (g + 1) (C / G) - 1. Tap (r, s)
// of output (p, q) reads (p SH - PH + r DH, q SW - PW + s DW); taps outside x are 0.
<%
    geo = ("const int N, const int C, const int H, const int W, const int M, const int P,\n"
           "        const int Q, const int R, const int S, const int SH, const int SW,\n"
           "        const int PH, const int PW, const int DH, const int DW, const int G")
%>

// one work-item per output row (n, m, p), in blocks of ${QB} columns held in registers:
// for each tap (c, r, s) the columns whose input lies inside x form one range, so the
// inner loop is a plain multiply-add over contiguous memory (at stride 1) that the
// compiler vectorises, with no test per element
__kernel void clnn_convd_forward(const int rows, ${geo},
                                 const acc_t act_p, const acc_t act_q, const int has_bias,
                                 __global const real_t *x, const int x_off,
                                 __global const real_t *w, const int w_off,
                                 __global const real_t *b, const int b_off,
                                 __global real_t *y, const int y_off)
{
    const int Cg = C / G, Mg = M / G;
    for (int row = (int)get_global_id(0); row < rows; row += (int)get_global_size(0)) {
        const int p = row % P, m = (row / P) % M, b_ = row / (P * M);
        const int g = m / Mg;
        const acc_t bias = has_bias ? CLNN_LOAD(b, b_off + m) : (acc_t)0;
        for (int q0 = 0; q0 < Q; q0 += ${QB}) {
            const int nq = min(${QB}, Q - q0);
            acc_t acc[${QB}];
            for (int j = 0; j < ${QB}; ++j)
                acc[j] = bias;
            for (int c = 0; c < Cg; ++c) {
                const int xb = x_off + (b_ * C + g * Cg + c) * H * W;
                const int wb = w_off + (m * Cg + c) * R * S;
                for (int r = 0; r < R; ++r) {
                    const int h = p * SH - PH + r * DH;
                    if (h < 0 || h >= H)
                        continue;
                    for (int s = 0; s < S; ++s) {
                        const acc_t wv = CLNN_LOAD(w, wb + r * S + s);
                        // columns j with 0 <= (q0 + j) SW - PW + s DW < W
                        const int off = q0 * SW - PW + s * DW;
                        const int j0 = off >= 0 ? 0 : (-off + SW - 1) / SW;
                        const int j1 = min(nq, off < W ? (W - 1 - off) / SW + 1 : 0);
                        __global const real_t *xr = x + xb + h * W + off;
                        for (int j = j0; j < j1; ++j)
                            acc[j] += wv * CLNN_LOAD(xr, j * SW);
                    }
                }
            }
            for (int j = 0; j < nq; ++j)
% if act == "none":
                CLNN_STORE(acc[j], y, y_off + row * Q + q0 + j);
% else:
                CLNN_STORE(clnn_f(acc[j], act_p, act_q), y, y_off + row * Q + q0 + j);
% endif
        }
    }
}

// one work-item per input row (n, ci, h), in blocks of ${QB} columns in registers: for
// each output row p and tap (r, s) that reaches this row, the columns v it reaches are
// every SW-th of one range, read from a contiguous range of dy
__kernel void clnn_convd_backward_data(const int rows, ${geo},
                                       __global const real_t *dy, const int dy_off,
                                       __global const real_t *w, const int w_off,
                                       __global real_t *dx, const int dx_off)
{
    const int Cg = C / G, Mg = M / G;
    for (int row = (int)get_global_id(0); row < rows; row += (int)get_global_size(0)) {
        const int h = row % H, ci = (row / H) % C, b_ = row / (H * C);
        const int g = ci / Cg, c = ci % Cg;
        for (int v0 = 0; v0 < W; v0 += ${QB}) {
            const int nv = min(${QB}, W - v0);
            acc_t acc[${QB}];
            for (int j = 0; j < ${QB}; ++j)
                acc[j] = (acc_t)0;
            for (int mm = 0; mm < Mg; ++mm) {
                const int m = g * Mg + mm;
                const int yb = dy_off + (b_ * M + m) * P * Q;
                const int wb = w_off + (m * Cg + c) * R * S;
                for (int r = 0; r < R; ++r) {
                    const int tp = h + PH - r * DH;
                    if (tp < 0 || tp % SH != 0 || tp / SH >= P)
                        continue;
                    __global const real_t *dyr = dy + yb + (tp / SH) * Q;
                    for (int s = 0; s < S; ++s) {
                        const acc_t wv = CLNN_LOAD(w, wb + r * S + s);
                        // column v0 + j reads q = (v0 + j + PW - s DW) / SW when that
                        // divides: j = j0, j0 + SW, ... with 0 <= q < Q
                        const int off = v0 + PW - s * DW;
                        int j0 = off >= 0 ? (SW - off % SW) % SW : -off;
                        const int q0 = (off + j0) / SW;
                        const int n_q = min(Q - q0, (nv - j0 + SW - 1) / SW);
                        for (int k = 0; k < n_q; ++k)
                            acc[j0 + k * SW] += wv * CLNN_LOAD(dyr, q0 + k);
                    }
                }
            }
            for (int j = 0; j < nv; ++j)
                CLNN_STORE(acc[j], dx, dx_off + row * W + v0 + j);
        }
    }
}

## The weight gradient's element e = (m, c, r, s), and the columns q its tap reads
## inside x; then, per output row (n, p), its rows of dy and x (skipping rows whose tap
## lies outside x).
<%def name="weight_element()">\
    const int s = e % S, r = (e / S) % R, c = (e / (R * S)) % Cg, m = e / (Cg * R * S);
    const int ci = (m / Mg) * Cg + c;
    // columns q with 0 <= q SW - PW + s DW < W: the same for every row
    const int off = s * DW - PW;
    const int qa = off >= 0 ? 0 : (-off + SW - 1) / SW;
    const int qb = min(Q, off < W ? (W - 1 - off) / SW + 1 : 0);
</%def>
<%def name="row_start()">\
        const int p = row % P, b_ = row / P;
        const int h = p * SH - PH + r * DH;
        if (h < 0 || h >= H)
            continue;
        __global const real_t *dyr = dy + dy_off + ((b_ * M + m) * P + p) * Q;
        __global const real_t *xr = x + x_off + ((b_ * C + ci) * H + h) * W + off;
</%def>

// one work-group of ${wg} per weight element (m, c, r, s): the sum over (n, p, q) of
// dy[n, m, p, q] x[n, g Cg + c, tap]. Work-item l takes the output rows (n, p) = l,
// l + ${wg}, ... and sums each over its columns q whose tap lies inside x (one range:
// a contiguous multiply-add), then the partial sums meet in a tree in fixed pairs:
// bitwise the same on every run. dw = alpha sum + beta dw.
__kernel __attribute__((reqd_work_group_size(${wg}, 1, 1)))
void clnn_convd_backward_weight(${geo},
                                const acc_t alpha, const acc_t beta,
                                __global const real_t *dy, const int dy_off,
                                __global const real_t *x, const int x_off,
                                __global real_t *dw, const int dw_off)
{
    __local acc_t part[${wg}];
    const int Cg = C / G, Mg = M / G;
    const int e = (int)get_group_id(0), l = (int)get_local_id(0);
${weight_element()}\
    acc_t acc = (acc_t)0;
    for (int row = l; row < N * P; row += ${wg}) {
${row_start()}\
        for (int q = qa; q < qb; ++q)
            acc += CLNN_LOAD(dyr, q) * CLNN_LOAD(xr, q * SW);
    }
    part[l] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
% for step in [wg >> (j + 1) for j in range(wg.bit_length() - 1)]:
    if (l < ${step})
        part[l] += part[l + ${step}];
    barrier(CLK_LOCAL_MEM_FENCE);
% endfor
    if (l == 0) {
        acc_t out = alpha * part[0];
        if (beta != (acc_t)0)
            out += beta * CLNN_LOAD(dw, dw_off + e);
        CLNN_STORE(out, dw, dw_off + e);
    }
}

// CPUs: one work-item per weight element, no work-group and no barrier (PoCL runs a
// work-group as a loop over its work-items and splits that loop at each barrier,
// which kept the loads below from being merged into vectors). Its sum over (n, p, q)
// runs in ${L} lanes along q, added up in a fixed order at the end: one scalar sum
// is a chain of dependent adds, a few cycles each (a depthwise 56x56x256 weight
// gradient took 125 ms that way, PyTorch 52).
__kernel void clnn_convd_backward_weight_lanes(${geo},
                                               const acc_t alpha, const acc_t beta,
                                               __global const real_t *dy, const int dy_off,
                                               __global const real_t *x, const int x_off,
                                               __global real_t *dw, const int dw_off)
{
    const int Cg = C / G, Mg = M / G;
    const int e = (int)get_global_id(0);
    if (e >= M * Cg * R * S)
        return;
${weight_element()}\
    ${acc}${L} accv = (${acc}${L})(0);
    acc_t acc = (acc_t)0;
    for (int row = 0; row < N * P; ++row) {
${row_start()}\
        int q = qa;
        if (SW == 1) {
            // x's row contiguous too: constant offsets from one pointer per row, which
            // the compiler merges into vector loads (from q + j it cannot: an int
            // index may wrap)
            for (; q + ${L} <= qb; q += ${L}) {
                __global const real_t *dq = dyr + q, *xq = xr + q;
                accv += (${acc}${L})(${", ".join(f"CLNN_LOAD(dq, {j})" for j in range(L))})
                      * (${acc}${L})(${", ".join(f"CLNN_LOAD(xq, {j})" for j in range(L))});
            }
        } else {                  // (x's elements SW apart: loaded one by one)
            for (; q + ${L} <= qb; q += ${L}) {
                __global const real_t *dq = dyr + q, *xq = xr + q * SW;
                accv += (${acc}${L})(${", ".join(f"CLNN_LOAD(dq, {j})" for j in range(L))})
                      * (${acc}${L})(${", ".join(f"CLNN_LOAD(xq, {j} * SW)" for j in range(L))});
            }
        }
        for (; q < qb; ++q)
            acc += CLNN_LOAD(dyr, q) * CLNN_LOAD(xr, q * SW);
    }
    acc_t out = alpha * (clnn_lanes_sum${L}(accv) + acc);
    if (beta != (acc_t)0)
        out += beta * CLNN_LOAD(dw, dw_off + e);
    CLNN_STORE(out, dw, dw_off + e);
}
