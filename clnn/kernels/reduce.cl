## reduce.cl: deterministic reductions along one axis, without atomics.
## Parameters:  dtype  float32 | float64 | float16 | bfloat16
##              map    "x" | "xy" (x*y, for dot) | "sq" (x*x, for nrm2)
##                     | "xv" (x[o, r, i] * v[r], for gemv)
##                     | "dact" (GPU form only: x * f'(y) for activation ACT, its
##                       derivative from SRC, y's "a" or "z"; each value also stored
##                       to z, as rounded there, and summed so: an activation's
##                       backward pass and its bias gradient in one pass)
##              act, src  (map "dact") the activation and where its derivative is taken
##              op     "sum" | "max"
##              final  "none" | "scale" (times post) | "sqrt" (sqrt of times post)
##                     | "axpby" (post * result + beta * out, for gemv)
##              inp    "real" (input is real_t) | "acc" (input is acc_t partial sums)
##              outp   "real" | "acc" (write acc_t partials for a second stage)
##              wg     0: clnn_reduce, a work-item per output (CPUs)
##                     (LX, LY): clnn_reduce_wg, a work-group of LX x LY per LX outputs (GPUs)
##              lanes  (clnn_reduce) 1, or 8 for rows that are contiguous (rs == 1,
##                     inner == 1): 8 partial results side by side, which a CPU runs as
##                     vector operations; 32: four vectors of 8, so four additions
##                     are in flight at once (float32; other types render the 8-lane
##                     form: their vectors of 8 are 16-bit conversions or double8)
##              span   (clnn_reduce) 1, or 8: a work-item reduces 8 neighbouring
##                     outputs along inner (columns: 8 contiguous loads per r)
##              stream (clnn_reduce) a work-item per chunk of rows, adding whole rows
##                     into partial results (long columns on CPUs)
## Used by clnn/ops/reduce.py (sum, mean, max, dot, nrm2), clnn/ops/bias.py (bias_grad)
## and, on GPUs, clnn/ops/gemm.py (gemv).
<%include file="_common.cl"/>
<%
    if map == "dact" and (not wg or inp != "real"):
        raise ValueError("map dact: the GPU form (wg) over real_t inputs only")
    in_t = "real_t" if inp == "real" else "acc_t"
    out_t = "real_t" if outp == "real" else "acc_t"
%>
//
// The input is viewed as (outer, R, inner), element (o, r, i) at o * os + r * rs + i
// (os = R * inner, rs = inner for a contiguous array; a matrix with a row stride
// gives other values), and reduced along R:
//   out[o, g, i] = final(op over r in chunk g of map(x[o, r, i]))
// Chunk g covers r in [g * chunk_len, min(R, (g + 1) * chunk_len)). With chunks > 1 the
// routine reduces the (outer, chunks, inner) partials again in a second launch. Each
// output is summed in a fixed order, so results are bitwise reproducible run after
// run, whatever the device schedules.
//
<%
    V = f"{acc}8"
    # 16-bit storage: the row and column forms load 8 halves (bfloat16s) as a vector
    # and convert them at once (a row of 5000 halves 2x faster); other types keep
    # arrays of 8 scalars, which PoCL vectorises better by itself (a float32 row 1.6x
    # faster so)
    vec_in = storage_only and inp == "real"
    # float32's 32-lane row form: four float8 vectors of the input's own elements
    rows32 = lanes == 32 and dtype == "float32"
    vec_loads = vec_in or rows32
    # counting infs and NaNs of 16-bit storage reads the bits: every exponent bit set
    bad_bits = map == "bad" and vec_in
%>
% if inp == "real":
#define CLNN_IN(p, i) CLNN_LOAD(p, i)
% else:
#define CLNN_IN(p, i) ((p)[i])
% endif
% if vec_loads:
// 8 elements from p[i] as a vector (16-bit storage: converted at once)
#define CLNN_INV(p, i) CLNN_LOADV(8, (p) + (i))
% endif
// CLNN_OP on scalars; CLNN_OPV on vectors (the CPU forms below: 8 values at a time)
% if op == "sum":
#define CLNN_INIT ((acc_t)0)
#define CLNN_OP(acc, v) ((acc) + (v))
#define CLNN_OPV(acc, v) ((acc) + (v))
% elif op == "max":
#define CLNN_INIT ((acc_t)(-INFINITY))
// NaN wins, as in numpy: once acc is NaN, v > acc is false and acc stays NaN.
// (v != v is isnan(v) in a form compilers vectorise)
#define CLNN_OP(acc, v) (((v) > (acc) || (v) != (v)) ? (v) : (acc))
#define CLNN_OPV(acc, v) CLNN_SELECT((acc), (v), ((v) > (acc)) | ((v) != (v)))
% else:
<% raise ValueError("unknown op " + op) %>
% endif
<%def name="mapped(k, r)">\
% if map == "x":
CLNN_IN(x, x_off + ${k})\
% elif map == "xy":
CLNN_IN(x, x_off + ${k}) * CLNN_IN(y, y_off + ${k})\
% elif map == "sq":
clnn_sq(CLNN_IN(x, x_off + ${k}))\
% elif map == "xv":
CLNN_IN(x, x_off + ${k}) * CLNN_IN(y, y_off + ${r})\
% elif bad_bits:
clnn_bad_bits(x, x_off + ${k})\
% elif map == "bad":
clnn_bad(CLNN_IN(x, x_off + ${k}))\
% else:
<% raise ValueError("unknown map " + map) %>
% endif
</%def>
## mapped_v: map of the 8 elements from k; with along_r they are 8 steps of r from r
## (contiguous rows), else 8 neighbouring outputs at the same r
<%def name="mapped_v(k, r, along_r)">\
% if map == "x":
CLNN_INV(x, x_off + ${k})\
% elif map == "xy":
CLNN_INV(x, x_off + ${k}) * CLNN_INV(y, y_off + ${k})\
% elif map == "sq":
clnn_sq8(CLNN_INV(x, x_off + ${k}))\
% elif map == "xv" and along_r:
CLNN_INV(x, x_off + ${k}) * CLNN_INV(y, y_off + ${r})\
% elif map == "xv":
CLNN_INV(x, x_off + ${k}) * CLNN_IN(y, y_off + ${r})\
% elif bad_bits:
clnn_bad_bits8(x, x_off + ${k})\
% elif map == "bad":
clnn_bad8(CLNN_INV(x, x_off + ${k}))\
% endif
</%def>
<%def name="finish(acc, w)">
% if final == "scale":
        ${acc} *= post;
% elif final == "sqrt":
        ${acc} = sqrt(${acc} * post);
% elif final == "axpby":
        ${acc} *= post;
        if (beta != (acc_t)0)
            ${acc} += beta * CLNN_LOAD(out, out_off + ${w});
% endif
% if outp == "real":
        CLNN_STORE(${acc}, out, out_off + ${w});
% else:
        out[out_off + ${w}] = ${acc};
% endif
</%def>
% if map == "dact":
<%include file="_activation.cl" args="act=act, derivative_from=src"/>
% endif
% if map == "sq":
inline acc_t clnn_sq(const acc_t v) { return v * v; }
%   if vec_loads:
inline ${V} clnn_sq8(const ${V} v) { return v * v; }
%   endif
% elif bad_bits:
// 1 for an inf or a NaN, else 0: a 16-bit element's exponent bits all set, read on
// its bits without converting it (a float16 count took twice a float32 one's time
// on PoCL when it converted first)
#define CLNN_EXP_BITS ${"0x7c00" if dtype == "float16" else "0x7f80"}
inline acc_t clnn_bad_bits(__global const real_t *p, const int i)
{
    return (acc_t)((((__global const ushort *)p)[i] & CLNN_EXP_BITS) == CLNN_EXP_BITS);
}
inline ${V} clnn_bad_bits8(__global const real_t *p, const int i)
{
    const ushort8 e = CLNN_ELEMS_LOAD8(ushort, (__global const ushort *)p + i)
                      & (ushort8)CLNN_EXP_BITS;
    return -convert_${V}(e == (ushort8)CLNN_EXP_BITS);    // (true is -1 in a vector)
}
% elif map == "bad":
// 1 for an inf or a NaN, else 0: v - v is 0 for a finite v and NaN otherwise, what
// isfinite says in a form PoCL vectorises (its isfinite made a count 4-5x slower
// than a sum of the same array)
inline acc_t clnn_bad(const acc_t v) { return (acc_t)(v - v != (acc_t)0); }
%   if vec_loads:
inline ${V} clnn_bad8(const ${V} v) { return (${V})1 + convert_${V}(v - v == (${V})0); }
%   endif
% endif

% if not wg:
__kernel void clnn_reduce(const int outer, const int R, const int inner, const int os,
                          const int rs, const int chunks, const int chunk_len,
                          const acc_t post, const acc_t beta,
                          __global const ${in_t} *x, const int x_off,
                          __global const ${in_t} *y, const int y_off,
                          __global ${out_t} *out, const int out_off)
{
% if stream:
<% assert outp == "acc" and final == "none", "the streaming form writes partial results" %>
    // columns on a CPU, in chunks of rows: work-item (o, g) adds the rows of its chunk
    // into the partial results out[(o * chunks + g) * inner + i] for every i, a row at a
    // time, so its reads stream through memory as numpy's do (a work-item walking down
    // a column touches a new cache line, and soon a new page, at every step); each
    // output still folds r0, r0 + 1, ... in order, and a second launch the chunks
    const int total = outer * chunks;
    for (int w = (int)get_global_id(0); w < total; w += (int)get_global_size(0)) {
        const int g = w % chunks, o = w / chunks;
        const int r0 = g * chunk_len, r1 = min(R, r0 + chunk_len);
        __global acc_t *acc = out + out_off + w * inner;
        for (int i = 0; i < inner; ++i)
            acc[i] = CLNN_INIT;
        for (int r = r0; r < r1; ++r) {
            const int k0 = o * os + r * rs;
            for (int i = 0; i < inner; ++i) {
                const acc_t v = ${mapped("k0 + i", "r")};
                acc[i] = CLNN_OP(acc[i], v);
            }
        }
    }
% elif span > 1:
    // ${span} neighbouring outputs (columns) per work-item: each step along r loads
    // ${span} contiguous elements, one per output, and each output is still folded in
    // the order r0, r0 + 1, ... (the same bits as one work-item per output)
    const int ni = (inner + ${span - 1}) / ${span};
    const int total = outer * chunks * ni;
    for (int w = (int)get_global_id(0); w < total; w += (int)get_global_size(0)) {
        const int i0 = w % ni * ${span};
        const int g = (w / ni) % chunks;
        const int o = w / (ni * chunks);
        const int r0 = g * chunk_len;
        const int r1 = min(R, r0 + chunk_len);
        if (i0 + ${span} <= inner) {
<% assert span == 8, "the column form works on 8 outputs" %>
%   if vec_in:
            ${V} pv = (${V})(CLNN_INIT);
            for (int r = r0; r < r1; ++r) {
                const int k0 = o * os + r * rs + i0;
                pv = CLNN_OPV(pv, ${mapped_v("k0", "r", False)});
            }
%     for j in range(span):
            {
                acc_t acc = pv.s${j};
                const int wo = (o * chunks + g) * inner + i0 + ${j};
${finish("acc", "wo")}
            }
%     endfor
%   else:
            acc_t part[8];
#pragma unroll
            for (int j = 0; j < 8; ++j)
                part[j] = CLNN_INIT;
            for (int r = r0; r < r1; ++r) {
                const int k0 = o * os + r * rs + i0;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const acc_t v = ${mapped("k0 + j", "r")};
                    part[j] = CLNN_OP(part[j], v);
                }
            }
            for (int j = 0; j < 8; ++j) {
                acc_t acc = part[j];
                const int wo = (o * chunks + g) * inner + i0 + j;
${finish("acc", "wo")}
            }
%   endif
        } else {
            for (int i = i0; i < inner; ++i) {          // the last, partial span
                acc_t acc = CLNN_INIT;
                for (int r = r0; r < r1; ++r) {
                    const int k = o * os + r * rs + i;
                    const acc_t v = ${mapped("k", "r")};
                    acc = CLNN_OP(acc, v);
                }
                const int wo = (o * chunks + g) * inner + i;
${finish("acc", "wo")}
            }
        }
    }
% else:
    const int total = outer * chunks * inner;
    for (int w = (int)get_global_id(0); w < total; w += (int)get_global_size(0)) {
%   if lanes == 1:
        const int i = w % inner;
%   endif
        const int g = (w / inner) % chunks;
        const int o = w / (inner * chunks);
        const int r0 = g * chunk_len;
        const int r1 = min(R, r0 + chunk_len);
        acc_t acc = CLNN_INIT;
% if lanes > 1:
        // a contiguous row (the routine launches this form only for rs == 1 and
        // inner == 1): element r0 + L t + j goes to partial result j, so the L
        // chains are independent (one vector instruction each step, where a single
        // chain waits for every addition), and they meet in a fixed tree: the order
        // is the same on every run
<% assert lanes in (8, 32), "the row form keeps 8 or 32 partial results" %>
        int r = r0;
%   if rows32:
        // four vectors of 8: element r0 + 32 t + 8 q + j goes to lane j of vector q,
        // then the vectors meet (q0 + q1) + (q2 + q3), the rest of the row's whole 8s
        // go to that vector, and its lanes meet as the 8-lane form's do
        ${V} q0 = (${V})(CLNN_INIT), q1 = q0, q2 = q0, q3 = q0;
%     if op == "max":
        // max: the loop keeps the larger value, one instruction a vector, and each
        // lane's NaNs apart in a mask; after it a lane that saw a NaN is NaN, and NaN
        // wins from there as everywhere (the select of CLNN_OPV, a NaN test and an
        // "or" besides, was a quarter slower on 256 MB: 26.5 GB/s against 34)
        int8 n0 = (int8)0, n1 = n0, n2 = n0, n3 = n0;
%     endif
        for (; r + 32 <= r1; r += 32) {
            const int k0 = o * os + r;
%     for q, d in ((0, 0), (1, 8), (2, 16), (3, 24)):
<%      kq, rq = ("k0", "r") if d == 0 else (f"k0 + {d}", f"r + {d}") %>\
%       if op == "max":
            {
                const ${V} v = ${mapped_v(kq, rq, True)};
                q${q} = v > q${q} ? v : q${q};
                n${q} |= v != v;
            }
%       else:
            q${q} = CLNN_OPV(q${q}, ${mapped_v(kq, rq, True)});
%       endif
%     endfor
        }
%     if op == "max":
        q0 = CLNN_SELECT(q0, (${V})NAN, n0);
        q1 = CLNN_SELECT(q1, (${V})NAN, n1);
        q2 = CLNN_SELECT(q2, (${V})NAN, n2);
        q3 = CLNN_SELECT(q3, (${V})NAN, n3);
%     endif
        ${V} pv = CLNN_OPV(CLNN_OPV(q0, q1), CLNN_OPV(q2, q3));
        for (; r + 8 <= r1; r += 8) {
            const int k0 = o * os + r;
            pv = CLNN_OPV(pv, ${mapped_v("k0", "r", True)});
        }
        const ${acc}4 p4 = CLNN_OPV(pv.lo, pv.hi);
        const ${acc}2 p2 = CLNN_OPV(p4.lo, p4.hi);
        acc = CLNN_OP(p2.x, p2.y);
%   elif vec_in:
        ${V} pv = (${V})(CLNN_INIT);
        for (; r + 8 <= r1; r += 8) {
            const int k0 = o * os + r;
            pv = CLNN_OPV(pv, ${mapped_v("k0", "r", True)});
        }
        // the lanes meet in halves: (j, j + 4), then (j, j + 2), then (0, 1)
        const ${acc}4 p4 = CLNN_OPV(pv.lo, pv.hi);
        const ${acc}2 p2 = CLNN_OPV(p4.lo, p4.hi);
        acc = CLNN_OP(p2.x, p2.y);
%   else:
        acc_t part[8];
#pragma unroll
        for (int j = 0; j < 8; ++j)
            part[j] = CLNN_INIT;
        for (; r + 8 <= r1; r += 8) {
            const int k0 = o * os + r;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const acc_t v = ${mapped("k0 + j", "r + j")};
                part[j] = CLNN_OP(part[j], v);
            }
        }
        // the lanes meet in halves: (j, j + 4), then (j, j + 2), then (0, 1), the
        // order of the vector form
%     for s in (4, 2, 1):
#pragma unroll
        for (int j = 0; j < ${s}; ++j)
            part[j] = CLNN_OP(part[j], part[j + ${s}]);
%     endfor
        acc = part[0];
%   endif
        for (; r < r1; ++r) {
            const int k = o * os + r;
            const acc_t v = ${mapped("k", "r")};
            acc = CLNN_OP(acc, v);
        }
% else:
        for (int r = r0; r < r1; ++r) {
            const int k = o * os + r * rs + i;
            const acc_t v = ${mapped("k", "r")};
            acc = CLNN_OP(acc, v);
        }
% endif
${finish("acc", "w")}
    }
% endif
}
% else:
<% LX, LY = wg %>
// The GPU form: a work-group of ${LX} x ${LY} work-items reduces one chunk of ${LX}
// neighbouring outputs (LX = 1 for rows, which are contiguous; LX > 1 for columns, so
// neighbouring work-items read neighbouring addresses). Work-item (lx, ly) folds
// r = r0 + ly, r0 + ly + LY, ... in order, then the LY partial results of a column meet
// in a tree in local memory, always in the same pairs: the result does not depend on
// how the device schedules the work-items, so it is bitwise the same on every run.
__kernel __attribute__((reqd_work_group_size(${LX}, ${LY}, 1)))
void clnn_reduce_wg(const int outer, const int R, const int inner, const int os,
                    const int rs, const int chunks, const int chunk_len,
                    const acc_t post, const acc_t beta,
                    __global const ${in_t} *x, const int x_off,
                    __global const ${in_t} *y, const int y_off,
                    __global ${out_t} *out, const int out_off${"," if map == "dact" else ")"}
% if map == "dact":
                    const acc_t p, const acc_t q, __global real_t *z, const int z_off)
% endif
{
    __local acc_t part[${LY}][${LX}];
    const int lx = (int)get_local_id(0), ly = (int)get_local_id(1);
    const int i = (int)get_group_id(0) * ${LX} + lx;
    const int g = (int)get_group_id(1) % chunks, o = (int)get_group_id(1) / chunks;
    const int r0 = g * chunk_len, r1 = min(R, r0 + chunk_len);
    acc_t acc = CLNN_INIT;
    if (i < inner) {
        for (int r = r0 + ly; r < r1; r += ${LY}) {
            const int k = o * os + r * rs + i;
% if map == "dact":
            // x * f'(y) stored to z (x itself where the pass runs in place: each
            // element is read and written by this work-item alone), and summed as
            // stored, rounded to the storage type: what a sum of z would read
            CLNN_STORE(CLNN_IN(x, x_off + k) * clnn_df(CLNN_IN(y, y_off + k), p, q), z,
                       z_off + k);
            const acc_t v = CLNN_LOAD(z, z_off + k);
% else:
            const acc_t v = ${mapped("k", "r")};
% endif
            acc = CLNN_OP(acc, v);
        }
    }
    part[ly][lx] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
% for s in [LY >> (j + 1) for j in range(LY.bit_length() - 1)]:
    if (ly < ${s})
        part[ly][lx] = CLNN_OP(part[ly][lx], part[ly + ${s}][lx]);
    barrier(CLK_LOCAL_MEM_FENCE);
% endfor
    if (ly == 0 && i < inner) {
        acc = part[0][lx];
        const int w = (o * chunks + g) * inner + i;
${finish("acc", "w")}
    }
}
% endif
