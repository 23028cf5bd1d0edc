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
#define CLNN_FOR_EACH(i, n) for (int i = (int)get_global_id(0); i < (n); i += (int)get_global_size(0))
% if src == "float16":
// half is storage only: loaded to float (exact), with no cl_khr_fp16 needed
#define CLNN_SRC(p, i) vload_half((i), (p))
% else:
#define CLNN_SRC(p, i) ((p)[i])
% endif

__kernel void clnn_cast(const int n, __global const ${src_t} *x, const int x_off,
                        __global real_t *out, const int out_off)
{
    CLNN_FOR_EACH(i, n) {
% if dtype == "float16":
        // rounded once, to nearest, from the source's own precision
        CLNN_STORE(CLNN_SRC(x, x_off + i), out, out_off + i);
% else:
        out[out_off + i] = (real_t)CLNN_SRC(x, x_off + i);
% endif
    }
}
