## convt.cl: direct convolution in local-memory tiles, for GPUs and layers with few
## output channels (LeNet-5's 6 and 16 filters, its 6-channel data gradient).
## Parameters:  dtype  float32 | float64 | float16 | bfloat16
##              act    the activation fused into the output ("none" or a name of
##                     clnn.ACTIVATIONS)
##              MB     output channels a work-item sums at once (4, 8 or 16): M <= MB
## Used by clnn/ops/conv.py's GPU path (the "local" rows) where M <= MB: as an implicit
## GEMM such a layer fills MB or fewer rows of a tile of 16 or more, and every unrolled
## element it loads is used M times, so the gathered loads bound it. Here a
## work-group loads its input patch once into local memory, where each element serves
## every tap that reads it (25 of a 5x5 filter), and writes whole rows of output.
<%include file="_common.cl"/>
<%include file="_activation.cl" args="act=act"/>
#define MB ${MB}     // output channels per work-item (accumulators in registers)
#define TW ${TW}     // output columns per work-group, a work-item each
#define TH ${TH}     // output rows per work-group
#define LW ${LW}     // local elements for a channel block's weights (CB R S MB)
#define LP ${LP}     // local elements for a channel block's input patch (CB PT QT)
//
// x (N, C, H, W), w (M, C, R, S), y (N, M, P, Q): y[n, m, p, q] = b[m] + sum over c, r,
// s of w[m, c, r, s] x[n, c, p SH - PH + r, q SW - PW + s] (taps outside x read 0),
// then the activation. With flip, the data gradient at unit stride as a forward pass
// over dy: x is dy (its C channels the convolution's M filters), y is dx (its M
// channels the convolution's C), PH and PW are R - 1 - ph and S - 1 - pw, and the
// filters are the convolution's w (C, M, R, S) with their channel axes swapped and
// their taps flipped: w'[m, c, r, s] = w[c, m, R - 1 - r, S - 1 - s].
//
// A work-group is TW x TH output positions of one image and all M channels: for each
// block of CB input channels it loads the patch of x those positions read, rows of
// QT = (TW - 1) SW + S, and the block's weights ordered (c, r, s, m), zero past M,
// then each work-item adds its MB sums over the block's taps. The host picks CB so
// that both fit LW and LP.
__kernel __attribute__((reqd_work_group_size(TW, TH, 1)))
void clnn_convt_forward(const int C, const int H, const int W, const int M, const int P,
                        const int Q, const int R, const int S, const int SH, const int SW,
                        const int PH, const int PW, const int CB, const int flip,
                        const acc_t act_p, const acc_t act_q, const int has_bias,
                        __global const real_t *x, const int x_off,
                        __global const real_t *w, const int w_off,
                        __global const real_t *b, const int b_off,
                        __global real_t *y, const int y_off)
{
    __local acc_t wl[LW];
    __local acc_t xl[LP];
    const int tx = (int)get_local_id(0), ty = (int)get_local_id(1);
    const int lid = ty * TW + tx;
    const int q0 = (int)get_group_id(0) * TW, p0 = (int)get_group_id(1) * TH;
    const int n = (int)get_group_id(2);
    const int PT = (TH - 1) * SH + R, QT = (TW - 1) * SW + S;     // the patch's extent
    const int h0 = p0 * SH - PH, w0 = q0 * SW - PW;               // its corner in x
    const int RS = R * S;
    acc_t acc[MB];
#pragma unroll
    for (int m = 0; m < MB; ++m)
        acc[m] = (acc_t)0;
    for (int c0 = 0; c0 < C; c0 += CB) {
        const int cb = min(CB, C - c0);
        barrier(CLK_LOCAL_MEM_FENCE);             // the block before is read by all
        // (loops without a division by a size known only at run time: a channel's
        // patch row by row, its weights with m = j % MB and (r, s) = j / MB)
        for (int c = 0; c < cb; ++c) {
            __global const real_t *xc = x + x_off + ((n * C + c0 + c) * H) * W;
            for (int hh = ty; hh < PT; hh += TH) {
                const int h = h0 + hh;
                for (int vv = tx; vv < QT; vv += TW) {
                    const int v = w0 + vv;
                    xl[(c * PT + hh) * QT + vv] = (h >= 0 && h < H && v >= 0 && v < W) ?
                        CLNN_LOAD(xc, h * W + v) : (acc_t)0;
                }
            }
            for (int j = lid; j < RS * MB; j += TW * TH) {
                const int m = j % MB, rs = j / MB;
                wl[c * RS * MB + j] = m >= M ? (acc_t)0 : flip ?
                    CLNN_LOAD(w, w_off + ((c0 + c) * M + m) * RS + (RS - 1 - rs)) :
                    CLNN_LOAD(w, w_off + (m * C + c0 + c) * RS + rs);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int c = 0; c < cb; ++c)
            for (int r = 0; r < R; ++r) {
                __local const acc_t *xr = xl + (c * PT + ty * SH + r) * QT + tx * SW;
                __local const acc_t *wr = wl + (c * RS + r * S) * MB;
                for (int s = 0; s < S; ++s) {
                    const acc_t xv = xr[s];
#pragma unroll
                    for (int m = 0; m < MB; ++m)
                        acc[m] = mad(wr[s * MB + m], xv, acc[m]);  // one word for all
                }
            }
    }
    const int p = p0 + ty, q = q0 + tx;
    if (p >= P || q >= Q)
        return;
    __global real_t *yp = y + y_off + (n * M * P + p) * Q + q;
#pragma unroll
    for (int m = 0; m < MB; ++m) {
        if (m < M) {
            const acc_t v = acc[m] + (has_bias ? CLNN_LOAD(b, b_off + m) : (acc_t)0);
% if act == "none":
            CLNN_STORE(v, yp, m * P * Q);
% else:
            CLNN_STORE(clnn_f(v, act_p, act_q), yp, m * P * Q);
% endif
        }
    }
}
