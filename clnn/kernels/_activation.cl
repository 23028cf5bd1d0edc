## _activation.cl: the activation functions, shared by elementwise.cl and the fused
## epilogue of gemm.cl. args: act (a name from clnn.ACTIVATIONS, or "none"), and
## derivative_from ("z", "a", or None for no derivative).
<%page args="act, derivative_from=None"/>
<% src = derivative_from %>
% if act != "none":
inline acc_t clnn_f(acc_t z, acc_t p, acc_t q)
{
%   if act == "identity":
    return z;
%   elif act == "sigmoid":
    return (acc_t)1 / ((acc_t)1 + exp(-z));
%   elif act == "tanh":
    return tanh(z);
%   elif act == "relu":
    return z < (acc_t)0 ? (acc_t)0 : z;   // NaN stays NaN (fmax would return 0)
%   elif act == "leaky_relu":
    return z > (acc_t)0 ? z : p * z;
%   elif act == "elu":
    return z > (acc_t)0 ? z : p * expm1(z);
%   elif act == "softplus":
    // PyTorch's softplus, p = beta, q = threshold: z where beta z > threshold, else
    // log(1 + e^(beta z)) / beta without overflow: (max(bz, 0) + log1p(e^-|bz|)) / beta
    const acc_t bz = p * z;
    return bz > q ? z : (fmax(bz, (acc_t)0) + log1p(exp(-fabs(bz)))) / p;
%   else:
<% raise ValueError("unknown activation " + act) %>
%   endif
}

%   if src is not None:

// f'(z) from ${"the pre-activation z" if src == "z" else "the output a = f(z)"}.
inline acc_t clnn_df(acc_t ${src}, acc_t p, acc_t q)
{
%   if act == "identity":
    return (acc_t)1;
%   elif act == "sigmoid" and src == "z":
    acc_t s = clnn_f(z, p, q);
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
    const acc_t bz = p * z;
    return bz > q ? (acc_t)1 : (acc_t)1 / ((acc_t)1 + exp(-bz));
%   elif act == "softplus":
    // sigmoid(beta z) = 1 - e^(-beta a) when beta a = log(1 + e^(beta z)); the linear
    // branch's outputs are told apart by beta a > log(1 + e^q), the most the other
    // branch reaches (the routine asks for z when the two ranges overlap measurably)
    const acc_t ba = p * a;
    return ba > q + log1p(exp(-q)) ? (acc_t)1 : -expm1(-ba);
%   endif
}
%   endif
% endif
