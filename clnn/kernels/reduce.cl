## reduce.cl: deterministic reductions along one axis, without atomics or local memory.
## Parameters:  dtype  float32 | float64 | float16
##              map    "x" | "xy" (x*y, for dot) | "sq" (x*x, for nrm2)
##              op     "sum" | "max"
##              final  "none" | "scale" (times post) | "sqrt" (sqrt of times post)
##              inp    "real" (input is real_t) | "acc" (input is acc_t partial sums)
##              outp   "real" | "acc" (write acc_t partials for a second stage)
## Used by clnn/ops/reduce.py (sum, mean, max, dot, nrm2) and clnn/ops/bias.py (bias_grad).
<%include file="_common.cl"/>
<%
    in_t = "real_t" if inp == "real" else "acc_t"
    out_t = "real_t" if outp == "real" else "acc_t"
%>
//
// The input is viewed as (outer, R, inner) in C order and reduced along R:
//   out[o, g, i] = final(op over r in chunk g of map(x[o, r, i]))
// Chunk g covers r in [g * chunk_len, min(R, (g + 1) * chunk_len)). With chunks > 1 the
// routine reduces the (outer, chunks, inner) partials again in a second launch. Each
// output is summed by one work-item in a fixed order, so results are bitwise
// reproducible run after run, whatever the device schedules.
//
% if inp == "real":
#define CLNN_IN(p, i) CLNN_LOAD(p, i)
% else:
#define CLNN_IN(p, i) ((p)[i])
% endif
% if op == "sum":
#define CLNN_INIT ((acc_t)0)
#define CLNN_OP(acc, v) ((acc) + (v))
% elif op == "max":
#define CLNN_INIT ((acc_t)(-INFINITY))
// NaN wins, as in numpy: once acc is NaN, v > acc is false and acc stays NaN.
#define CLNN_OP(acc, v) (((v) > (acc) || isnan(v)) ? (v) : (acc))
% else:
<% raise ValueError("unknown op " + op) %>
% endif

__kernel void clnn_reduce(const int outer, const int R, const int inner,
                          const int chunks, const int chunk_len, const acc_t post,
                          __global const ${in_t} *x, const int x_off,
                          __global const ${in_t} *y, const int y_off,
                          __global ${out_t} *out, const int out_off)
{
    const int total = outer * chunks * inner;
    for (int w = (int)get_global_id(0); w < total; w += (int)get_global_size(0)) {
        const int i = w % inner;
        const int g = (w / inner) % chunks;
        const int o = w / (inner * chunks);
        const int r0 = g * chunk_len;
        const int r1 = min(R, r0 + chunk_len);
        acc_t acc = CLNN_INIT;
        for (int r = r0; r < r1; ++r) {
            const int k = (o * R + r) * inner + i;
% if map == "x":
            const acc_t v = CLNN_IN(x, x_off + k);
% elif map == "xy":
            const acc_t v = CLNN_IN(x, x_off + k) * CLNN_IN(y, y_off + k);
% elif map == "sq":
            const acc_t xv = CLNN_IN(x, x_off + k);
            const acc_t v = xv * xv;
% else:
<% raise ValueError("unknown map " + map) %>
% endif
            acc = CLNN_OP(acc, v);
        }
% if final == "scale":
        acc *= post;
% elif final == "sqrt":
        acc = sqrt(acc * post);
% endif
% if outp == "real":
        CLNN_STORE(acc, out, out_off + w);
% else:
        out[out_off + w] = acc;
% endif
    }
}
