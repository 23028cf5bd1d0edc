## _activation.cl: the activation functions, shared by elementwise.cl and the fused
## epilogue of gemm.cl. args: act (a name from clnn.ACTIVATIONS, or "none"),
## derivative_from ("z", "a", or None for no derivative), and vector (0, or N: also
## clnn_fN and clnn_dfN on vectors of N, whose math built-ins a CPU runs in its vector
## forms; elementwise.cl's loops for CPUs take them).
<%page args="act, derivative_from=None, vector=0"/>
<%
    src = derivative_from
    # the functions for scalars (acc_t), then for vectors of `vector` (acc_tN); sel(c,
    # a, b) is a where c, else b, in either (CLNN_SELECT on vectors: the built-in
    # select, not the vector ?: which Oclgrind got wrong in 2x2 pooling, except on PoCL)
    forms = [("acc_t", "", lambda c, a, b: f"(({c}) ? ({a}) : ({b}))")]
    if vector:
        forms.append((f"{acc}{vector}", str(vector), lambda c, a, b: f"CLNN_SELECT({b}, {a}, {c})"))
%>
% if act != "none":
% for T, N, sel in forms:
inline ${T} clnn_f${N}(${T} z, acc_t p, acc_t q)
{
%   if act == "identity":
    return z;
%   elif act == "sigmoid":
    return (${T})1 / ((${T})1 + exp(-z));
%   elif act == "tanh":
    return tanh(z);
%   elif act == "relu":
    return ${sel("z < (%s)0" % T, "(%s)0" % T, "z")};   // NaN stays NaN (fmax would return 0)
%   elif act == "leaky_relu":
    return ${sel("z > (%s)0" % T, "z", "p * z")};
%   elif act == "elu":
    return ${sel("z > (%s)0" % T, "z", "p * expm1(z)")};
%   elif act == "softplus":
    // PyTorch's softplus, p = beta, q = threshold: z where beta z > threshold, else
    // log(1 + e^(beta z)) / beta without overflow: (max(bz, 0) + log1p(e^-|bz|)) / beta
    const ${T} bz = p * z;
    return ${sel("bz > q", "z", "(fmax(bz, (%s)0) + log1p(exp(-fabs(bz)))) / p" % T)};
%   else:
<% raise ValueError("unknown activation " + act) %>
%   endif
}

%   if src is not None:
// f'(z) from ${"the pre-activation z" if src == "z" else "the output a = f(z)"}.
inline ${T} clnn_df${N}(${T} ${src}, acc_t p, acc_t q)
{
%   if act == "identity":
    return (${T})1;
%   elif act == "sigmoid" and src == "z":
    ${T} s = clnn_f${N}(z, p, q);
    return s * ((${T})1 - s);
%   elif act == "sigmoid":
    return a * ((${T})1 - a);
%   elif act == "tanh" and src == "z":
    ${T} t = tanh(z);
    return (${T})1 - t * t;
%   elif act == "tanh":
    return (${T})1 - a * a;
%   elif act == "relu":
    return ${sel(src + " > (%s)0" % T, "(%s)1" % T, "(%s)0" % T)};
%   elif act == "leaky_relu":
    // the sign of a is the sign of z for a positive slope
    return ${sel(src + " > (%s)0" % T, "(%s)1" % T, "(%s)p" % T)};
%   elif act == "elu" and src == "z":
    return ${sel("z > (%s)0" % T, "(%s)1" % T, "p * exp(z)")};
%   elif act == "elu":
    // for z <= 0, a = p (e^z - 1), so p e^z = a + p
    return ${sel("a > (%s)0" % T, "(%s)1" % T, "a + p")};
%   elif act == "softplus" and src == "z":
    const ${T} bz = p * z;
    return ${sel("bz > q", "(%s)1" % T, "(%s)1 / ((%s)1 + exp(-bz))" % (T, T))};
%   elif act == "softplus":
    // sigmoid(beta z) = 1 - e^(-beta a) when beta a = log(1 + e^(beta z)); the linear
    // branch's outputs are told apart by beta a > log(1 + e^q), the most the other
    // branch reaches (the routine asks for z when the two ranges overlap measurably)
    const ${T} ba = p * a;
    return ${sel("ba > q + log1p(exp(-q))", "(%s)1" % T, "-expm1(-ba)")};
%   endif
}

%   endif
% endfor
% endif
