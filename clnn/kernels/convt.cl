## convt.cl: direct convolution in local-memory tiles, for GPUs and layers with few
## output channels (LeNet-5's 6 and 16 filters, its 6-channel data gradient).
## Parameters:  dtype  float32 | float64 | float16 | bfloat16
##              act    the activation fused into the output ("none" or a name of
##                     clnn.ACTIVATIONS)
##              MB     output channels a work-item sums at once (4, 8 or 16): M <= MB;
##                     with MMA the filters along the engine's n (8 or 16)
##              MMA    "none", or the matrix engine that computes the sums ("f16":
##                     mma.sync m16n8k16 on float16 or bfloat16, "tf32": m16n8k8 on
##                     float32 rounded to TF32; NVIDIA, compute capability 8.0 and up)
##              EMULATE  the engine emulated in OpenCL C (tests: PoCL, Oclgrind)
##              KP     with MMA: at most this many k (a channel block's taps, padded to
##                     the engine's k) per block
## Used by clnn/ops/conv.py's GPU path (the "local" rows) where M <= MB: as an implicit
## GEMM such a layer fills MB or fewer rows of a tile of 16 or more, and every unrolled
## element it loads is used M times, so the gathered loads bound it. Here a
## work-group loads its input patch once into local memory, where each element serves
## every tap that reads it (25 of a 5x5 filter), and writes whole rows of output.
<%include file="_common.cl"/>
<%namespace name="mma" file="_mma.cl"/>\
<%include file="_activation.cl" args="act=act"/>
#define MB ${MB}     // output channels per work-item (accumulators in registers)
#define TW ${TW}     // output columns per work-group, a work-item each
#define TH ${TH}     // output rows per work-group
#define LW ${LW}     // local elements for a channel block's weights (CB R S MB)
#define LP ${LP}     // local elements for a channel block's input patch (CB PT QT)
## the kernel's signature, the same in both variants
<%def name="entry()">\
void clnn_convt_forward(const int C, const int H, const int W, const int M, const int P,
                        const int Q, const int R, const int S, const int SH, const int SW,
                        const int PH, const int PW, const int CB, const int flip,
                        const acc_t act_p, const acc_t act_q, const int has_bias,
                        __global const real_t *x, const int x_off,
                        __global const real_t *w, const int w_off,
                        __global const real_t *b, const int b_off,
                        __global real_t *y, const int y_off)\
</%def>\
% if MMA == "none":
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
${entry()}
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
% else:
<%
    KI = 8 if MMA == "tf32" else 16    # k of one mma.sync
    NTL = MB // 8                      # its 8-wide n tiles: the filters
    # a row of k of the weights (words): 16 filters padded to 24, so that the lanes'
    # B fragments (g + 8 j, word t4 of their k) fall into 32 different banks
    WS = 8 if MB == 8 else 24
    xt = "float" if MMA == "tf32" else "ushort"
    assert MB in (8, 16) and TW == 16 and TH == 8 and KP % KI == 0
%>
<%include file="_mma.cl" args="MMA=MMA, EMULATE=EMULATE"/>
#define KP ${KP}     // at most this many k (a block's taps, padded to ${KI}) per block
//
// The same convolution as the kernel above (see there: flip, the patch, the blocks of
// channels), its sums on the matrix engine: an implicit GEMM per work-group whose rows
// are the tile's output positions, columns the filters and k a channel block's taps
// (c, r, s). Warp w (work-items 32 w to 32 w + 31) owns the tile's rows 2 w and
// 2 w + 1, each a 16-row fragment (row i: column q0 + i); each k step of ${KI} multiplies
// them by ${NTL} fragment(s) of 8 filters. A fragment's element (i, k) is the patch's
// element at the row's offset plus ko[k], the tap's offset in the patch; the filters
// wait in local memory as the engine's B fragments take them. The block's k is padded
// to whole steps with zero weights and zero patch elements (masked: a padded k reads no
// element of x, so an inf there cannot become NaN).
__kernel __attribute__((reqd_work_group_size(TW, TH, 1)))
${entry()}
{
    __local ${xt} xl[LP];
% if MMA == "tf32":
    __local float wl[KP * ${WS}];        // B(k, n) at k ${WS} + n, rounded to TF32
% else:
    // B(k, n) as half k % 2 (the low half for even k) of word k / 2 ${WS} + n: a B
    // fragment register is one word
    __local uint wl[KP / 2 * ${WS}];
    __local ushort *wh = (__local ushort *)wl;
    __global const ushort *xs = (__global const ushort *)x;
    __global const ushort *ws = (__global const ushort *)w;
% endif
    __local int ko[KP];                  // tap k's offset in the patch: (c PT + r) QT + s
% if EMULATE:
    __local uint mma_exchange[${4 * 2 + 2 * NTL} * TW * TH];   // (_mma.cl's step)
% endif
    const int tx = (int)get_local_id(0), ty = (int)get_local_id(1);
    const int lid = ty * TW + tx;
    const int lane = lid % 32, wi = lid / 32, g = lane / 4, t4 = lane % 4;
    const int q0 = (int)get_group_id(0) * TW, p0 = (int)get_group_id(1) * TH;
    const int n = (int)get_group_id(2);
    const int PT = (TH - 1) * SH + R, QT = (TW - 1) * SW + S;     // the patch's extent
    const int h0 = p0 * SH - PH, w0 = q0 * SW - PW;               // its corner in x
    const int RS = R * S;
    // the patch offsets of the lane's fragment rows g and g + 8, in the warp's two rows
    const int r00 = 2 * wi * SH * QT + g * SW, r01 = r00 + 8 * SW;
    const int r10 = r00 + SH * QT, r11 = r10 + 8 * SW;
% for i in range(2):
%   for j in range(NTL):
    float ${", ".join(f"d{i}_{j}_{r} = 0.0f" for r in range(4))};
%   endfor
% endfor
    for (int c0 = 0; c0 < C; c0 += CB) {
        const int cb = min(CB, C - c0);
        const int kb = cb * RS, kend = (kb + ${KI - 1}) / ${KI} * ${KI};
        barrier(CLK_LOCAL_MEM_FENCE);             // the block before is read by all
        for (int c = 0; c < cb; ++c) {
            const int xc = x_off + ((n * C + c0 + c) * H) * W;
            for (int hh = ty; hh < PT; hh += TH) {
                const int h = h0 + hh;
                for (int vv = tx; vv < QT; vv += TW) {
                    const int v = w0 + vv;
                    const int in = h >= 0 && h < H && v >= 0 && v < W;
% if MMA == "tf32":
                    xl[(c * PT + hh) * QT + vv] = in ? clnn_tf32(CLNN_LOAD(x, xc + h * W + v)) : 0.0f;
% else:
                    xl[(c * PT + hh) * QT + vv] = in ? xs[xc + h * W + v] : (ushort)0;
% endif
                }
            }
            for (int j = lid; j < RS * MB; j += TW * TH) {
                const int m = j % MB, rs = j / MB, k = c * RS + rs;
                const int at = flip ? w_off + ((c0 + c) * M + m) * RS + (RS - 1 - rs) :
                                      w_off + (m * C + c0 + c) * RS + rs;
% if MMA == "tf32":
                wl[k * ${WS} + m] = m < M ? clnn_tf32(CLNN_LOAD(w, at)) : 0.0f;
% else:
                wh[2 * (k / 2 * ${WS} + m) + k % 2] = m < M ? ws[at] : (ushort)0;
% endif
            }
            for (int rs = lid; rs < RS; rs += TW * TH)
                ko[c * RS + rs] = (c * PT + rs / S) * QT + rs % S;
        }
        for (int j = kb * MB + lid; j < kend * MB; j += TW * TH) {   // the padding
            const int m = j % MB, k = j / MB;
% if MMA == "tf32":
            wl[k * ${WS} + m] = 0.0f;
% else:
            wh[2 * (k / 2 * ${WS} + m) + k % 2] = (ushort)0;
% endif
            if (m == 0)
                ko[k] = 0;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < kend; kk += ${KI}) {
% if MMA == "tf32":
            // A(row, k) for k = kk + t4 and kk + t4 + 4: registers 0..3 of fragment i
            // hold rows g, g + 8 at the first k, then the same at the second
            const int k0 = kk + t4, k1 = k0 + 4;
            const int o0 = ko[k0], o1 = ko[k1];
            const uint z0 = k0 < kb ? 0xffffffffu : 0u, z1 = k1 < kb ? 0xffffffffu : 0u;
%   for i in range(2):
            const uint a${i}_0 = as_uint(xl[r${i}0 + o0]) & z0, a${i}_1 = as_uint(xl[r${i}1 + o0]) & z0;
            const uint a${i}_2 = as_uint(xl[r${i}0 + o1]) & z1, a${i}_3 = as_uint(xl[r${i}1 + o1]) & z1;
%   endfor
%   for j in range(NTL):
            const uint b${j}_0 = as_uint(wl[k0 * ${WS} + ${8 * j} + g]);
            const uint b${j}_1 = as_uint(wl[k1 * ${WS} + ${8 * j} + g]);
%   endfor
% else:
            // A(row, k) for the pairs k = kk + 2 t4 + {0, 1} and the same + 8 (the
            // lower k in the low half): registers 0..3 of fragment i hold rows g, g + 8
            // at the first pair, then the same at the second
            const int k0 = kk + 2 * t4, k1 = k0 + 8;
            const int o0 = ko[k0], o1 = ko[k0 + 1], o2 = ko[k1], o3 = ko[k1 + 1];
            const uint z0 = (k0 < kb ? 0xffffu : 0u) | (k0 + 1 < kb ? 0xffff0000u : 0u);
            const uint z1 = (k1 < kb ? 0xffffu : 0u) | (k1 + 1 < kb ? 0xffff0000u : 0u);
%   for i in range(2):
            const uint a${i}_0 = ((uint)xl[r${i}0 + o0] | (uint)xl[r${i}0 + o1] << 16) & z0;
            const uint a${i}_1 = ((uint)xl[r${i}1 + o0] | (uint)xl[r${i}1 + o1] << 16) & z0;
            const uint a${i}_2 = ((uint)xl[r${i}0 + o2] | (uint)xl[r${i}0 + o3] << 16) & z1;
            const uint a${i}_3 = ((uint)xl[r${i}1 + o2] | (uint)xl[r${i}1 + o3] << 16) & z1;
%   endfor
%   for j in range(NTL):
            const uint b${j}_0 = wl[(kk / 2 + t4) * ${WS} + ${8 * j} + g];
            const uint b${j}_1 = wl[(kk / 2 + t4 + 4) * ${WS} + ${8 * j} + g];
%   endfor
% endif
${mma.step(2, NTL, "lid", "g", EMULATE)}\
        }
    }
    // lane (g, t4) holds fragment i's rows g (registers 0, 1) and g + 8 (2, 3), filters
    // 8 j + 2 t4 + {0, 1}: output row p0 + 2 w + i, columns q0 + g and q0 + g + 8
    __global real_t *yp = y + y_off + n * M * P * Q;
% for i in range(2):
    if (p0 + 2 * wi + ${i} < P) {
        const int p = p0 + 2 * wi + ${i};
%   for j in range(NTL):
%     for r in range(4):
        {
            const int m = ${8 * j} + 2 * t4 + ${r % 2}, q = q0 + g + ${8 * (r // 2)};
            if (m < M && q < Q) {
                const acc_t v = d${i}_${j}_${r} + (has_bias ? CLNN_LOAD(b, b_off + m) : (acc_t)0);
%       if act == "none":
                CLNN_STORE(v, yp, (m * P + p) * Q + q);
%       else:
                CLNN_STORE(clnn_f(v, act_p, act_q), yp, (m * P + p) * Q + q);
%       endif
            }
        }
%     endfor
%   endfor
    }
% endfor
}
% endif
