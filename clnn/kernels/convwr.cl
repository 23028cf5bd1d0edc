## convwr.cl: the weight gradient on CPUs with a work-item's vectors along output rows
## ("pixel rows", as convpx.cl's forward pass), for layers with few filter rows C R
## (LeNet-5's C1, 3-channel input layers). Parameters:
##   x_acc        the input is an acc_t copy (16-bit storage, converted once)
##   tuning       MB, S, VW (clnn/ops/conv.py's _wgrad_rows picks them per shape)
## Kernel: clnn_conv_wgrad_rows. Used by clnn/ops/conv.py for weight gradients at unit
## column stride whose input has no padding left to check (the routine pads a copy).
<%include file="_common.cl"/>
<%
    t = dict(tuning)
    MB, S, VW = t["MB"], t["S"], t["VW"]
    if VW not in (4, 8, 16) or VW > 2 * cpu_lanes:
        raise ValueError(f"VW={VW}: 4, 8 or 16 {acc} lanes, at most 512 bits "
                         f"(programs.CPU_LANES)")
    # 512-bit vectors load and store as two halves of HVW lanes (as in convpx.cl)
    HVW = min(VW, cpu_lanes)
    X_T = "acc_t" if x_acc else "real_t"
    def vload(ptr, acc_copy):
        one = (lambda q: f"CLNN_ELEMS_LOAD{HVW}({acc}, ({q}))") if acc_copy else \
            (lambda q: f"CLNN_LOADV({HVW}, {q})")
        if HVW == VW:
            return one(ptr)
        return f"(({acc}{VW})({one(ptr)}, {one(ptr + f' + {HVW}')}))"
    itype = "long" if acc == "double" else "int"
    lanes = ", ".join(str(i) for i in range(VW))
    # the operand that stays in registers through a position block: the MB dy vectors
    # where MB <= S, else the S input vectors (the other is loaded as it is used)
    dy_first = MB <= S
%>
//
// ---- tuning parameters
#define MB ${MB}    // filters per work-item
#define S ${S}      // the filters' width: taps along a row
#define VW ${VW}    // output positions per vector
//
// dw[m, c, r, s] = sum over n, p, q of dy[n, m, p, q] x[n, c, p SH + r DH, q + s DW]
// (x: a copy whose zero border stands for the padding; taps read no further than
// its rows). A work-item owns the MB S sums of filters m0 .. m0 + MB - 1
// at input channel c and filter row r, over the output rows (n, p) of its slice g,
// each sum a vector of VW partial sums along q. Per output row it walks the row's
// positions a block of VW at a time (the last block starts at Q - VW, overlapping
// the one before, its first lanes masked off); each block's MB dy vectors and S
// input vectors (at q0 + s DW) are loads of consecutive elements, and their MB S products are vector multiply-adds:
// no packing, and every lane useful where the GEMM's tiles would hold 6 filters in
// vectors of 16. Rows outside [zlo, zhi) are the copy's zero border and
// are skipped. At the end each vector's lanes are added in a fixed order;
// with one slice (G == 1) the work-item writes alpha sum + beta dw itself, else its
// partial sums go to ws[g, (m, c, r, s)], which the routine adds in slice order.
// No atomics: the same bits every run. Arguments: units (C, R, panels of MB filters,
// slices G), dims (N, P, Q, M), steps (row stride SH, dilations DH and DW, output
// rows a slice), the input x and its descriptor xd (image, channel plane and row strides,
// offset), dy and yd (image, filter plane and row strides, offset), dw at dw_off.
__kernel void clnn_conv_wgrad_rows(const int4 units, const int4 dims, const int4 steps,
                                   __global const ${X_T} *x, const int4 xd,
                                   const int zlo, const int zhi,
                                   __global const real_t *dy, const int4 yd,
                                   __global acc_t *ws, __global real_t *dw,
                                   const int dw_off, const acc_t alpha, const acc_t beta)
{
    const int C = units.s0, R = units.s1, Mb = units.s2, G = units.s3;
    const int N = dims.s0, P = dims.s1, Q = dims.s2, M = dims.s3;
    const int SH = steps.s0, DH = steps.s1, DW = steps.s2, RPS = steps.s3;
    const int XN = xd.s0, XC = xd.s1, XW = xd.s2;
    const int YN = yd.s0, YM = yd.s1, YQ = yd.s2;
    int u = (int)get_global_id(0);
    const int r = u % R;
    u /= R;
    const int c = u % C;
    u /= C;
    const int mb = u % Mb, g = u / Mb;
    if (g >= G)
        return;
    const int m0 = mb * MB;
    const int t0 = g * RPS, t1 = min(N * P, t0 + RPS);
    // a last panel's filters past M read filter M - 1 again and are not stored
% for j in range(MB):
    const int ym${j} = min(m0 + ${j}, M - 1) * YM;
% endfor
% for j in range(MB):
    ${acc}${VW} ${", ".join(f"a{j}_{s} = (({acc}{VW})(0))" for s in range(S))};
% endfor
    const ${itype}${VW} lane = (${itype}${VW})(${lanes});
    const int nq = (Q + VW - 1) / VW;
    for (int t = t0; t < t1; ++t) {
        const int n = t / P, p = t - n * P;
        const int h = p * SH + r * DH;
        if (h < zlo || h >= zhi)
            continue;
        __global const ${X_T} *xrow = x + xd.s3 + n * XN + c * XC + h * XW;
        __global const real_t *yrow = dy + yd.s3 + n * YN + p * YQ;
        for (int qb = 0; qb < nq; ++qb) {
            // (the operator, not min(): PoCL links that built-in as a call, which
            // spilled every sum around it)
            const int q0 = qb * VW < Q - VW ? qb * VW : Q - VW;
            const ${itype}${VW} keep = lane >= (${itype}${VW})(qb * VW - q0);
% if dy_first:
%   for j in range(MB):
            const ${acc}${VW} d${j} = CLNN_SELECT((${acc}${VW})(0), ${vload(f"yrow + ym{j} + q0", False)}, keep);
%   endfor
%   for s in range(S):
            {
                const ${acc}${VW} xv = ${vload(f"xrow + q0 + {s} * DW", x_acc)};
%     for j in range(MB):
                a${j}_${s} += d${j} * xv;
%     endfor
            }
%   endfor
% else:
%   for s in range(S):
            const ${acc}${VW} x${s} = ${vload(f"xrow + q0 + {s} * DW", x_acc)};
%   endfor
%   for j in range(MB):
            {
                const ${acc}${VW} d = CLNN_SELECT((${acc}${VW})(0), ${vload(f"yrow + ym{j} + q0", False)}, keep);
%     for s in range(S):
                a${j}_${s} += d * x${s};
%     endfor
            }
%   endfor
% endif
        }
    }
    const int KW = M * C * R * S;
% for j in range(MB):
    if (m0 + ${j} < M) {
        const int o = ((m0 + ${j}) * C + c) * R * S + r * S;
%   for s in range(S):
        {
%     if VW > HVW:
            const acc_t v = clnn_lanes_sum${HVW}(a${j}_${s}.lo + a${j}_${s}.hi);
%     else:
            const acc_t v = clnn_lanes_sum${VW}(a${j}_${s});
%     endif
            if (G > 1)
                ws[g * KW + o + ${s}] = v;
            else if (beta == (acc_t)0)
                CLNN_STORE(alpha * v, dw, dw_off + o + ${s});
            else
                CLNN_STORE(alpha * v + beta * CLNN_LOAD(dw, dw_off + o + ${s}), dw,
                           dw_off + o + ${s});
        }
%   endfor
    }
% endfor
}
