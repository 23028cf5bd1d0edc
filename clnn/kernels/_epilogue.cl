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
        """A vector of the `width` lanes fmt.format(j=lane); a lane where the condition
        guard.format(j=lane) is false is zero (and not read)."""
        return f"({VT})(" + ",".join(
            f"\n{' ' * 16}{guard.format(j=j)} ? {fmt.format(j=j)} : (acc_t)0"
            for j in range(width)) + ")"
%>
<%include file="_activation.cl" args="act=act, vector=width if vec_act else 0, inline_math=True"/>
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

// The epilogue of lanes lo .. nv - 1 (0 <= lo < nv <= ${width}) of acc: elements idx + j
// step of c, at row m and columns n + j. A whole vector along a row (lo == 0,
// nv == ${width}, step == 1) is read and written at once (in float16 on a CPU, the
// halves' bits converted as a vector: scalar stores of converted halves took a sixth
// of a 512^3 GEMM on PoCL; bfloat16 likewise); on CPUs, other 16-bit lanes are
// converted as a vector too and their bits stored one by one (a strided row of C:
// the gathered convolution's output channels; the pixel-row convolution's last
// block, whose first lanes the block before it stored), else lane by lane. The
// arithmetic, the activation included where vector_act, is on the whole vector either
// way (lanes outside lo .. nv - 1 hold zeros or the bias and are neither read from c
// nor stored); the bias of a whole vector is read as one, any step.
inline void clnn_epilogue_lanes(__global real_t *c, const int idx, const int step,
                                const int m, const int n, const int lo, const int nv,
                                const ${VT} acc, const acc_t alpha, const acc_t beta,
                                const acc_t act_p, const acc_t act_q,
                                __global const real_t *bias)
{
    (void)m, (void)n;
    const bool whole = lo == 0 && nv == ${width} && step == 1;
    ${VT} v = alpha * acc;
    if (beta != (acc_t)0) {
        if (whole)
%   if aligned and not storage_only:
            v += beta * *(__global const ${VT} *)(c + idx);
%   else:
            v += beta * CLNN_LOADV(${width}, c + idx);
%   endif
        else
            v += beta * ${lanes("CLNN_LOAD(c, idx + {j} * step)", "lo <= {j} && {j} < nv")};
    }
% if bias == "col":
    if (nv == ${width})
        v += CLNN_LOADV(${width}, bias + n);
    else
        v += ${lanes("CLNN_LOAD(bias, n + {j})", "{j} < nv")};
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
%   if storage_only:
#ifdef CLNN_CPU
        const ushort${width} bits = CLNN_BITSV(${width}, v);
%     for j in range(width):
        if (lo <= ${j} && ${j} < nv)
            ((__global ushort *)c)[idx + ${j} * step] = bits.s${comps[j]};
%     endfor
#else
%   endif
%   for j in range(width):
        if (lo <= ${j} && ${j} < nv)
            CLNN_STORE(v.s${comps[j]}, c, idx + ${j} * step);
%   endfor
%   if storage_only:
#endif
%   endif
    }
}

// The epilogue of the first nv (1 .. ${width}) lanes of acc (clnn_epilogue_lanes from 0).
inline void clnn_epilogue_v(__global real_t *c, const int idx, const int step, const int m,
                            const int n, const int nv, const ${VT} acc, const acc_t alpha,
                            const acc_t beta, const acc_t act_p, const acc_t act_q,
                            __global const real_t *bias)
{
    clnn_epilogue_lanes(c, idx, step, m, n, 0, nv, acc, alpha, beta, act_p, act_q, bias);
}
% endif
