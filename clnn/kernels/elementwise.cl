## elementwise.cl: one template for every element-wise op in clnn.
## Parameters:  dtype  float32 | float64 | float16 | bfloat16
##              op     "act"    activation forward / derivative / backward for ACT
##                     "linalg" hadamard, axpy, scale, fill, bias_add
##              act    (op "act") identity sigmoid tanh relu leaky_relu elu softplus
##              src    (op "act") "z": derivatives from the pre-activation z,
##                                "a": from the output a = f(z) (cheaper for most)
##              inplace  "" or the input argument that out is (same buffer, offset)
##              unroll   1, or the elements each work-item loads at once in the GPU loop
##                       (each() below; ops/elementwise.py picks it)
## Used by clnn/ops/elementwise.py and clnn/ops/bias.py.
<%include file="_common.cl"/>
## dst(inputs...): the output pointer: out, or the input that out is. Stored through
## that input's own pointer, each element's load and store are one address to the
## compiler, which then vectorises; through out it has to assume the two may overlap
## anywhere (PoCL ran an in-place float16 activation gradient 7x slower).
<%def name="dst(*inputs)">${("(__global real_t *)%s + %s_off" % (inplace, inplace)) if inplace in inputs else "out + out_off"}</%def>
//
// Element-wise kernels. Every operand is a contiguous run of n elements starting at
// an element offset (*_off) in its buffer, so views of rows work without copies.
// Each kernel is a grid-stride loop: any global size is correct, and the routine picks
// one that fills the device without launching a work-item per element. Results go to
// o: out, or (rendered with inplace) the input that out is.
//
## float16 runs on vectors on CPUs (each() below): its vector loads and stores are F16C
## instructions on x86, its scalar ones integer code the loops ran at 0.5-0.7x
## bfloat16's speed (relu's gradient on 300K elements: 0.31 ms, 0.14 in bfloat16)
<% half = dtype == "float16" %>\
% if op == "act":
//
// Activation ${act}; p is its parameter (leaky_relu slope, elu alpha), unused otherwise.
//   clnn_act_forward:     out = f(z)
//   clnn_act_derivative:  out = f'(z), computed from ${"z" if src == "z" else "a = f(z)"}
//   clnn_act_backward:    out = dy * f'(z), the backprop step dz = dy (.) f'(z)
//
<%include file="_activation.cl" args="act=act, derivative_from=src, vector=cpu_lanes"/>
<%
    # which kernels run on vectors on CPUs: those whose functions call math built-ins
    # (exp, tanh, ...); the others' loops the compiler vectorises by itself, and faster
    # (relu: 25 GB/s so, 19 through float8); float16 always (half, above)
    vector_f = act in math_acts or half
    vector_df = half or (act in math_acts and (src == "z" or act == "softplus"))
%>
## each(vector, ins, f, on): out[i] = f(loads) for every i, where f maps the names of
## the values of inputs ``ins`` (pointers, each with its *_off) at element i to an
## expression. With ``unroll`` > 1 (GPUs), the grid-stride loop below only; else on CPUs,
## where on, first for the `cpu_lanes` (8; 4 doubles) elements from i (vector) over the
## whole vectors, then the last n % cpu_lanes, and elsewhere the plain grid-stride loop.
<%def name="each(vector, ins, f, on)">
<% scalar = "CLNN_STORE(%s, o, i);" % f(["CLNN_LOAD(%s, %s_off + i)" % (x, x) for x in ins]) %>\
% if unroll > 1:
    // GPUs: ${unroll} elements per work-item and pass, a grid apart (each load is
    // coalesced across a warp), all loaded before the first is used, so ${unroll} loads
    // are in flight per work-item. A plain grid-stride loop keeps one: the compiler may
    // not move a load above a store that could alias it. m: the elements left from i;
    // the k-th is there when k * g < m (no index past n is formed, so none overflows).
    const int g = (int)get_global_size(0);
    for (int i = (int)get_global_id(0); i < n; i += min(${unroll} * g, n - i)) {
        const int m = n - i;
% for x in ins:
        const acc_t ${x}_v0 = CLNN_LOAD(${x}, ${x}_off + i);
% for k in range(1, unroll):
        const acc_t ${x}_v${k} = ${k} * g < m ? CLNN_LOAD(${x}, ${x}_off + i + ${k} * g) : (acc_t)0;
% endfor
% endfor
        CLNN_STORE(${f(["%s_v0" % x for x in ins])}, o, i);
% for k in range(1, unroll):
        if (${k} * g < m) CLNN_STORE(${f(["%s_v%d" % (x, k) for x in ins])}, o, i + ${k} * g);
% endfor
    }
% else:
% if on:
#ifdef CLNN_CPU
    // CPUs: ${cpu_lanes} elements at a time, so the math built-ins (and float16's
    // conversions) run in their vector forms (PoCL calls its scalar tanh once per
    // element: 1 GB/s; its tanh on float8, 8)
    CLNN_FOR_EACH(v, n / ${cpu_lanes}) {
        const int i = v * ${cpu_lanes};
        ${vector}
    }
    for (int i = n / ${cpu_lanes} * ${cpu_lanes} + (int)get_global_id(0); i < n; i += (int)get_global_size(0)) {
        ${scalar}
    }
#else
% endif
    CLNN_FOR_EACH(i, n) {
        ${scalar}
    }
% if on:
#endif
% endif
% endif
</%def>

__kernel void clnn_act_forward(const int n, const acc_t p, const acc_t q,
                               __global const real_t *z, const int z_off,
                               __global real_t *out, const int out_off)
{
    __global real_t *o = ${dst("z")};
${each(f"CLNN_STOREV({cpu_lanes}, clnn_f{cpu_lanes}(CLNN_LOADV({cpu_lanes}, z + z_off + i), p, q), o + i);",
       ["z"], lambda v: f"clnn_f({v[0]}, p, q)", vector_f)}
}

__kernel void clnn_act_derivative(const int n, const acc_t p, const acc_t q,
                                  __global const real_t *src, const int src_off,
                                  __global real_t *out, const int out_off)
{
    __global real_t *o = ${dst("src")};
${each(f"CLNN_STOREV({cpu_lanes}, clnn_df{cpu_lanes}(CLNN_LOADV({cpu_lanes}, src + src_off + i), p, q), o + i);",
       ["src"], lambda v: f"clnn_df({v[0]}, p, q)", vector_df)}
}

__kernel void clnn_act_backward(const int n, const acc_t p, const acc_t q,
                                __global const real_t *dy, const int dy_off,
                                __global const real_t *src, const int src_off,
                                __global real_t *out, const int out_off)
{
    __global real_t *o = ${dst("dy", "src")};
${each(f"CLNN_STOREV({cpu_lanes}, CLNN_LOADV({cpu_lanes}, dy + dy_off + i) * "
       f"clnn_df{cpu_lanes}(CLNN_LOADV({cpu_lanes}, src + src_off + i), p, q), o + i);",
       ["dy", "src"], lambda v: f"{v[0]} * clnn_df({v[1]}, p, q)", vector_df)}
}
% elif op == "linalg":

// out = x (.) y, the Hadamard product of the backprop equations.
__kernel void clnn_hadamard(const int n,
                            __global const real_t *x, const int x_off,
                            __global const real_t *y, const int y_off,
                            __global real_t *out, const int out_off)
{
    __global real_t *o = ${dst("x", "y")};
${each(f"CLNN_STOREV({cpu_lanes}, CLNN_LOADV({cpu_lanes}, x + x_off + i) * CLNN_LOADV({cpu_lanes}, y + y_off + i), o + i);",
       ["x", "y"], lambda v: f"{v[0]} * {v[1]}", half)}
}

// out = alpha x + y; with out == y this is BLAS axpy.
__kernel void clnn_axpy(const int n, const acc_t alpha,
                        __global const real_t *x, const int x_off,
                        __global const real_t *y, const int y_off,
                        __global real_t *out, const int out_off)
{
    __global real_t *o = ${dst("x", "y")};
${each(f"CLNN_STOREV({cpu_lanes}, alpha * CLNN_LOADV({cpu_lanes}, x + x_off + i) + CLNN_LOADV({cpu_lanes}, y + y_off + i), o + i);",
       ["x", "y"], lambda v: f"alpha * {v[0]} + {v[1]}", half)}
}

// out = alpha x
__kernel void clnn_scale(const int n, const acc_t alpha,
                         __global const real_t *x, const int x_off,
                         __global real_t *out, const int out_off)
{
    __global real_t *o = ${dst("x")};
${each(f"CLNN_STOREV({cpu_lanes}, alpha * CLNN_LOADV({cpu_lanes}, x + x_off + i), o + i);",
       ["x"], lambda v: f"alpha * {v[0]}", half)}
}

// out = value
__kernel void clnn_fill(const int n, const acc_t value,
                        __global real_t *out, const int out_off)
{
    CLNN_FOR_EACH(i, n) {
        CLNN_STORE(value, out, out_off + i);
    }
}

// out = x + b broadcast: element i belongs to channel (i / inner) % channels.
// Dense (N, F): channels = F, inner = 1.  Images (N, C, H, W): channels = C, inner = H*W.
__kernel void clnn_bias_add(const int n, const int channels, const int inner,
                            __global const real_t *x, const int x_off,
                            __global const real_t *b, const int b_off,
                            __global real_t *out, const int out_off)
{
    __global real_t *o = ${dst("x")};
    CLNN_FOR_EACH(i, n) {
        int c = (i / inner) % channels;
        CLNN_STORE(CLNN_LOAD(x, x_off + i) + CLNN_LOAD(b, b_off + c), o, i);
    }
}
% else:
<% raise ValueError("unknown op " + op) %>
% endif
