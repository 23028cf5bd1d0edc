## winograd.cl: 3x3 convolutions at unit stride as Winograd's F(2x2, 3x3) (Lavin and
## Gray, "Fast Algorithms for Convolutional Neural Networks", 2015): every 2x2 block of
## outputs comes from a 4x4 patch of the input with 16 multiplications per channel
## pair instead of 36, as a batch of 16 GEMMs between the transforms below.
## Parameters:  dtype  float32 | float64 | float16 | bfloat16 (16-bit storage: the
##                     transforms and the GEMMs run in float)
##              act    the output's activation (a name from clnn.ACTIVATIONS) or "none"
##              bias   "none" or "row" (bias[m] added to output channel m)
## Kernels: clnn_wino_filter (U = G g G^T), clnn_wino_input (V = B^T d B), then 16
## GEMMs Z[xi] (Mo x T) = U[xi] (Mo x Ci) @ V[xi] (Ci x T) run by gemm.cl, and
## clnn_wino_output (y = A^T Z A, with the fused epilogue); for weight gradients
## clnn_wino_dy (Y = A dy A^T) and clnn_wino_dw (dw = G^T Z G) around the GEMMs
## Z[xi] = Y[xi] V[xi]^T. Used by clnn/ops/conv.py for forward passes, unit-stride data
## gradients (the flipped filters) and weight gradients.
<%include file="_common.cl"/>
<%include file="_epilogue.cl" args="act=act, bias=bias"/>
//
// The transforms of F(2x2, 3x3), applied along both axes of a tile:
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]   (input, 4 -> 4)
//   G   = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]  (filter, 3 -> 4)
//   A^T = [1 1 1 0; 0 1 -1 -1]                       (output, 4 -> 2)
// Element xi = 4 i + j of a transformed 4x4 tile is the xi-th GEMM's operand. Output
// tile t = (n, ty, tx) covers outputs (2 ty .. 2 ty + 1, 2 tx .. 2 tx + 1) and reads the
// input patch from (2 ty - ph, 2 tx - pw); T tiles per launch, TH x TW per image.

// U[xi][o][i] (16 x Mo x Ci) from the 3x3 filter g of output channel o and input
// channel i: w[o][i] (Mo, Ci, 3, 3), or with flip (a data gradient) w[i][o] turned by
// 180 degrees (w of shape (Ci, Mo, 3, 3)). A work-item per (o, i).
__kernel void clnn_wino_filter(const int Mo, const int Ci, const int flip,
                               const int plane, __global const real_t *w, const int w_off,
                               __global acc_t *u)
{
    const int gid = (int)get_global_id(0);
    if (gid >= Mo * Ci)
        return;
    const int o = gid / Ci, i = gid % Ci;
    w += w_off;
    acc_t g[3][3];
    for (int r = 0; r < 3; ++r)
        for (int s = 0; s < 3; ++s)
            g[r][s] = flip ? CLNN_LOAD(w, (i * Mo + o) * 9 + (2 - r) * 3 + 2 - s)
                           : CLNN_LOAD(w, (o * Ci + i) * 9 + r * 3 + s);
    const acc_t h = (acc_t)0.5f;
    acc_t t[4][3];                                      // G g
    for (int s = 0; s < 3; ++s) {
        t[0][s] = g[0][s];
        t[1][s] = h * (g[0][s] + g[1][s] + g[2][s]);
        t[2][s] = h * (g[0][s] - g[1][s] + g[2][s]);
        t[3][s] = g[2][s];
    }
    u += gid;                                           // (G g) G^T, row by row
    for (int a = 0; a < 4; ++a) {
        u[(4 * a) * plane] = t[a][0];
        u[(4 * a + 1) * plane] = h * (t[a][0] + t[a][1] + t[a][2]);
        u[(4 * a + 2) * plane] = h * (t[a][0] - t[a][1] + t[a][2]);
        u[(4 * a + 3) * plane] = t[a][2];
    }
}

// V[xi][c][t] (16 x C x T) from the 4x4 input patches of channel c of x (images of
// C x H x W from x + x_off), zeros outside the input. A work-item per plane (n, c)
// walks its tiles, so each of the 16 V[xi] it writes gets a run of TH TW elements: CPUs
// (a work-item per tile spent its time dividing its index and gathering its loads, 3
// GB/s; a work-item per row of 7 tiles its time in the partial lines of its 16 stores).
__kernel void clnn_wino_input(const int C, const int H, const int W, const int ph,
                              const int pw, const int TH, const int TW, const int planes,
                              const int plane, __global const real_t *x, const int x_off,
                              __global acc_t *v)
{
    const int nc = (int)get_global_id(0);              // (n, c)
    if (nc >= planes)
        return;
    const int c = nc % C, n = nc / C;
    const int T = planes / C * TH * TW;                // tiles of the launch's images
    x += x_off + nc * H * W;
    v += c * T + n * TH * TW;
    for (int ty = 0; ty < TH; ++ty, v += TW) {
    const int h0 = 2 * ty - ph;
    for (int tx = 0; tx < TW; ++tx) {
        const int w0 = 2 * tx - pw;
        // (unrolled: with loops PoCL kept d and e in memory, 3x slower)
% for a in range(4):
        const bool hv${a} = (uint)(h0 + ${a}) < (uint)H;
% endfor
% for b in range(4):
        const bool wv${b} = (uint)(w0 + ${b}) < (uint)W;
% endfor
% for a in range(4):
%   for b in range(4):
        const bool ok${a}${b} = hv${a} && wv${b};
        const acc_t l${a}${b} = CLNN_LOAD(x, ok${a}${b} ? (h0 + ${a}) * W + w0 + ${b} : 0);
        const acc_t d${a}${b} = ok${a}${b} ? l${a}${b} : (acc_t)0;      // (selects, no branch)
%   endfor
% endfor
% for b in range(4):
        const acc_t e0${b} = d0${b} - d2${b}, e1${b} = d1${b} + d2${b};     // B^T d
        const acc_t e2${b} = d2${b} - d1${b}, e3${b} = d1${b} - d3${b};
% endfor
% for a in range(4):
        v[${4 * a} * plane + tx] = e${a}0 - e${a}2;                  // (B^T d) B
        v[${4 * a + 1} * plane + tx] = e${a}1 + e${a}2;
        v[${4 * a + 2} * plane + tx] = e${a}2 - e${a}1;
        v[${4 * a + 3} * plane + tx] = e${a}1 - e${a}3;
% endfor
    }
    }
}

// y = act(A^T Z A + bias) for output channel m, Z[xi][m][t] (16 x M x T): the 2x2
// outputs inside P x Q of image n of y (N, M, P, Q from y + y_off). A work-item per
// plane (n, m) walks its tiles.
__kernel void clnn_wino_output(const int M, const int P, const int Q, const int TH,
                               const int TW, const int planes, const int plane,
                               __global const acc_t *z,
                               __global real_t *y, const int y_off, const acc_t act_p,
                               const acc_t act_q, __global const real_t *bias,
                               const int bias_off)
{
    const int nm = (int)get_global_id(0);              // (n, m)
    if (nm >= planes)
        return;
    const int m = nm % M, n = nm / M;
    const int T = planes / M * TH * TW;
    z += m * T + n * TH * TW;
    y += y_off + nm * P * Q;
    bias += bias_off;
    for (int ty = 0; ty < TH; ++ty, z += TW) {
    const int p0 = 2 * ty;
    for (int tx = 0; tx < TW; ++tx) {
% for xi in range(16):
        const acc_t s${xi} = z[${xi} * plane + tx];
% endfor
% for b in range(4):
        const acc_t r0${b} = s${b} + s${4 + b} + s${8 + b};            // A^T Z
        const acc_t r1${b} = s${4 + b} - s${8 + b} - s${12 + b};
% endfor
        const int q = 2 * tx;
% for i in range(2):
        if (p0 + ${i} < P) {                                 // (A^T Z) A
            clnn_epilogue(y, (p0 + ${i}) * Q + q, m, 0, r${i}0 + r${i}1 + r${i}2, (acc_t)1,
                          (acc_t)0, act_p, act_q, bias);
            if (q + 1 < Q)
                clnn_epilogue(y, (p0 + ${i}) * Q + q + 1, m, 0, r${i}1 - r${i}2 - r${i}3,
                              (acc_t)1, (acc_t)0, act_p, act_q, bias);
        }
% endfor
    }
    }
}

// ---- the weight gradient: the same F(2x2, 3x3) transposed. With the input's patches
// V = B^T d B as above, each 2x2 tile of dy goes to Y = A dy A^T (4x4), the 16 GEMMs sum
// Z[xi] (M x C) = Y[xi] (M x T) @ V[xi]^T (T x C) over the tiles, and dw = G^T Z G.

// Y[xi][m][t] (16 x M x T) from the 2x2 tiles of channel m of dy (images of M x P x Q
// from dy + dy_off), zeros past P and Q. A work-item per plane (n, m) walks its tiles.
__kernel void clnn_wino_dy(const int M, const int P, const int Q, const int TH,
                           const int TW, const int planes, const int plane,
                           __global const real_t *dy, const int dy_off, __global acc_t *y)
{
    const int nm = (int)get_global_id(0);              // (n, m)
    if (nm >= planes)
        return;
    const int m = nm % M, n = nm / M;
    const int T = planes / M * TH * TW;
    dy += dy_off + nm * P * Q;
    y += m * T + n * TH * TW;
    for (int ty = 0; ty < TH; ++ty, y += TW) {
        const int p0 = 2 * ty;
        for (int tx = 0; tx < TW; ++tx) {
            const int q0 = 2 * tx;
% for i in range(2):
%   for j in range(2):
            const bool ok${i}${j} = p0 + ${i} < P && q0 + ${j} < Q;
            const acc_t l${i}${j} = CLNN_LOAD(dy, ok${i}${j} ? (p0 + ${i}) * Q + q0 + ${j} : 0);
            const acc_t g${i}${j} = ok${i}${j} ? l${i}${j} : (acc_t)0;
%   endfor
% endfor
% for j in range(2):
            const acc_t h0${j} = g0${j}, h1${j} = g0${j} + g1${j};          // A g
            const acc_t h2${j} = g0${j} - g1${j}, h3${j} = -g1${j};
% endfor
% for a in range(4):
            y[${4 * a} * plane + tx] = h${a}0;                            // (A g) A^T
            y[${4 * a + 1} * plane + tx] = h${a}0 + h${a}1;
            y[${4 * a + 2} * plane + tx] = h${a}0 - h${a}1;
            y[${4 * a + 3} * plane + tx] = -h${a}1;
% endfor
        }
    }
}

// dw[m][c] (3x3, from dw + dw_off: (M, C, 3, 3)) = alpha G^T Z[.][m][c] G + beta dw, Z
// 16 x M x C (plane elements apart). A work-item per (m, c).
__kernel void clnn_wino_dw(const int M, const int C, const int plane,
                           __global const acc_t *z, __global real_t *dw, const int dw_off,
                           const acc_t alpha, const acc_t beta)
{
    const int mc = (int)get_global_id(0);
    if (mc >= M * C)
        return;
    z += mc;
    const acc_t h = (acc_t)0.5f;
% for xi in range(16):
    const acc_t z${xi} = z[${xi} * plane];
% endfor
% for b in range(4):
    const acc_t r0${b} = z${b} + h * (z${4 + b} + z${8 + b});            // G^T Z
    const acc_t r1${b} = h * (z${4 + b} - z${8 + b});
    const acc_t r2${b} = h * (z${4 + b} + z${8 + b}) + z${12 + b};
% endfor
    dw += dw_off + mc * 9;
% for r in range(3):
    clnn_epilogue(dw, ${3 * r}, mc, 0, r${r}0 + h * (r${r}1 + r${r}2), alpha, beta, (acc_t)0,
                  (acc_t)0, dw);                                      // (G^T Z) G
    clnn_epilogue(dw, ${3 * r + 1}, mc, 0, h * (r${r}1 - r${r}2), alpha, beta, (acc_t)0,
                  (acc_t)0, dw);
    clnn_epilogue(dw, ${3 * r + 2}, mc, 0, h * (r${r}1 + r${r}2) + r${r}3, alpha, beta,
                  (acc_t)0, (acc_t)0, dw);
% endfor
}
