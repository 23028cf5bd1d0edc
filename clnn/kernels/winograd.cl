## winograd.cl: 3x3 convolutions at unit stride as Winograd's F(m x m, 3x3) (Lavin and
## Gray, "Fast Algorithms for Convolutional Neural Networks", 2015): every m x m block of
## outputs comes from an (m + 2) x (m + 2) patch of the input with (m + 2)^2
## multiplications per channel pair instead of 9 m^2, as a batch of (m + 2)^2 GEMMs
## between the transforms below.
## Parameters:  dtype  float32 | float64 | float16 | bfloat16 (16-bit storage: the
##                     transforms and the GEMMs run in float)
##              m      2 (F(2x2, 3x3): 16 GEMMs, 2.25x fewer multiply-adds) or 4
##                     (F(4x4, 3x3): 36 GEMMs, 4x fewer, larger transform coefficients)
##              act    the output's activation (a name from clnn.ACTIVATIONS) or "none"
##              bias   "none" or "row" (bias[m] added to output channel m)
##              dyv    clnn_wino_dy's channels per work-item: 1, or an A panel's MWI
##                     (2 to the CPU vector's lanes)
##              x_acc  clnn_wino_input reads an acc_t copy of a 16-bit input (float16
##                     on CPUs: converted once, not at every patch that covers it)
## Kernels: clnn_wino_filter (U = G g G^T), clnn_wino_input (V = B^T d B; a forward
## pass's, whose V holds tiles side by side, clnn_wino_input_runs, runs of tiles in the
## lanes, or where the tile rows are whole vectors clnn_wino_input_rows), then the
## GEMMs Z[xi] (Mo x T) = U[xi] (Mo x Ci) @ V[xi] (Ci x T) run by gemm.cl, and
## clnn_wino_output (y = A^T Z A, with the fused epilogue); for weight gradients
## clnn_wino_dy (Y = A dy A^T) and clnn_wino_dw (dw = G^T Z G) around the GEMMs
## Z[xi] = Y[xi] V[xi]^T. Used by clnn/ops/conv.py for forward passes, unit-stride data
## gradients (the flipped filters) and weight gradients. The template writes every
## transform out as sums of named values with the matrices' coefficients (PoCL kept
## arrays indexed in loops in memory: 3x slower).
<%include file="_common.cl"/>
<%include file="_epilogue.cl" args="act=act, bias=bias, width=cpu_lanes, vector_act=acc == 'float'"/>
<%
    from fractions import Fraction as Fr
    if m == 2:      # interpolation points 0, 1, -1 (and infinity)
        BT = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
        G = [[1, 0, 0], [Fr(1, 2), Fr(1, 2), Fr(1, 2)], [Fr(1, 2), Fr(-1, 2), Fr(1, 2)],
             [0, 0, 1]]
        AT = [[1, 1, 1, 0], [0, 1, -1, -1]]
    elif m == 4:    # 0, 1, -1, 2, -2 (and infinity)
        BT = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
              [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]
        G = [[Fr(1, 4), 0, 0], [Fr(-1, 6), Fr(-1, 6), Fr(-1, 6)],
             [Fr(-1, 6), Fr(1, 6), Fr(-1, 6)], [Fr(1, 24), Fr(1, 12), Fr(1, 6)],
             [Fr(1, 24), Fr(-1, 12), Fr(1, 6)], [0, 0, 1]]
        AT = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
              [0, 1, -1, 8, -8, 1]]
    else:
        raise ValueError(f"Winograd tiles of {m} outputs: 2 or 4")
    AL = m + 2                           # the transformed tile's side
    T_ = lambda a: [list(r) for r in zip(*a)]
    suf = "" if acc == "double" else "f"

    def lit(c):
        c = Fr(c)
        if c.denominator == 1:
            return f"(acc_t){abs(c.numerator)}.0{suf}"
        return f"((acc_t){abs(c.numerator)}.0{suf} / (acc_t){c.denominator}.0{suf})"

    def combo(row, names):
        """sum of row[k] * names[k], zeros skipped, as OpenCL C"""
        out = ""
        for c, n in zip(row, names):
            c = Fr(c)
            if c == 0:
                continue
            sign = "-" if c < 0 else "+"
            term = n if abs(c) == 1 else f"{lit(abs(c))} * {n}"
            out += f" {sign} {term}" if out else (f"-{term}" if c < 0 else term)
        return out or "(acc_t)0"

    def left(mat, x, rows, cols):
        """names and expressions of mat @ x, x a rows x cols grid of names x(i, j)"""
        return [[combo(r, [x(k, j) for k in range(rows)]) for j in range(cols)] for r in mat]

    def right(x, mat, rows, inner):
        """x @ mat^T: row i of the result, column r = combo(mat[r], x(i, .))"""
        return [[combo(r, [x(i, k) for k in range(inner)]) for r in mat] for i in range(rows)]

    def sandwich(mat, x, tmp, rows, cols, indent, what, typ="acc_t"):
        """mat @ X @ mat^T of the rows x cols grid X of names x(i, j), the form of every
        transform here: the C declarations of mat @ X as tmp{a}_{j} (of type ``typ``,
        commented ``what``), and the expressions of the whole product"""
        mx = left(mat, x, rows, cols)
        decl = "\n".join(
            f"{indent}const {typ} " + ", ".join(f"{tmp}{a}_{j} = {mx[a][j]}" for j in range(cols))
            + f";   // {what}" for a in range(len(mat)))
        return decl, right(lambda i, k: f"{tmp}{i}_{k}", mat, len(mat), cols)
%>
//
// Where a transformed operand's elements go: the GEMMs' operands are written straight
// into the panels the packed CPU GEMM multiplies (gemm.cl's clnn_pack_a and
// clnn_pack_b layouts), so nothing packs them again. An index i of an operand's axis
// (a channel, or a tile) lands at (i / L.s0) * L.s1 + (i % L.s0) * L.s2 from its
// plane: a panel of L.s0 rows or columns, L.s1 elements apart; a plain matrix has one
// "panel" (L.s0 past every index). A last panel's rows or columns past the operand's
// are left as they are: the GEMM never stores what they give.
inline int clnn_wino_at(const int i, const int4 L)
{
    return i / L.s0 * L.s1 + i % L.s0 * L.s2;
}

// An image operand (x, y or dy) is read or written through L = (plane, row, column,
// base): element (h, w) of plane k at base + k L.s0 + h L.s1 + w L.s2. A plain image
// of H x W is (H W, W, 1, 0); one phase (a, b) of an image dilated by (dh, dw) is
// (H W, dh W, dw, a W + b), so a dilated convolution runs as dh dw undilated ones.
//
// Element xi = ${AL} i + j of a transformed ${AL}x${AL} tile is the xi-th GEMM's operand.
// Output tile t = (n, ty, tx) covers outputs (${m} ty .. ${m} ty + ${m - 1}, ${m} tx ..) and
// reads the input patch from (${m} ty - ph, ${m} tx - pw); T tiles per launch, TH x TW
// per image. The planes of a transformed operand are ``plane`` elements apart.

// Kernels below put VC (a CPU vector's lanes) filters, channels or tiles in the lanes
// of vectors.
<%
    VC = cpu_lanes
    vc_t = f"{acc}{VC}"
    lane = "0123456789abcdef"

    def lane_stores(vals, base, first, indent, bound=None):
        """the stores of a transformed tile held in vectors of VC tiles (t = first ..
        first + VC - 1) lane by lane, along t_lay from base; with ``bound``, only the
        tiles below it"""
        out = []
        for l in range(VC):
            guard = f"if ({first} + {l} < {bound}) " if bound else ""
            out.append(f"{indent}{guard}{{")
            out.append(f"{indent}    const int tl = clnn_wino_at({first} + {l}, t_lay);")
            out += [f"{indent}    {base}[tl + {AL * a + b} * plane] = ({vals[a][b]}).s{lane[l]};"
                    for a in range(AL) for b in range(AL)]
            out.append(f"{indent}}}")
        return "\n".join(out)

    def vector_stores(vals, base, indent):
        """the stores of a transformed tile held in vectors, element xi = AL a + b
        (vals[a][b]) as one vector to plane xi from base"""
        return "\n".join(f"{indent}CLNN_ELEMS_STORE{VC}({acc}, {vals[a][b]}, "
                         f"({base} + {AL * a + b} * plane));"
                         for a in range(AL) for b in range(AL))
%>\

// U[xi][o][i] (${AL * AL} x Mo x Ci) from the 3x3 filter g of output channel o and input
// channel i: w[o][i] (Mo, Ci, 3, 3), or with flip (a data gradient) w[i][o] turned by
// 180 degrees (w of shape (Ci, Mo, 3, 3)). U[xi] is written in slots s = (o / orun,
// i, o % orun): orun = 1, a plain matrix (s = o Ci + i), or a panel's width, the packed
// GEMM's A panels; Mo rounded up to orun, the last panel's rows past Mo repeat the
// last filter (the GEMM never stores what they give). A work-item per ${VC} slots, in
// the lanes of vectors, one vector store per element of the tile: 512 x 512 filters
// 3.9 -> 3.1 ms against a work-item per slot (the 36 planes' stores bound it).
__kernel void clnn_wino_filter(const int Mo, const int Ci, const int flip,
                               const int plane, const int orun,
                               __global const real_t *w, const int w_off,
                               __global acc_t *u)
{
    const int slots = (Mo + orun - 1) / orun * orun * Ci;
    const int s0 = (int)get_global_id(0) * ${VC};
    if (s0 >= slots)
        return;
    w += w_off;
% for l in range(VC):
    int f${l};     // where the 9 taps of the filter of slot s0 + ${l} start in w
    {
        const int s = min(s0 + ${l}, slots - 1);
        const int o = min(s / (orun * Ci) * orun + s % orun, Mo - 1), i = s / orun % Ci;
        f${l} = flip ? (i * Mo + o) * 9 : (o * Ci + i) * 9;
    }
% endfor
% for r in range(3):
%   for c in range(3):
    const ${vc_t} g${r}${c} = (${vc_t})(${", ".join(f"CLNN_LOAD(w, f{l} + (flip ? {8 - 3 * r - c} : {3 * r + c}))" for l in range(VC))});
%   endfor
% endfor
<% decl, uu = sandwich(G, lambda k, j: f"g{k}{j}", "t", 3, 3, "    ", "G g", vc_t) %>\
${decl}
    u += s0;
    if (s0 + ${VC} <= slots) {
${vector_stores(uu, "u", " " * 8)}
    } else {
% for a in range(AL):
%   for b in range(AL):
        {
            const ${vc_t} e = ${uu[a][b]};
%     for l in range(VC):
            if (s0 + ${l} < slots)
                u[${AL * a + b} * plane + ${l}] = e.s${lane[l]};
%     endfor
        }
%   endfor
% endfor
    }
}

// V[xi][c][t] (${AL * AL} x C x T) from the input patches of channel c of x (images of
// C planes of H x W from x + x_off, laid out by x_lay), zeros outside the input;
// channel c goes along c_lay, tile t (of the launch's images) along t_lay. A
// work-item per VC channels of an image walks their tiles in a band of TB tile rows
// (all TH where the images' channels make work-items enough: conv.py's _wino_band;
// one or two images of 112x112 and up left one of two cores idle: 1.3-1.9x), the
// channels in the lanes of vectors: every patch element is one
// bounds check and VC loads, and the transform VC channels' arithmetic at once: 1.5x
// faster than a work-item per channel on 28x28x128 (a work-item per tile spent its
// time dividing its index and gathering its loads). Where the channels lie side by
// side in V (a weight gradient's panels of channels) their values go out as one
// vector, else lane by lane. (dy's transform written so, 16 loads for 36 stores into
// panels of MWI channels, ran 1.25x slower: its vectors of 8 channels straddled the
// panels of 6; clnn_wino_dy takes one panel's channels instead.)
__kernel void clnn_wino_input(const int C, const int H, const int W, const int ph,
                              const int pw, const int TH, const int TW, const int TB,
                              const int images, const int plane, const int4 c_lay,
                              const int4 t_lay,
                              __global const ${"acc_t" if x_acc else "real_t"} *x,
                              const int x_off, const int4 x_lay, __global acc_t *v)
{
    const int CG = (C + ${VC - 1}) / ${VC}, NB = (TH + TB - 1) / TB;
    const int gid = (int)get_global_id(0);     // ((n, channels c0 .. c0 + ${VC - 1}), band)
    if (gid >= images * CG * NB)
        return;
    const int nc = gid / NB, ty0 = gid % NB * TB, ty1 = min(ty0 + TB, TH);
    const int n = nc / CG, c0 = nc % CG * ${VC}, lanes = min(${VC}, C - c0);
    const int HW = x_lay.s0;
    // lanes past the last channel read the last one again (in bounds) and store nothing
% for l in range(VC):
    const int xo${l} = min(${l}, lanes - 1) * HW;
    __global acc_t *v${l} = v + clnn_wino_at(c0 + min(${l}, lanes - 1), c_lay);
% endfor
    const bool whole = lanes == ${VC} && c_lay.s2 == 1 && c0 % c_lay.s0 + ${VC} <= c_lay.s0;
    x += x_off + x_lay.s3 + (n * C + c0) * HW;
    for (int ty = ty0; ty < ty1; ++ty) {
        const int h0 = ${m} * ty - ph;
% for a in range(AL):
        const bool hv${a} = (uint)(h0 + ${a}) < (uint)H;
% endfor
        for (int tx = 0; tx < TW; ++tx) {
            const int w0 = ${m} * tx - pw;
            const int at = clnn_wino_at((n * TH + ty) * TW + tx, t_lay);
% for b in range(AL):
            const bool wv${b} = (uint)(w0 + ${b}) < (uint)W;
% endfor
% for a in range(AL):
%   for b in range(AL):
            const int i${a}_${b} = hv${a} && wv${b} ? (h0 + ${a}) * x_lay.s1 + (w0 + ${b}) * x_lay.s2 : 0;
            const ${vc_t} l${a}_${b} = (${vc_t})(${", ".join((f"x[i{a}_{b} + xo{l}]" if x_acc else f"CLNN_LOAD(x, i{a}_{b} + xo{l})") for l in range(VC))});
            const ${vc_t} d${a}_${b} = hv${a} && wv${b} ? l${a}_${b} : (${vc_t})0;
%   endfor
% endfor
<% decl, vv = sandwich(BT, lambda k, j: f"d{k}_{j}", "e", AL, AL, " " * 12, "B^T d", vc_t) %>\
${decl}
% for a in range(AL):
%   for b in range(AL):
            const ${vc_t} o${a}_${b} = ${vv[a][b]};
%   endfor
% endfor
            if (whole) {
${vector_stores([[f"o{a}_{b}" for b in range(AL)] for a in range(AL)], "v0 + at", " " * 16)}
            } else {
% for l in range(VC):
                if (${l} < lanes) {
%   for xi in range(AL * AL):
                    v${l}[at + ${xi} * plane] = o${xi // AL}_${xi % AL}.s${lane[l]};
%   endfor
                }
% endfor
            }
        }
    }
}

// V[xi][c][t] as clnn_wino_input's, where V's tiles lie side by side (t_lay.s2 == 1 in
// panels of whole vectors: a forward pass's and a data gradient's B panels, a plain
// matrix's rows), with tiles in the lanes: a work-item per run of ${VC} tiles (t = ${VC} r
// .. ${VC} r + ${VC - 1} of the launch, across tile rows and images) and a range of CB
// channels. Each lane gathers its own tile's patch, as clnn_wino_input's lanes gather
// their channels', through pointers and bounds found once for all the channels (zeros
// outside the input by a mask per element: a lane's bits and-ed with all ones or
// none), and every element of the transform goes out as one vector of the run's tiles.
// clnn_wino_input stored these ${VC * AL * AL} values a tile lane by lane (56x56, 64 -> 64
// channels, batch 32: 7.1-7.5 ms; here 5.2-5.6; clnn_wino_input writing a weight
// gradient's layout, channels side by side, 4.2). A last run's lanes past T repeat the last tile: where V's panels have room for
// them (t_lay.s1 != 0: a last panel's columns past T, whose products the GEMM never
// stores) the run goes out as vectors all the same, else lane by lane.
<%
    mask_t = ("long" if acc == "double" else "int") + str(VC)
    as_mask, as_acc = f"as_{mask_t}", f"as_{vc_t}"
%>\
__kernel void clnn_wino_input_runs(const int C, const int H, const int W, const int ph,
                                   const int pw, const int TH, const int TW, const int CB,
                                   const int images, const int plane, const int4 c_lay,
                                   const int4 t_lay,
                                   __global const ${"acc_t" if x_acc else "real_t"} *x,
                                   const int x_off, const int4 x_lay, __global acc_t *v)
{
    const int T = images * TH * TW, R = (T + ${VC - 1}) / ${VC};
    const int gid = (int)get_global_id(0);     // (channels c0 .. c0 + CB - 1, run r)
    if (gid >= R * ((C + CB - 1) / CB))
        return;
    const int r = gid % R, c0 = gid / R * CB, c1 = min(c0 + CB, C), t0 = r * ${VC};
    const int HW = x_lay.s0;
    x += x_off + x_lay.s3;
    // lane l: tile t0 + l (lanes past T repeat the last tile)
% for l in range(VC):
    const int tt${l} = min(t0 + ${l}, T - 1);
    const int n${l} = tt${l} / (TH * TW), h${l} = ${m} * (tt${l} / TW % TH) - ph, w${l} = ${m} * (tt${l} % TW) - pw;
%   for a in range(AL):
    const bool hv${l}_${a} = (uint)(h${l} + ${a}) < (uint)H;
%   endfor
%   for b in range(AL):
    const bool wv${l}_${b} = (uint)(w${l} + ${b}) < (uint)W;
%   endfor
% endfor
    // the lanes inside the input, row by row and column by column of the patch
% for a in range(AL):
    const ${mask_t} hm${a} = (${mask_t})(${", ".join(f"hv{l}_{a} ? -1 : 0" for l in range(VC))});
% endfor
% for b in range(AL):
    const ${mask_t} wm${b} = (${mask_t})(${", ".join(f"wv{l}_{b} ? -1 : 0" for l in range(VC))});
% endfor
    // each lane's element offsets from its image's channel 0 (0 outside: in bounds)
% for l in range(VC):
%   for a in range(AL):
%     for b in range(AL):
    __global const ${"acc_t" if x_acc else "real_t"} *p${l}_${a}_${b} = x + (hv${l}_${a} && wv${l}_${b} ? n${l} * C * HW + (h${l} + ${a}) * x_lay.s1 + (w${l} + ${b}) * x_lay.s2 : 0);
%     endfor
%   endfor
% endfor
    const bool vec = t0 + ${VC} <= T || t_lay.s1 != 0;
    const int at = clnn_wino_at(t0, t_lay);
    for (int c = c0; c < c1; ++c) {
        const size_t cp = (size_t)c * HW;      // channel c's plane, from each lane's pointers
% for a in range(AL):
%   for b in range(AL):
        const ${vc_t} d${a}_${b} = ${as_acc}(${as_mask}((${vc_t})(${", ".join((f"p{l}_{a}_{b}[cp]" if x_acc else f"CLNN_LOAD(p{l}_{a}_{b}, cp)") for l in range(VC))})) & hm${a} & wm${b});
%   endfor
% endfor
<% decl, vv = sandwich(BT, lambda k, j: f"d{k}_{j}", "e", AL, AL, " " * 8, "B^T d", vc_t) %>\
${decl}
        __global acc_t *vc = v + clnn_wino_at(c, c_lay);
        if (vec) {
${vector_stores(vv, "vc + at", " " * 12)}
        } else {
${lane_stores(vv, "vc", "t0", " " * 12, "T")}
        }
    }
}

// V[xi][c][t] as clnn_wino_input's, for undilated input (x_lay.s2 == 1), with tiles in
// the lanes: a work-item per ${VC} neighbouring tiles of one tile row of one channel.
// Their ${AL} input rows are read as ${m + 1} whole vectors each (the ${m * VC + 2}
// elements the tiles' patches cover; a vector across the image's edge element by
// element, zeros outside), every lane's patch picked out of them, and each element of
// the transform goes out as one vector of the ${VC} tiles. The caller takes it only
// where TW is a multiple of ${VC} (clnn/ops/conv.py's _wino_rows), so the lanes never
// straddle two tile rows and each work-item's tiles are a run of ${VC} in a B panel.
// (Channels in the lanes, clnn_wino_input, check the bounds of every element per
// channel and store lane by lane; lanes over any ${VC} tiles straddled rows and took a
// pass per row: both slower.)
<%
    NCH = m + 1                      # vectors per input row
    assert m * VC + 2 <= NCH * VC
%>\
// ${VC} elements of input row ``row`` from column wj, zeros outside 0 .. W - 1
inline ${vc_t} clnn_wino_run(__global const real_t *x, const int row, const int wj,
                             const int W)
{
    if (wj >= 0 && wj + ${VC} <= W)
        return CLNN_LOADV(${VC}, x + row + wj);
    return (${vc_t})(${", ".join(f"(uint)(wj + {e}) < (uint)W ? CLNN_LOAD(x, row + wj + {e}) : (acc_t)0" for e in range(VC))});
}

__kernel void clnn_wino_input_rows(const int C, const int H, const int W, const int ph,
                                   const int pw, const int TH, const int TW,
                                   const int images, const int plane, const int4 c_lay,
                                   const int4 t_lay, __global const real_t *x,
                                   const int x_off, const int4 x_lay, __global acc_t *v)
{
    const int GX = TW / ${VC};
    const int gid = (int)get_global_id(0);             // ((n C + c) TH + ty) GX + gx
    if (gid >= images * TH * GX * C)
        return;
    const int gx = gid % GX, ty = gid / GX % TH, c = gid / (GX * TH) % C;
    const int n = gid / (GX * TH * C);
    const int g = (n * TH + ty) * GX + gx;             // the tiles t0 .. / ${VC}
    const int h0 = ${m} * ty - ph, w0 = ${m * VC} * gx - pw;
    x += x_off + x_lay.s3 + (n * C + c) * x_lay.s0;
% for k in range(AL):
    // input row h0 + ${k}: its vectors, then each lane's ${AL} elements
    const bool hv${k} = (uint)(h0 + ${k}) < (uint)H;
%   for j in range(NCH):
    const ${vc_t} q${k}_${j} = hv${k} ? clnn_wino_run(x, (h0 + ${k}) * x_lay.s1, w0 + ${VC * j}, W) : (${vc_t})0;
%   endfor
%   for b in range(AL):
    const ${vc_t} d${k}_${b} = (${vc_t})(${", ".join(f"q{k}_{(m * l + b) // VC}.s{lane[(m * l + b) % VC]}" for l in range(VC))});
%   endfor
% endfor
<% decl, vv = sandwich(BT, lambda k, j: f"d{k}_{j}", "e", AL, AL, "    ", "B^T d", vc_t) %>\
${decl}
    const int t0 = g * ${VC};
    __global acc_t *vb = v + clnn_wino_at(c, c_lay);
    if (t_lay.s2 == 1 && t0 % t_lay.s0 + ${VC} <= t_lay.s0) {
        vb += clnn_wino_at(t0, t_lay);
${vector_stores(vv, "vb", " " * 8)}
    } else {
        // B panels narrower than a vector: lane by lane
${lane_stores(vv, "vb", "t0", " " * 8)}
    }
}

// y = act(A^T Z A + bias) for output channel m, Z[xi][m][t] (${AL * AL} x M x T): the
// ${m}x${m} outputs inside P x Q of the launch's images of y (N x M planes from y + y_off,
// laid out by y_lay). A
// work-item per ${VC} consecutive tiles of one channel, in the lanes of vectors: Z's rows
// of tiles load as whole vectors and the transform runs once for ${VC} tiles (2.1x faster
// than a work-item per plane walking its tiles on 28x28x128). With by_rows (conv.py's
// _wino_output_rows: undilated, tile rows of most of a vector) the tiles are those of
// one tile row (a row's last work-item takes the TW % ${VC} left) and each output row's
// ${m * VC} columns go out as ${m} vectors through the epilogue, their lanes gathered from
// the ${m} column vectors (32 x 32 -> 32 at 32x32: float32 1.58 -> 0.78 ms, float16 2.24
// -> 0.91, whose scalar stores each converted a half); else any ${VC} tiles (short rows,
// a dilated phase's outputs), stored lane by lane.
__kernel void clnn_wino_output(const int M, const int P, const int Q, const int TH,
                               const int TW, const int images, const int plane,
                               const int by_rows, __global const acc_t *z,
                               __global real_t *y, const int y_off, const int4 y_lay,
                               const acc_t act_p,
                               const acc_t act_q, __global const real_t *bias,
                               const int bias_off)
{
    // by_rows: work-items by tile rows, (m, tile row, tiles tx0 ..); else runs of any
    // ${VC} tiles, (m, tiles t0 ..)
    const int T = images * TH * TW, GX = by_rows ? (TW + ${VC - 1}) / ${VC} : 1;
    const int TG = by_rows ? images * TH * GX : (T + ${VC - 1}) / ${VC};
    const int gid = (int)get_global_id(0);
    if (gid >= M * TG)
        return;
    const int m = gid / TG, row = gid % TG / GX, tx0 = gid % GX * ${VC};
    const int t0 = by_rows ? row * TW + tx0 : gid % TG * ${VC};
    const int lanes = by_rows ? min(${VC}, TW - tx0) : min(${VC}, T - t0);
    z += m * T + t0;
    y += y_off + y_lay.s3;
    bias += bias_off;
% for xi in range(AL * AL):
    ${vc_t} s${xi // AL}_${xi % AL};
% endfor
    if (lanes == ${VC}) {
% for xi in range(AL * AL):
        s${xi // AL}_${xi % AL} = CLNN_ELEMS_LOAD${VC}(${acc}, (z + ${xi} * plane));
% endfor
    } else {    // a row's (or the launch's) last tiles: lanes past them read the last again
% for xi in range(AL * AL):
        s${xi // AL}_${xi % AL} = (${vc_t})(${", ".join(f"z[{xi} * plane + min({l}, lanes - 1)]" for l in range(VC))});
% endfor
    }
<% decl, oo = sandwich(AT, lambda k, j: f"s{k}_{j}", "r", AL, AL, "    ", "A^T Z", vc_t) %>\
${decl}
% for i in range(m):
%   for j in range(m):
    const ${vc_t} o${i}_${j} = ${oo[i][j]};
%   endfor
% endfor
    if (by_rows) {
        // the tiles' outputs along each row: ${m} x ${VC} columns from q0 (those inside
        // Q), as vectors whose lanes come from the ${m} column vectors
        const int ty = row % TH, n = row / TH, p0 = ${m} * ty, q0 = ${m} * tx0;
        const int cols = min(${m} * lanes, Q - q0);
        y += (n * M + m) * y_lay.s0;
% for i in range(m):
        if (p0 + ${i} < P) {
%   for g in range(m):
            if (${g * VC} < cols)
                clnn_epilogue_v(y, (p0 + ${i}) * y_lay.s1 + q0 + ${g * VC}, 1, m, 0,
                                min(${VC}, cols - ${g * VC}),
                                (${vc_t})(${", ".join(f"o{i}_{(g * VC + e) % m}.s{lane[(g * VC + e) // m]}" for e in range(VC))}),
                                (acc_t)1, (acc_t)0, act_p, act_q, bias);
%   endfor
        }
% endfor
        return;
    }
    // lane by lane (tiles of several rows, or a dilated phase's outputs)
% for l in range(VC):
    if (${l} < lanes) {
        const int t = t0 + ${l}, tx = t % TW, ty = t / TW % TH, n = t / (TW * TH);
        const int p0 = ${m} * ty, q0 = ${m} * tx;
        __global real_t *yp = y + (n * M + m) * y_lay.s0;
%   for i in range(m):
        if (p0 + ${i} < P) {                       // (A^T Z) A
%     for j in range(m):
            if (q0 + ${j} < Q)
                clnn_epilogue(yp, (p0 + ${i}) * y_lay.s1 + (q0 + ${j}) * y_lay.s2, m, 0, o${i}_${j}.s${lane[l]},
                              (acc_t)1, (acc_t)0, act_p, act_q, bias);
%     endfor
        }
%   endfor
    }
% endfor
}

// ---- the weight gradient: the same F(m x m, 3x3) transposed. With the input's
// patches V = B^T d B as above, each m x m tile of dy goes to Y = A dy A^T, the GEMMs
// sum Z[xi] (M x C) = Y[xi] (M x T) @ V[xi]^T (T x C) over the tiles, and dw = G^T Z G.

// Y[xi][m][t] (${AL * AL} x M x T) from the ${m}x${m} tiles of channel m of dy (images of
// M x P x Q from dy + dy_off, laid out by dy_lay), zeros past P and Q; channel m goes
// along m_lay, tile t along t_lay. A work-item per dyv channels m0 .. of an image (the
// packed GEMM's A panel of MWI channels, or 1) walks their tiles in a band of TB tile
// rows (as clnn_wino_input's), the channels in the
// first dyv lanes of a vector: each tile's 16 dy elements are one bounds check and dyv
// loads, A g A^T runs once for them, and each of the 36 transformed elements goes out
// as dyv contiguous values (a panel holds a tile's MWI channels side by side: a float4
// and a float2 for panels of 6, against a work-item per channel writing stride-6
// scalars: 56x56x64 7.05 -> 5.35 ms). Channels past M (the last panel's padding rows,
// which the GEMM never stores) repeat the last channel. (dy's transform written like
// clnn_wino_input, with vectors of 8 channels, ran 1.25x slower: they straddled the
// panels of 6.) A dyv wider than a vector renders no kernel: conv.py asks for it only
// within one.
% if 1 <= dyv <= VC:
<%
    dv_t = acc if dyv == 1 else f"{acc}{VC}"

    def runs(n):
        """(offset, width) of the vector stores that cover n contiguous values"""
        out, o = [], 0
        for w in (8, 4, 2, 1):
            while n - o >= w and w <= VC:
                out.append((o, w))
                o += w
        return out

    def part(e, o, w):
        """lanes o .. o + w - 1 of vector expression e (e itself for one channel)"""
        if dyv == 1:
            return e
        return f"({e}).s" + "".join(lane[o + k] for k in range(w))

    def loads(k):
        """the dyv channels' values at offset k of their planes, as a dv_t"""
        if dyv == 1:
            return f"CLNN_LOAD(dy, {k})"
        return f"({dv_t})(" + ", ".join([f"CLNN_LOAD(dy, {k} + mo{l})" for l in range(dyv)] +
                                        ["(acc_t)0"] * (VC - dyv)) + ")"
%>\
__kernel void clnn_wino_dy(const int M, const int P, const int Q, const int TH,
                           const int TW, const int TB, const int images, const int plane,
                           const int4 m_lay, const int4 t_lay,
                           __global const real_t *dy, const int dy_off, const int4 dy_lay,
                           __global acc_t *y)
{
    const int MP = (M + ${dyv - 1}) / ${dyv}, NB = (TH + TB - 1) / TB;
    const int gid = (int)get_global_id(0);     // ((n, channels m0 .. m0 + dyv - 1), band)
    if (gid >= images * MP * NB)
        return;
    const int nm = gid / NB, ty0 = gid % NB * TB, ty1 = min(ty0 + TB, TH);
    const int n = nm / MP, m0 = nm % MP * ${dyv}, lanes = min(${dyv}, M - m0);
    (void)lanes;
% for l in range(dyv if dyv > 1 else 0):
    const int mo${l} = min(${l}, lanes - 1) * dy_lay.s0;
% endfor
    y += clnn_wino_at(m0, m_lay);
    dy += dy_off + dy_lay.s3 + (n * M + m0) * dy_lay.s0;
    for (int ty = ty0; ty < ty1; ++ty) {
        const int p0 = ${m} * ty;
        for (int tx = 0; tx < TW; ++tx) {
            const int q0 = ${m} * tx;
            __global acc_t *yt = y + clnn_wino_at((n * TH + ty) * TW + tx, t_lay);
% for i in range(m):
%   for j in range(m):
            const bool ok${i}_${j} = p0 + ${i} < P && q0 + ${j} < Q;
            const int k${i}_${j} = ok${i}_${j} ? (p0 + ${i}) * dy_lay.s1 + (q0 + ${j}) * dy_lay.s2 : 0;
            const ${dv_t} l${i}_${j} = ${loads(f"k{i}_{j}")};
            const ${dv_t} g${i}_${j} = ok${i}_${j} ? l${i}_${j} : (${dv_t})0;
%   endfor
% endfor
<% decl, yy = sandwich(T_(AT), lambda k, j: f"g{k}_{j}", "h", m, m, " " * 12, "A g", dv_t) %>\
${decl}
% for a in range(AL):
%   for b in range(AL):
            {
                const ${dv_t} e = ${yy[a][b]};
%     for o, w in runs(dyv):
%       if w == 1:
                yt[${AL * a + b} * plane + ${o}] = ${part("e", o, w)};
%       else:
                CLNN_ELEMS_STORE${w}(${acc}, ${part("e", o, w)}, (yt + ${AL * a + b} * plane + ${o}));
%       endif
%     endfor
            }
%   endfor
% endfor
        }
    }
}
% endif

// dw[m][c] (3x3, from dw + dw_off: (M, C, 3, 3)) = alpha G^T Z[.][m][c] G + beta dw, Z
// ${AL * AL} x M x C (plane elements apart). A work-item per (m, c).
__kernel void clnn_wino_dw(const int M, const int C, const int plane,
                           __global const acc_t *z, __global real_t *dw, const int dw_off,
                           const acc_t alpha, const acc_t beta)
{
    const int mc = (int)get_global_id(0);
    if (mc >= M * C)
        return;
    z += mc;
% for xi in range(AL * AL):
    const acc_t z${xi // AL}_${xi % AL} = z[${xi} * plane];
% endfor
<% decl, ww = sandwich(T_(G), lambda k, j: f"z{k}_{j}", "r", AL, AL, "    ", "G^T Z") %>\
${decl}
    dw += dw_off + mc * 9;
% for r in range(3):
%   for s in range(3):
    clnn_epilogue(dw, ${3 * r + s}, mc, 0, ${ww[r][s]}, alpha, beta, (acc_t)0, (acc_t)0, dw);
%   endfor
% endfor
}
