## conv.cl: convolution as an implicit GEMM whose unrolled operand is gathered straight
## into registers (the CPU path; GPUs use gemm.cl's tiled loaders).
## Parameters (template):
##   dtype        float32 | float64 | float16 (half storage, float arithmetic)
##   padded       the gathered input has zero padding: loads are bounds-checked
##   act          epilogue activation (a name from clnn.ACTIVATIONS) or "none"
##   bias         "none" or "col" (bias[col] added to every row: output channels)
##   tuning       MWI, NWI, VW (see clnn/tuning.py CONV_TABLE)
## Used by clnn/ops/conv.py for the forward pass, the data gradient at unit stride
## (a forward pass over dy with the filters flipped) and the weight gradient.
<%include file="_common.cl"/>
<%include file="_activation.cl" args="act=act"/>
<%
    t = dict(tuning)
    MWI, NWI, VW = t["MWI"], t["NWI"], t["VW"]
    NVW = NWI // VW
    vec = f"{acc}{VW}" if VW > 1 else acc
    comps = "0123456789abcdef"
%>
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
// three parts (a, b, c); the routine passes their sizes and steps:
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

// b_pk[(nb * K + k) * NWI + j] = src[col * CS + (k / KD) * KS + (flip ? KD - 1 - k % KD
// : k % KD)] for col = nb * NWI + j < cols, else 0:
//   forward  w (M, CRS):              CS = CRS, KD = CRS, KS = 0,   flip = 0
//   flipped  w (M, C, R, S) as (C, MRS) with the taps reversed (data gradient):
//                                     CS = RS,  KD = RS,  KS = CRS, flip = 1
//   dy (N, M, PQ) as (NPQ, M):        CS = PQ,  KD = PQ,  KS = MPQ, flip = 0
__kernel void clnn_conv_pack(const int K, const int cols, const int Nb,
                             __global const real_t *src, const int src_off, const int CS,
                             const int KD, const int KS, const int flip,
                             __global acc_t *b_pk)
{
    const int k = (int)get_global_id(0);
    const int nb = (int)get_global_id(1);
    if (k >= K || nb >= Nb)
        return;
    const int kr = k % KD;
    src += src_off + (k / KD) * KS + (flip ? KD - 1 - kr : kr);
    __global acc_t *dst = b_pk + (nb * K + k) * NWI;
    for (int j = 0; j < NWI; ++j) {
        const int col = nb * NWI + j;
        dst[j] = col < cols ? CLNN_LOAD(src, col * CS) : (acc_t)0;
    }
}

typedef ${vec} vec_t;

// One work-item: MWI consecutive rows x NWI columns of C in MWI * NWI / VW vector
// registers; work-items run along rows, work-groups share one B panel.
__kernel void clnn_conv_gather(const int rows, const int R2, const int R3,
                               const int RA, const int RBH, const int RCW,
                               const int K1, const int K2, const int K3,
                               const int KA, const int KBH, const int KCW,
                               __global const real_t *x, const int x_off,
                               const int H, const int W, const int ph, const int pw,
                               const int cols, __global const acc_t *b_pk,
                               __global real_t *out, const int out_off,
                               const int OA, const int OB, const int OC, const int OM,
                               const acc_t alpha, const acc_t beta, const acc_t act_p,
                               __global const real_t *bias, const int bias_off)
{
    const int rb = (int)get_global_id(0);
    const int nb = (int)get_global_id(1);
    const int row0 = rb * MWI;
    if (row0 >= rows)
        return;
    x += x_off;
    out += out_off;
    bias += bias_off;
    const int K = K1 * K2 * K3;
    __global const acc_t *bp = b_pk + nb * K * NWI;

    // Where each row's gathered elements start. Rows past the end repeat the last
    // row (their loads stay in bounds) and are not stored.
% for i in range(MWI):
    int base${i}, hrow${i}, wrow${i}, oidx${i};
    {
        const int row = min(row0 + ${i}, rows - 1);
        const int a = row / (R2 * R3), b = row / R3 % R2, c = row % R3;
        hrow${i} = b * RBH - ph;
        wrow${i} = c * RCW - pw;
        base${i} = a * RA + hrow${i} * W + wrow${i};
        oidx${i} = a * OA + b * OB + c * OC;
    }
% endfor

% for i in range(MWI):
    vec_t ${" ".join(f"c{i}_{v} = (vec_t)(0){',' if v < NVW - 1 else ';'}" for v in range(NVW))}
% endfor
    int k = 0;
    for (int k1 = 0; k1 < K1; ++k1) {
        for (int k2 = 0; k2 < K2; ++k2) {
            const int hk = k2 * KBH, off2 = k1 * KA + hk * W;
% if padded:
%   for i in range(MWI):
            const bool hv${i} = (uint)(hrow${i} + hk) < (uint)H;
%   endfor
% endif
            for (int k3 = 0; k3 < K3; ++k3, ++k) {
                const int wk = k3 * KCW, off = off2 + wk;
% for v in range(NVW):
                const vec_t b${v} = *(__global const vec_t *)(bp + k * NWI + ${v * VW});
% endfor
% for i in range(MWI):
                {
%   if padded:
                    // a padding position loads x[0] and is then replaced by zero:
                    // both are selects, no branch per element
                    const bool ok = hv${i} && (uint)(wrow${i} + wk) < (uint)W;
                    const acc_t v = CLNN_LOAD(x, ok ? base${i} + off : 0);
                    const vec_t a_pm = (vec_t)(ok ? v : (acc_t)0);
%   else:
                    const vec_t a_pm = (vec_t)(CLNN_LOAD(x, base${i} + off));
%   endif
%   for v in range(NVW):
                    c${i}_${v} += a_pm * b${v};
%   endfor
                }
% endfor
            }
        }
    }

    // C(row, col) is out[a * OA + b * OB + c * OC + col * OM]
    const int col0 = nb * NWI;
% for i in range(MWI):
    if (row0 + ${i} < rows) {
%   for v in range(NVW):
%     for j in range(VW):
        if (col0 + ${v * VW + j} < cols) {
            const int idx = oidx${i} + (col0 + ${v * VW + j}) * OM;
            acc_t r = alpha * c${i}_${v}${f".s{comps[j]}" if VW > 1 else ""};
            if (beta != (acc_t)0)
                r += beta * CLNN_LOAD(out, idx);
%       if bias == "col":
            r += CLNN_LOAD(bias, col0 + ${v * VW + j});
%       endif
%       if act != "none":
            r = clnn_f(r, act_p);
%       endif
            CLNN_STORE(r, out, idx);
        }
%     endfor
%   endfor
    }
% endfor
}
