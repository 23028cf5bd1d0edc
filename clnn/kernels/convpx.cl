## convpx.cl: the convolution's forward pass on CPUs with a work-item's vectors along an
## output row ("pixel rows"), where conv.cl's gathered kernel has them across output
## channels. Parameters:
##   x_acc        the input is an acc_t copy (16-bit storage, converted once)
##   act          epilogue activation (a name from clnn.ACTIVATIONS) or "none"
##   bias         "none" or "row" (bias[m] added to output channel m)
##   tuning       QV, MB, VW (clnn/ops/conv.py picks them per shape)
## Kernels: clnn_conv_pack (_convpack.cl: the filters in panels of MB channels and the
## k offset table) and clnn_conv_pixels. Used by clnn/ops/conv.py for forward passes
## whose output rows are contiguous and whose input is read at unit column stride with
## no padding left to check: the forward pass (any row stride, dilation) and the data
## gradient's flipped pass over padded dy (and, when a parameter set forces it, the
## weight gradient, whose rows are filter taps along lines of S).
<%include file="_common.cl"/>
<%
    t = dict(tuning)
    QV, MB, VW = t["QV"], t["MB"], t["VW"]
    QW = QV * VW
    if bias not in ("none", "row"):
        raise ValueError(f"the pixel-row convolution adds a bias per output channel (row), "
                         f"not {bias!r}")
    if VW not in (2, 4, 8, 16) or VW > 2 * cpu_lanes:
        raise ValueError(f"VW={VW}: 2, 4, 8 or 16 {acc} lanes, at most 512 bits "
                         f"(programs.CPU_LANES)")
    # 512-bit vectors (where the device's code has them: the routine checks) stay in
    # registers: they load and store as two halves of 256 bits, HVW lanes
    HVW = min(VW, cpu_lanes)
    halves = [(0, "")] if HVW == VW else [(0, ".lo"), (HVW, ".hi")]
    def xload(ptr):
        one = (lambda q: f"CLNN_ELEMS_LOAD{HVW}({acc}, ({q}))") if x_acc else \
            (lambda q: f"CLNN_LOADV({HVW}, {q})")
        if HVW == VW:
            return one(ptr)
        return f"(({acc}{VW})({one(ptr)}, {one(ptr + f' + {HVW}')}))"
%>
## the fused epilogue on vectors of HVW output positions of one channel
<%include file="_epilogue.cl" args="act=act, bias=bias, width=HVW, vector_act=True"/>
//
// ---- tuning parameters
#define QV ${QV}    // vectors of output positions per work-item
#define VW ${VW}    // positions per vector
#define QW ${QW}    // consecutive positions of one output row per work-item
#define NWI ${MB}   // output channels per work-item (and per packed filter panel)
//
<%include file="_convpack.cl"/>

// y (M x NPQ) = w (M x CRS) @ unroll(x) (CRS x NPQ), computed as conv.cl's gathered
// kernel does (the same row, k and output descriptors: see there), with the roles of
// the operands' registers swapped. A work-item owns QW consecutive positions (q0 ..
// q0 + QW - 1) of one output row (a, b) and NWI output channels, in NWI * QV vectors.
// Per k (c, r, s) the QW input elements the positions read are consecutive (unit
// column stride, no padding to check: the routine pads a copy), so they are QV vector
// loads, and the NWI filter values are broadcast from a packed panel. Its gain is the
// store: channel m's QW outputs are consecutive in y, so they leave as QV vectors,
// where the gathered kernel's registers hold a position's channels, P Q elements apart
// in y (on a 3-channel 32x32 input layer that store took most of the time). A row
// shorter than QW is not for this kernel; the last block of a longer one starts at
// Q - QW, overlapping the one before, and stores only the positions that one did not.

__kernel void clnn_conv_pixels(const int4 row_split, const int4 row_steps,
                               const int4 k_split, const int4 k_steps,
                               __global const ${'acc_t' if x_acc else 'real_t'} *x,
                               const int x_off, const int W, const int zlo, const int zhi,
                               const int cols, __global const acc_t *b_pk,
                               __global const int *koff, __global real_t *out,
                               const int out_off, const int4 out_steps, const acc_t alpha,
                               const acc_t beta, const acc_t act_p, const acc_t act_q,
                               __global const real_t *bias, const int bias_off)
{
    const int R2 = row_split.s1, Q = row_split.s2, lines = row_split.s0 * R2;
    const int RA = row_steps.s0, RBH = row_steps.s1;
    const int K1 = k_split.s0, K2 = k_split.s1, K3 = k_split.s2, K = K1 * K2 * K3;
    const int KBH = k_steps.s1;
    const int OA = out_steps.s0, OB = out_steps.s1, OM = out_steps.s3;
    const int Qb = (Q + QW - 1) / QW;
    // consecutive work-items take the channel panels of one block of positions, which
    // then reads its input rows from the cache
    const int Nb = (cols + NWI - 1) / NWI;
    const int rb = (int)get_global_id(0) / Nb, nb = (int)get_global_id(0) % Nb;
    if (rb >= lines * Qb)
        return;
    const int ln = rb / Qb, qb = rb % Qb;
    const int a = ln / R2, b = ln % R2, q0 = min(qb * QW, Q - QW);
    const int first = qb * QW - q0;       // positions below this were stored by qb - 1
    const int hrow = b * RBH;
    __global const ${'acc_t' if x_acc else 'real_t'} *xrow = x + x_off + a * RA + hrow * W + q0;
    __global const acc_t *bp = b_pk + nb * K * NWI;
    bias += bias_off;
% for j in range(MB):
    ${acc}${VW} ${", ".join(f"c{j}_{v} = (({acc}{VW})(0))" for v in range(QV))};
% endfor
    // input rows outside [zlo, zhi) are a padded copy's zero border: the k2 that read
    // only those are skipped (the data gradient's flipped pass)
    const int k2lo = KBH > 0 ? max(0, (zlo - hrow + KBH - 1) / KBH) : 0;
    const int k2hi = KBH > 0 ? min(K2, (zhi - hrow + KBH - 1) / KBH) : K2;
    for (int k1 = 0; k1 < K1; ++k1) {
        const int kend = (k1 * K2 + k2hi) * K3;
        for (int k = (k1 * K2 + k2lo) * K3; k < kend; ++k) {
            __global const ${'acc_t' if x_acc else 'real_t'} *xk = xrow + koff[k];
% for v in range(QV):
            const ${acc}${VW} x${v} = ${xload(f"xk + {v * VW}")};
% endfor
            __global const acc_t *wk = bp + k * NWI;
% for j in range(MB):
            {
                const ${acc}${VW} w_pm = (${acc}${VW})(wk[${j}]);
%   for v in range(QV):
                c${j}_${v} += w_pm * x${v};
%   endfor
            }
% endfor
        }
    }
    // channel m's positions are consecutive in y: whole vectors, except in a last
    // block the positions an earlier block stored
    const int orow = out_off + a * OA + b * OB + q0;
% for j in range(MB):
    if (nb * NWI + ${j} < cols) {
        const int m = nb * NWI + ${j};
%   for v in range(QV):
%     for h, half in halves:
        if (first <= ${v * VW + h})
            clnn_epilogue_v(out, orow + m * OM + ${v * VW + h}, 1, m, 0, ${HVW},
                            c${j}_${v}${half}, alpha, beta, act_p, act_q, bias);
%       if storage_only or act in math_acts:
        // (16-bit: converted as one vector; tanh and the like: computed as one vector,
        // where lane by lane each lane was a call on PoCL)
        else if (first < ${v * VW + h + HVW})
            clnn_epilogue_lanes(out, orow + m * OM + ${v * VW + h}, 1, m, 0,
                                first - ${v * VW + h}, ${HVW}, c${j}_${v}${half}, alpha,
                                beta, act_p, act_q, bias);
%       else:
        else {
%         for l in range(h, h + HVW):
            if (first <= ${v * VW + l})
                clnn_epilogue(out, orow + m * OM + ${v * VW + l}, m, 0,
                              c${j}_${v}.s${"0123456789abcdef"[l]}, alpha, beta, act_p,
                              act_q, bias);
%         endfor
        }
%       endif
%     endfor
%   endfor
    }
% endfor
}
