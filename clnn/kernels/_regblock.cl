## _regblock.cl: the register-blocked micro-kernel of CPUs, shared by gemm.cl's packed
## GEMM and conv.cl's gathered convolution (defs, called through <%namespace>). Not a
## kernel.
## A work-item owns an MWI x NWI block of C in MWI * NVW vectors c{i}_{v} of VW acc_t
## (vec_t, NWI = NVW * VW), unrolled by the template so the compiler keeps every
## accumulator in a register. Per k it loads NVW vectors from a packed B panel and MWI
## values of A, broadcast, and does MWI * NVW vector multiply-adds: the lecture's loop
## nest with the two loops over the output block kept in registers. The kernels differ
## only in where a value of A comes from (a packed A panel, or a gathered input element)
## and where an element of C goes; the defs take both as expressions.

## The accumulators, zero.
<%def name="accumulators(MWI, NVW)">\
% for i in range(MWI):
    vec_t ${", ".join(f"c{i}_{v} = (vec_t)(0)" for v in range(NVW))};
% endfor
</%def>

## One k step: b_row points at row k of the B panel (NWI acc_t, aligned to VW);
## a_elem.format(i=i) is A's value for row i of the block.
<%def name="multiply(MWI, NVW, VW, b_row, a_elem, indent=8)">\
<% pad = " " * indent %>\
% for v in range(NVW):
${pad}const vec_t b${v} = *(__global const vec_t *)(${b_row} + ${v * VW});
% endfor
% for i in range(MWI):
${pad}{
${pad}    const vec_t a_pm = (vec_t)(${a_elem.format(i=i)});
%   for v in range(NVW):
${pad}    c${i}_${v} += a_pm * b${v};
%   endfor
${pad}}
% endfor
</%def>

## The fused epilogue (_epilogue.cl) of the whole block into c: row i of the block is
## stored where row_ok.format(i=i) holds, its element in column n (an expression) goes
## to c[idx.format(i=i, n=n)]; columns n0 + j, j < NVW * VW, exist while n < N.
## vector: how the VW columns of one accumulator are stored:
##   "all"    every existing lane through clnn_epilogue_v, consecutive columns step
##            elements apart (the gathered convolution: LeNet C1's 6 output channels are
##            one partial vector, and its tanh lane by lane took 8x its convolution)
##   "whole"  whole vectors through clnn_epilogue_v, the last columns of C element by
##            element through clnn_epilogue (packed GEMMs: guarded vector epilogues
##            there too made a 1024^3 GEMM's kernel on PoCL take 2-3% longer, its k loop
##            unchanged; other arrangements of the same branches, up to twice as long)
##   None     every element through clnn_epilogue
## m.format(i=i) is the row index the bias of a "row" epilogue reads; acc names the
## accumulators ({acc}{i}_{v}). part (VW, or VW / 2 for a 512-bit tile, whose helpers
## take 256 bits) is the width of clnn_epilogue_v's vectors: an accumulator wider than
## that goes out as its halves (.lo, .hi), each as "all" or "whole" says.
<%def name="epilogue(MWI, NVW, VW, c, row_ok, idx, m, n0, N, vector, step='1', acc='c', indent=4, part=None)">\
<%
    comps = "0123456789abcdef"
    pad = " " * indent
    if vector not in ("all", "whole", None):
        raise ValueError(f"vector={vector!r}")
    part = part or VW
    if part != VW and VW != 2 * part:
        raise ValueError(f"a {VW}-lane accumulator goes out in halves, not {part}s")
    halves = [""] if part == VW else [".lo", ".hi"]
%>\
<%def name="element(i, v, j)">\
<% nj = f"{n0} + {v * VW + j}" %>\
${pad}    if (${nj} < ${N})
${pad}        clnn_epilogue(${c}, ${idx.format(i=i, n=nj)}, ${m.format(i=i)}, ${nj},
${pad}                      ${acc}${i}_${v}${f".s{comps[j]}" if VW > 1 else ""}, alpha, beta,
${pad}                      act_p, act_q, bias);
</%def>\
% for i in range(MWI):
${pad}if (${row_ok.format(i=i)}) {
%   for v in range(NVW):
<% n = f"{n0} + {v * VW}" %>\
%     if vector == "all":
%       for h, half in enumerate(halves):
<% nh = f"{n0} + {v * VW + h * part}" %>\
${pad}    if (${nh} < ${N})
${pad}        clnn_epilogue_v(${c}, ${idx.format(i=i, n=nh)}, ${step}, ${m.format(i=i)}, ${nh},
${pad}                        min(${part}, ${N} - (${nh})), ${acc}${i}_${v}${half}, alpha, beta, act_p,
${pad}                        act_q, bias);
%       endfor
%     else:
%       if vector == "whole":
%         for h, half in enumerate(halves):
<% nh = f"{n0} + {v * VW + h * part}" %>\
${pad}    if (${nh} + ${part} <= ${N}) {
${pad}        clnn_epilogue_v(${c}, ${idx.format(i=i, n=nh)}, ${step}, ${m.format(i=i)}, ${nh},
${pad}                        ${part}, ${acc}${i}_${v}${half}, alpha, beta, act_p, act_q, bias);
${pad}    } else {
%           for j in range(h * part, (h + 1) * part):
${element(i, v, j)}\
%           endfor
${pad}    }
%         endfor
%       else:
%         for j in range(VW):
${element(i, v, j)}\
%         endfor
%       endif
%     endif
%   endfor
${pad}}
% endfor
</%def>
