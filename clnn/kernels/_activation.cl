## _activation.cl: the activation functions, shared by elementwise.cl and the fused
## epilogue of gemm.cl. args: act (a name from clnn.ACTIVATIONS, or "none"),
## derivative_from ("z", "a", or None for no derivative), and vector (0, or N: also
## clnn_fN and clnn_dfN on vectors of N, whose math built-ins a CPU runs in its vector
## forms; elementwise.cl's loops for CPUs take them), and inline_math (the fused
## epilogue's: exp and tanh inline on PoCL, clnn_expN and clnn_tanhN below).
<%page args="act, derivative_from=None, vector=0, inline_math=False"/>
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
<% own = inline_math and acc == "float" and act in ("sigmoid", "tanh") %>
%   if own:
<%
    U = f"uint{N}"     # the bits of T, and the exponent's integers
    I = f"int{N}"
%>
// clnn_exp${N}, clnn_tanh${N}: exp and tanh, inline on PoCL (CLNN_POCL), which links
// the built-ins as calls that spill every live vector register around them: an
// epilogue's accumulators (LeNet C1's forward pass with tanh 437 -> 327 us of kernel,
// 146-171 with no activation); elsewhere the built-ins. (Element-wise loops, where no
// register is live across the call, keep PoCL's: its vector exp ran sigmoid at 20
// GB/s, this one at 16.) exp: x = n ln 2 + r (Cody and Waite's two-part ln 2), e^r
// by Cephes's degree-5 polynomial (1.3 ulp at most over every float32 tested), times
// 2^n in two halves so that overflow gives inf and underflow the denormals or 0; NaN
// stays NaN. tanh: Cephes's odd polynomial below |x| = 0.625, else 1 - 2 / (e^2|x| +
// 1), with the sign of x (-0 stays -0).
inline ${T} clnn_exp${N}(${T} x)
{
#ifdef CLNN_POCL
    ${T} xc = x < (${T})(-104.0f) ? (${T})(-104.0f) : x;
    xc = xc > (${T})(89.0f) ? (${T})(89.0f) : xc;
    // n = rint(x / ln 2): the float add rounds to an integer (|x / ln 2| < 2^22)
    const ${T} n = (xc * (${T})(1.44269504088896341f) + (${T})(12582912.0f)) - (${T})(12582912.0f);
    ${T} r = n * (${T})(-0.693359375f) + xc;
    r = n * (${T})(2.12194440e-4f) + r;
    ${T} e = (${T})(1.9875691500e-4f);
    e = e * r + (${T})(1.3981999507e-3f);
    e = e * r + (${T})(8.3334519073e-3f);
    e = e * r + (${T})(4.1665795894e-2f);
    e = e * r + (${T})(1.6666665459e-1f);
    e = e * r + (${T})(5.0000001201e-1f);
    e = e * (r * r) + (r + (${T})(1.0f));
    const ${I} k = convert_int${N}(n), k1 = k / 2;
    return e * as_float${N}(as_${U}((k1 + 127) << 23)) * as_float${N}(as_${U}((k - k1 + 127) << 23));
#else
    return exp(x);
#endif
}

inline ${T} clnn_tanh${N}(${T} x)
{
#ifdef CLNN_POCL
    const ${U} sign = as_${U}(x) & (${U})(0x80000000u);
    const ${T} ax = as_float${N}(as_${U}(x) ^ sign);
    const ${T} z = x * x;
    ${T} t = (${T})(-5.70498872745e-3f);
    t = t * z + (${T})(2.06390887954e-2f);
    t = t * z + (${T})(-5.37397155531e-2f);
    t = t * z + (${T})(1.33314422036e-1f);
    t = t * z + (${T})(-3.33332819422e-1f);
    const ${T} small = (t * z) * ax + ax;
    const ${T} big = (${T})(1.0f) - (${T})(2.0f) / (clnn_exp${N}(ax + ax) + (${T})(1.0f));
    return as_float${N}(as_${U}(ax > (${T})(0.625f) ? big : small) | sign);
#else
    return tanh(x);
#endif
}

%   endif
inline ${T} clnn_f${N}(${T} z, acc_t p, acc_t q)
{
%   if act == "identity":
    return z;
%   elif act == "sigmoid" and own:
    return (${T})1 / ((${T})1 + clnn_exp${N}(-z));
%   elif act == "sigmoid":
    return (${T})1 / ((${T})1 + exp(-z));
%   elif act == "tanh" and own:
    return clnn_tanh${N}(z);
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
    ${T} t = ${"clnn_tanh" + N if own else "tanh"}(z);
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
