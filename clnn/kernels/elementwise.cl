## elementwise.cl: one template for every element-wise op in clnn.
## Parameters:  dtype  float32 | float64 | float16
##              op     "act"    activation forward / derivative / backward for ACT
##                     "linalg" hadamard, axpy, scale, fill, bias_add
##              act    (op "act") identity sigmoid tanh relu leaky_relu elu softplus
##              src    (op "act") "z": derivatives from the pre-activation z,
##                                "a": from the output a = f(z) (cheaper for most)
## Used by clnn/ops/elementwise.py and clnn/ops/bias.py.
<%include file="_common.cl"/>
//
// Element-wise kernels. Every operand is a contiguous run of n elements starting at
// an element offset (*_off) in its buffer, so views of rows work without copies.
// Each kernel is a grid-stride loop: any global size is correct, and the routine picks
// one that fills the device without launching a work-item per element.
//
#define CLNN_FOR_EACH(i, n) for (int i = (int)get_global_id(0); i < (n); i += (int)get_global_size(0))
% if op == "act":
//
// Activation ${act}; p is its parameter (leaky_relu slope, elu alpha), unused otherwise.
//   clnn_act_forward:     out = f(z)
//   clnn_act_derivative:  out = f'(z), computed from ${"z" if src == "z" else "a = f(z)"}
//   clnn_act_backward:    out = dy * f'(z), the backprop step dz = dy (.) f'(z)
//
inline acc_t clnn_f(acc_t z, acc_t p)
{
%   if act == "identity":
    return z;
%   elif act == "sigmoid":
    return (acc_t)1 / ((acc_t)1 + exp(-z));
%   elif act == "tanh":
    return tanh(z);
%   elif act == "relu":
    return fmax(z, (acc_t)0);
%   elif act == "leaky_relu":
    return z > (acc_t)0 ? z : p * z;
%   elif act == "elu":
    return z > (acc_t)0 ? z : p * expm1(z);
%   elif act == "softplus":
    // log(1 + e^z) without overflow: max(z, 0) + log1p(e^-|z|)
    return fmax(z, (acc_t)0) + log1p(exp(-fabs(z)));
%   else:
<% raise ValueError("unknown activation " + act) %>
%   endif
}

// f'(z) from ${"the pre-activation z" if src == "z" else "the output a = f(z)"}.
inline acc_t clnn_df(acc_t ${src}, acc_t p)
{
%   if act == "identity":
    return (acc_t)1;
%   elif act == "sigmoid" and src == "z":
    acc_t s = clnn_f(z, p);
    return s * ((acc_t)1 - s);
%   elif act == "sigmoid":
    return a * ((acc_t)1 - a);
%   elif act == "tanh" and src == "z":
    acc_t t = tanh(z);
    return (acc_t)1 - t * t;
%   elif act == "tanh":
    return (acc_t)1 - a * a;
%   elif act == "relu":
    return ${src} > (acc_t)0 ? (acc_t)1 : (acc_t)0;
%   elif act == "leaky_relu":
    // the sign of a is the sign of z for a positive slope
    return ${src} > (acc_t)0 ? (acc_t)1 : p;
%   elif act == "elu" and src == "z":
    return z > (acc_t)0 ? (acc_t)1 : p * exp(z);
%   elif act == "elu":
    // for z <= 0, a = p (e^z - 1), so p e^z = a + p
    return a > (acc_t)0 ? (acc_t)1 : a + p;
%   elif act == "softplus" and src == "z":
    return (acc_t)1 / ((acc_t)1 + exp(-z));
%   elif act == "softplus":
    // sigmoid(z) = 1 - e^-a when a = log(1 + e^z)
    return -expm1(-a);
%   endif
}

__kernel void clnn_act_forward(const int n, const acc_t p,
                               __global const real_t *z, const int z_off,
                               __global real_t *out, const int out_off)
{
    CLNN_FOR_EACH(i, n) {
        CLNN_STORE(clnn_f(CLNN_LOAD(z, z_off + i), p), out, out_off + i);
    }
}

__kernel void clnn_act_derivative(const int n, const acc_t p,
                                  __global const real_t *src, const int src_off,
                                  __global real_t *out, const int out_off)
{
    CLNN_FOR_EACH(i, n) {
        CLNN_STORE(clnn_df(CLNN_LOAD(src, src_off + i), p), out, out_off + i);
    }
}

__kernel void clnn_act_backward(const int n, const acc_t p,
                                __global const real_t *dy, const int dy_off,
                                __global const real_t *src, const int src_off,
                                __global real_t *out, const int out_off)
{
    CLNN_FOR_EACH(i, n) {
        acc_t g = CLNN_LOAD(dy, dy_off + i) * clnn_df(CLNN_LOAD(src, src_off + i), p);
        CLNN_STORE(g, out, out_off + i);
    }
}
% elif op == "linalg":

// out = x (.) y, the Hadamard product of the backprop equations.
__kernel void clnn_hadamard(const int n,
                            __global const real_t *x, const int x_off,
                            __global const real_t *y, const int y_off,
                            __global real_t *out, const int out_off)
{
    CLNN_FOR_EACH(i, n) {
        CLNN_STORE(CLNN_LOAD(x, x_off + i) * CLNN_LOAD(y, y_off + i), out, out_off + i);
    }
}

// out = alpha x + y; with out == y this is BLAS axpy.
__kernel void clnn_axpy(const int n, const acc_t alpha,
                        __global const real_t *x, const int x_off,
                        __global const real_t *y, const int y_off,
                        __global real_t *out, const int out_off)
{
    CLNN_FOR_EACH(i, n) {
        CLNN_STORE(alpha * CLNN_LOAD(x, x_off + i) + CLNN_LOAD(y, y_off + i), out, out_off + i);
    }
}

// out = alpha x
__kernel void clnn_scale(const int n, const acc_t alpha,
                         __global const real_t *x, const int x_off,
                         __global real_t *out, const int out_off)
{
    CLNN_FOR_EACH(i, n) {
        CLNN_STORE(alpha * CLNN_LOAD(x, x_off + i), out, out_off + i);
    }
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
    CLNN_FOR_EACH(i, n) {
        int c = (i / inner) % channels;
        CLNN_STORE(CLNN_LOAD(x, x_off + i) + CLNN_LOAD(b, b_off + c), out, out_off + i);
    }
}
% else:
<% raise ValueError("unknown op " + op) %>
% endif
