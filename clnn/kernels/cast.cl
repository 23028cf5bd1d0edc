## cast.cl: an array converted to another floating type on the device.
## Parameters:  dtype  the destination's float32 | float64 | float16 | bfloat16
##              src    the source's float32 | float64 | float16 | bfloat16
##              mark   1: also mark a loss-scale state where any value is an inf or
##                     NaN (a mixed-precision step's 16-bit gradients cast to float32):
##                     optim.cl's CLNN_LS_MARK, set to 1 by whichever work-items meet
##                     one, the same value from every writer, so the mark is the same
##                     whatever their order
##                     2: mark so, and the last work-group to finish applies the
##                     loss-scale update from the mark (_lossscale.cl; clnn_loss_scale_
##                     update's work, without its launch)
## Used by clnn/ops/cast.py and clnn/ops/optim.py. Values are rounded once, to nearest
## even (half through vstore_half_rte, bfloat16 by clnn_f2bf, the others by C's
## conversion).
<%include file="_common.cl"/>
% if mark == 2:
<%include file="_lossscale.cl"/>
% endif
% if src == "float64" and dtype != "float64":
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif
<%
    src_t = {"float32": "float", "float64": "double", "float16": "half",
             "bfloat16": "ushort"}[src]
%>
% if src == "float16":
// half is storage only: loaded to float (exact), with no cl_khr_fp16 needed
%   if dtype != "float16":
<%include file="_half.cl"/>
%   endif
#define CLNN_SRC(p, i) CLNN_HALF_LOAD(p, i)
% elif src == "bfloat16":
// bfloat16 is storage only: loaded to float (exact)
%   if dtype != "bfloat16":
<%include file="_bf16.cl"/>
%   endif
#define CLNN_SRC(p, i) CLNN_BF16_LOAD(p, i)
% else:
#define CLNN_SRC(p, i) ((p)[i])
% endif
% if dtype == "bfloat16" and src == "float64":

// double -> bfloat16 rounded once: to float rounding toward zero, with the last bit set
// where that dropped anything (round to odd), then to nearest even as every float is.
// A float keeps 16 bits more than bfloat16, so the odd bit stands for everything dropped
// and the second rounding sees ties only where the double had them (through float by
// nearest, 1 + 2^-8 + 2^-30 would round to 1: a tie after the first rounding).
inline float clnn_d2f_odd(const double d)
{
    const float f = convert_float_rtz(d);
    return as_float(as_uint(f) | (uint)((double)f != d && !isnan(d)));
}
% endif

<%
    # float32 <-> 16-bit on CPUs: 8 elements at a time through the same vector loads and
    # stores as every other CPU kernel of the 16-bit types (so the exactness test of
    # cast covers them too)
    vector = {src, dtype} in ({"float32", "float16"}, {"float32", "bfloat16"})
    loadv = {"float16": "CLNN_HALF_LOADV_AT", "bfloat16": "CLNN_BF16_LOADV_AT"}.get(src)
%>
<%
    # each value as loaded (float, or double from float64); with mark, checked
    v_t = "double" if src == "float64" else "float"
    check = "\n        bad |= isinf(v) || isnan(v);" if mark else ""
%>
__kernel void clnn_cast(const int n, __global const ${src_t} *x, const int x_off,
% if mark == 2:
                        __global real_t *out, const int out_off,
                        __global float *mark, const int mark_off,
                        __global int *count, const int count_off,
                        const float growth, const float backoff, const int interval)
% elif mark:
                        __global real_t *out, const int out_off,
                        __global float *mark, const int mark_off)
% else:
                        __global real_t *out, const int out_off)
% endif
{
% if mark:
    int bad = 0;            // an inf or NaN met by this work-item
% endif
% if vector:
#ifdef CLNN_CPU
%   if mark:
    // lane by lane, on the floats' exponents (isinf | isnan, or a horizontal any() a
    // vector, took PoCL about twice as long)
    int8 bad8 = (int8)0;
%   endif
    CLNN_FOR_EACH(v, n / 8) {
        const int i = v * 8;
%   if loadv:
        const float8 v8 = ${loadv}(__global, 8, x + x_off + i);
%   else:
        const float8 v8 = CLNN_ELEMS_LOAD8(float, x + x_off + i);
%   endif
%   if mark:
        bad8 |= (as_int8(v8) & 0x7f800000) == 0x7f800000;   // exponent all ones
%   endif
%   if loadv:
        CLNN_ELEMS_STORE8(float, v8, out + out_off + i);
%   else:
        CLNN_STOREV(8, v8, out + out_off + i);
%   endif
    }
%   if mark:
    bad = any(bad8);
%   endif
    for (int i = n / 8 * 8 + (int)get_global_id(0); i < n; i += (int)get_global_size(0)) {
        const float v = CLNN_SRC(x, x_off + i);${check}
        CLNN_STORE(v, out, out_off + i);
    }
#else
% endif
    CLNN_FOR_EACH(i, n) {
        const ${v_t} v = CLNN_SRC(x, x_off + i);${check}
% if dtype == "float16" and src == "float64":
        // rounded once, to nearest, from double (through float it would round twice)
        vstore_half_rte(v, out_off + i, out);
% elif dtype == "bfloat16" and src == "float64":
        CLNN_STORE(clnn_d2f_odd(v), out, out_off + i);
% elif storage_only:
        CLNN_STORE(v, out, out_off + i);
% else:
        out[out_off + i] = (real_t)v;
% endif
    }
% if vector:
#endif
% endif
% if mark:
    if (bad)        // 1.0f's bits, by an integer atomic (no floating-point atomics)
        atomic_xchg((volatile __global int *)(mark + mark_off), as_int(1.0f));
% endif
% if mark == 2:
    // The last work-group to finish applies the loss-scale update. Every work-item's
    // mark is in memory before its group's barrier, and each group counts itself
    // after it (an integer atomic), so the group that counts last sees every mark; it
    // reads and clears the mark and the count atomically, and alone writes the rest
    // of the state, which no other group reads. The result does not depend on which
    // group is last.
    barrier(CLK_GLOBAL_MEM_FENCE);
    if (get_local_id(0) == 0) {
        __global float *state = mark + mark_off - CLNN_LS_MARK;
        volatile __global int *done = (volatile __global int *)(state + CLNN_LS_DONE);
        mem_fence(CLK_GLOBAL_MEM_FENCE);
        if (atomic_inc(done) == (int)get_num_groups(0) - 1) {
            mem_fence(CLK_GLOBAL_MEM_FENCE);
            const int found = atomic_xchg((volatile __global int *)(mark + mark_off), 0);
            atomic_xchg(done, 0);
            clnn_loss_scale_apply(state, found != 0, count + count_off, growth, backoff,
                                  interval);
        }
    }
% endif
}
