## convw.cl: the weight gradient of a layer with few filters (LeNet-5's C1 and C3), for
## GPUs, summed directly from images in local memory.
## Parameters:  dtype  float32 | float64 | float16 | bfloat16
##              S      the filters' width: a work-item's S sums of a unit in registers
##              UPT    units a work-item owns (where the layer has more units than
##                     the work-group has work-items; then PS = 1)
##              T      work-items a work-group
##              LM     local elements (acc_t) for an image: its padded input and dy
## Used by clnn/ops/conv.py's GPU path (the "local" rows) where M <= TILE_DIRECT_MAXM.
## As a GEMM, dw (M x CRS) = dy (M x NPQ) @ unroll(x)^T (NPQ x CRS) has 6 or 16 rows and
## 25 or 150 columns, so its tiles are mostly empty, and its k (N P Q, 800 000 for C1 at
## batch 1024) walks the gathered input one tile step at a time (on an H200 C1's took
## 157 us in float32 and 275 us on float16's engine tiles, for 241 million
## multiply-adds). Here a work-group takes whole images: each once into local memory,
## where every element of x serves all the taps and filters that read it.
<%include file="_common.cl"/>
#define S ${S}       // the filters' width (taps along a row)
#define UPT ${UPT}   // units a work-item owns
#define T ${T}       // work-items a work-group
#define LM ${LM}     // local elements for an image
//
// dw[m, c, r, s] = sum over n, p, q of dy[n, m, p, q] x[n, c, p SH - PH + r,
// q SW - PW + s] (taps outside x read 0). A unit is a filter row (m, c, r): its S sums
// stay in a work-item's registers. Work-group g takes images g IPG to g IPG + IPG - 1:
// for each it loads the input rows and columns the outputs read, zero outside x, in
// rows of WPL (so that a warp's units read different banks: conv.py's wgrad_direct),
// then dy; each work-item adds, for its units, the products at positions sl, sl + PS,
// sl + 2 PS, ... (PS position slices, consecutive work-items on consecutive
// positions). With NB = M the group also sums the bias gradient, db[m] = sum over n, p,
// q of dy[n, m, p, q], from the dy in local memory: T / M work-items a filter, each
// over positions T / M apart. At the end
// the slices' sums are added in slice order and the group writes its partial sums,
// ws[g, (m, c, r, s)] then ws[g, M C R S + m] (K = M C R S + NB a group), which
// clnn_convw_sum adds in group order: no atomics, the same bits every run.
__kernel __attribute__((reqd_work_group_size(T, 1, 1)))
void clnn_convw_partial(const int N, const int C, const int H, const int W, const int M,
                        const int P, const int Q, const int R, const int SH, const int SW,
                        const int PH, const int PW, const int IPG, const int PS,
                        const int HP, const int WPL, const int NB,
                        __global const real_t *x, const int x_off,
                        __global const real_t *dy, const int dy_off,
                        __global acc_t *ws)
{
    __local acc_t lm[LM];
    const int t = (int)get_local_id(0), g = (int)get_group_id(0);
    const int U = M * C * R, PQ = P * Q;
    const int WP = (Q - 1) * SW + S;               // the columns the outputs read
    const int XL = C * HP * WPL;                   // the input's local elements
    __local acc_t *dyl = lm + XL;
    const int sl = t % PS, u0 = t / PS;            // position slice, first unit
    const int TB = T / M, mb = t / TB;             // the bias: work-items a filter, its
    acc_t bacc = (acc_t)0;                         // filter (mb = M: none) and sum
    acc_t acc[UPT][S];
#pragma unroll
    for (int i = 0; i < UPT; ++i)
#pragma unroll
        for (int s = 0; s < S; ++s)
            acc[i][s] = (acc_t)0;
    const int n1 = min(N, (g + 1) * IPG);
    for (int n = g * IPG; n < n1; ++n) {
        barrier(CLK_LOCAL_MEM_FENCE);              // the image before is read by all
        for (int j = t; j < XL; j += T) {
            const int vv = j % WPL, row = j / WPL;            // row = c HP + hh
            const int c = row / HP, h = row % HP - PH, v = vv - PW;
            lm[j] = (vv < WP && h >= 0 && h < H && v >= 0 && v < W) ?
                CLNN_LOAD(x, x_off + ((n * C + c) * H + h) * W + v) : (acc_t)0;
        }
        for (int j = t; j < M * PQ; j += T)
            dyl[j] = CLNN_LOAD(dy, dy_off + n * M * PQ + j);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (NB && mb < M)
            for (int j = t % TB; j < PQ; j += TB)
                bacc += dyl[mb * PQ + j];
#pragma unroll
        for (int i = 0; i < UPT; ++i) {
            const int u = u0 + i * (T / PS);
            if (u < U) {
                const int r = u % R, mc = u / R, c = mc % C, m = mc / C;
                __local const acc_t *dm = dyl + m * PQ;
                __local const acc_t *xr = lm + (c * HP + r) * WPL;
                int p = sl / Q, q = sl % Q;
                for (int pos = sl; pos < PQ; pos += PS) {
                    const acc_t d = dm[pos];
                    __local const acc_t *xs = xr + p * SH * WPL + q * SW;
#pragma unroll
                    for (int s = 0; s < S; ++s)
                        acc[i][s] = mad(d, xs[s], acc[i][s]);
                    q += PS;
                    while (q >= Q) {
                        q -= Q;
                        ++p;
                    }
                }
            }
        }
    }
    // the slices' sums through local memory (every unit's, where PS is 1), then added
    // in slice order (all work-items come here: with a return before this barrier
    // where PS was 1, which every work-item took, PoCL 3.0 corrupted its heap)
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (int i = 0; i < UPT; ++i) {
        const int u = u0 + i * (T / PS);
        if (u < U)
#pragma unroll
            for (int s = 0; s < S; ++s)
                lm[(u * S + s) * PS + sl] = acc[i][s];
    }
    __local acc_t *bl = lm + U * S * PS;           // (conv.py keeps T elements free here)
    bl[t] = bacc;
    barrier(CLK_LOCAL_MEM_FENCE);
    __global acc_t *wg = ws + g * (U * S + NB);
    for (int o = t; o < U * S + NB; o += T) {
        acc_t v = (acc_t)0;
        if (o < U * S)
            for (int k = 0; k < PS; ++k)
                v += lm[o * PS + k];
        else
            for (int k = 0; k < TB; ++k)
                v += bl[(o - U * S) * TB + k];
        wg[o] = v;
    }
}

// dw[o] = alpha (sum over groups g of ws[g, o]) (+ beta dw[o]) for the KW outputs o of
// dw, then db[o - KW] likewise for the K - KW of the bias: a work-group an output,
// each work-item adding the groups t, t + 64, ..., then a tree in a fixed order
__kernel __attribute__((reqd_work_group_size(64, 1, 1)))
void clnn_convw_sum(const int G, const int K, const int KW, const acc_t alpha,
                    const acc_t beta, __global const acc_t *ws, __global real_t *dw,
                    const int dw_off, __global real_t *db, const int db_off)
{
    __local acc_t part[64];
    const int o = (int)get_group_id(0), t = (int)get_local_id(0);
    acc_t v = (acc_t)0;
    for (int k = t; k < G; k += 64)
        v += ws[k * K + o];
    part[t] = v;
    for (int h = 32; h > 0; h >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t < h)
            part[t] += part[t + h];
    }
    if (t == 0) {
        __global real_t *d = o < KW ? dw + dw_off : db + db_off;
        const int i = o < KW ? o : o - KW;
        const acc_t y = alpha * part[0];
        // (beta 0 reads nothing: dw may hold anything, NaN included)
        CLNN_STORE(beta != (acc_t)0 ? y + beta * CLNN_LOAD(d, i) : y, d, i);
    }
}
