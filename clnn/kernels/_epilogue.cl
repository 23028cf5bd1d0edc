## _epilogue.cl: the fused epilogue, C = act(alpha * sum + beta * C + bias), for one
## element (clnn_epilogue) and for a run of `width` elements held in one vector
## (clnn_epilogue_v). Shared by gemm.cl (both variants, split-K and the direct kernel)
## and conv.cl's gathered convolution; includes _activation.cl. Not a kernel.
## args: act     a name from clnn.ACTIVATIONS, or "none"
##       bias    "none", "col" (bias[n] to column n: dense layers, the gathered
##               convolution's output channels), "row" (bias[m] to row m: output channels
##               of the GEMM-shaped convolution) or "one" (bias[0] everywhere: addmm's
##               input of shape ())
##       width   0, or 2, 4 or 8: also clnn_epilogue_v on vectors of that many acc_t
##       aligned a whole vector of C is read and written through a pointer to the vector
##               type (the caller checked C's alignment: GPUs then issue one wide access;
##               float32 and float64 only, where real_t is acc_t); else through
##               CLNN_LOADV/CLNN_STOREV, which need no alignment
##       vector_act  the activation runs on the whole vector (CPUs: PoCL calls the scalar
##               forms of math built-ins once per element, and LeNet C1's tanh took 8x
##               its convolution); else lane by lane
<%page args="act, bias, width=0, aligned=False, vector_act=False"/>
<%
    vec_act = vector_act and width in (2, 4, 8) and act in math_acts
    comps = "0123456789abcdef"
    VT = f"{acc}{width}"

    def lanes(fmt, guard):
        """A vector of the `width` lanes fmt.format(j=lane); with guard, lanes past nv
        are zero (and not read)."""
        return f"({VT})(" + ",".join(
            fmt.format(j=j) if j == 0 or not guard else
            f"\n{' ' * 16}{j} < nv ? {fmt.format(j=j)} : (acc_t)0"
            for j in range(width)) + ")"
%>
<%include file="_activation.cl" args="act=act, vector=width if vec_act else 0"/>
// The fused epilogue of element idx of c, at row m and column n of C.
inline void clnn_epilogue(__global real_t *c, const int idx, const int m, const int n,
                          const acc_t acc, const acc_t alpha, const acc_t beta,
                          const acc_t act_p, const acc_t act_q, __global const real_t *bias)
{
    (void)m, (void)n;
    acc_t v = alpha * acc;
    if (beta != (acc_t)0)
        v += beta * CLNN_LOAD(c, idx);
% if bias == "col":
    v += CLNN_LOAD(bias, n);
% elif bias == "row":
    v += CLNN_LOAD(bias, m);
% elif bias == "one":
    v += CLNN_LOAD(bias, 0);
% elif bias != "none":
<% raise ValueError("unknown bias mode " + bias) %>
% endif
% if act != "none":
    v = clnn_f(v, act_p, act_q);
% endif
    CLNN_STORE(v, c, idx);
}
% if width > 1:

// The epilogue of the first nv (1 .. ${width}) lanes of acc: elements idx + j step of c,
// at row m and columns n + j. A whole vector along a row (nv == ${width}, step == 1) is
// read and written at once (in float16 on a CPU, the halves' bits converted as a vector:
// scalar stores of converted halves took a sixth of a 512^3 GEMM on PoCL; bfloat16
// likewise), else lane by lane; the arithmetic, the activation included where
// vector_act, is on the whole vector either way (lanes past nv hold zeros and are not
// stored).
inline void clnn_epilogue_v(__global real_t *c, const int idx, const int step, const int m,
                            const int n, const int nv, const ${VT} acc, const acc_t alpha,
                            const acc_t beta, const acc_t act_p, const acc_t act_q,
                            __global const real_t *bias)
{
    (void)m, (void)n;
    const bool whole = nv == ${width} && step == 1;
    ${VT} v = alpha * acc;
    if (beta != (acc_t)0) {
        if (whole)
%   if aligned and not storage_only:
            v += beta * *(__global const ${VT} *)(c + idx);
%   else:
            v += beta * CLNN_LOADV(${width}, c + idx);
%   endif
        else
            v += beta * ${lanes("CLNN_LOAD(c, idx + {j} * step)", True)};
    }
% if bias == "col":
    if (nv == ${width})
        v += ${lanes("CLNN_LOAD(bias, n + {j})", False)};
    else
        v += ${lanes("CLNN_LOAD(bias, n + {j})", True)};
% elif bias == "row":
    v += (${VT})(CLNN_LOAD(bias, m));
% elif bias == "one":
    v += (${VT})(CLNN_LOAD(bias, 0));
% endif
% if vec_act:
    v = clnn_f${width}(v, act_p, act_q);
% elif act != "none":
%   for j in range(width):
    v.s${comps[j]} = clnn_f(v.s${comps[j]}, act_p, act_q);
%   endfor
% endif
    if (whole) {
%   if aligned and not storage_only:
        *(__global ${VT} *)(c + idx) = v;
%   else:
        CLNN_STOREV(${width}, v, c + idx);
%   endif
    } else {
        CLNN_STORE(v.s0, c, idx);
%   for j in range(1, width):
        if (${j} < nv)
            CLNN_STORE(v.s${comps[j]}, c, idx + ${j} * step);
%   endfor
    }
}
% endif
