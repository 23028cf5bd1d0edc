## cast.cl: an array converted to another floating type on the device.
## Parameters:  dtype  the destination's float32 | float64 | float16
##              src    the source's float32 | float64 | float16
## Used by clnn/ops/cast.py. Values are rounded once, to nearest (half through
## vstore_half_rte, the others by C's conversion, which rounds to nearest even).
<%include file="_common.cl"/>
% if src == "float64" and dtype != "float64":
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif
<%
    src_t = {"float32": "float", "float64": "double", "float16": "half"}[src]
%>
% if src == "float16":
// half is storage only: loaded to float (exact), with no cl_khr_fp16 needed
%   if dtype != "float16":
<%include file="_half.cl"/>
%   endif
#define CLNN_SRC(p, i) CLNN_HALF_LOAD(p, i)
% else:
#define CLNN_SRC(p, i) ((p)[i])
% endif

__kernel void clnn_cast(const int n, __global const ${src_t} *x, const int x_off,
                        __global real_t *out, const int out_off)
{
    CLNN_FOR_EACH(i, n) {
% if dtype == "float16" and src == "float64":
        // rounded once, to nearest, from double (through float it would round twice)
        vstore_half_rte(CLNN_SRC(x, x_off + i), out_off + i, out);
% elif dtype == "float16":
        CLNN_STORE(CLNN_SRC(x, x_off + i), out, out_off + i);
% else:
        out[out_off + i] = (real_t)CLNN_SRC(x, x_off + i);
% endif
    }
}
