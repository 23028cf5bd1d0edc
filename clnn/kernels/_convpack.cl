## _convpack.cl: clnn_conv_pack, which packs the small operand of a gathered
## convolution (filters, or dy transposed) into panels of NWI columns and writes the k
## offset table; included by conv.cl and convpx.cl, each defining NWI (its panel width)
## first. Not a kernel.
// b_pk[(nb * K + k) * NWI + j] = src[col * CS + (k / KD) * KS + (flip ? KD - 1 - k % KD
// : k % KD)] for col = nb * NWI + j < cols, else 0, with src_steps (CS, KD, KS, flip):
//   forward  w (M, CRS):              CS = CRS, KD = CRS, KS = 0,   flip = 0
//   flipped  w (M, C, R, S) as (C, MRS) with the taps reversed (data gradient):
//                                     CS = RS,  KD = RS,  KS = CRS, flip = 1
//   dy (N, M, PQ) as (NPQ, M):        CS = PQ,  KD = PQ,  KS = MPQ, flip = 0
//
// It also writes koff[k] = k1 * KA + k2 * KBH * W + k3 * KCW, the offset of k's input
// element from a row's, for the gathered kernel's flat k loop.
// A work-item packs RUN consecutive k: it divides for the first and steps through
// the rest (dividing for every k took two thirds of LeNet C3's weight-gradient
// packing), and its loads of one column run along k.
__kernel void clnn_conv_pack(const int RUN, const int cols, const int Nb,
                             __global const real_t *src, const int src_off,
                             const int4 src_steps, __global acc_t *b_pk,
                             const int4 k_split, const int4 k_steps, const int W,
                             __global int *koff)
{
    const int CS = src_steps.s0, KD = src_steps.s1, KS = src_steps.s2, flip = src_steps.s3;
    const int K2 = k_split.s1, K3 = k_split.s2, K = k_split.s0 * K2 * K3;
    const int KA = k_steps.s0, KBH = k_steps.s1, KCW = k_steps.s2;
    const int k0 = (int)get_global_id(0) * RUN;
    const int nb = (int)get_global_id(1);
    if (k0 >= K || nb >= Nb)
        return;
    const int kn = min(RUN, K - k0);
    if (nb == 0) {
        int k1 = k0 / (K2 * K3), k2 = k0 / K3 % K2, k3 = k0 % K3;
        for (int t = 0; t < kn; ++t) {
            koff[k0 + t] = k1 * KA + k2 * KBH * W + k3 * KCW;
            if (++k3 == K3) { k3 = 0; if (++k2 == K2) { k2 = 0; ++k1; } }
        }
    }
    int kq = k0 / KD, kr = k0 % KD;
    __global acc_t *dst = b_pk + (nb * K + k0) * NWI;
    // a whole panel checks no column bound per element, so its loads (16-bit ones with
    // their conversions) vectorise
    const int whole = (nb + 1) * NWI <= cols;
    if (!flip && CS > 1 && kr + kn <= KD) {
        // the run's k are consecutive in src (one image of dy^T, one filter row of w):
        // each column's run is read along src, and written across the rows of dst; a
        // whole run of 8 as one vector load (16-bit ones converted as a vector), the
        // columns of a last panel past cols as zeros (doubles: 4 lanes on CPUs, so
        // element by element)
        __global const real_t *s = src + src_off + kq * KS + kr + nb * NWI * CS;
        const int jn = whole ? NWI : cols - nb * NWI;
% if cpu_lanes >= 8:
        if (kn == 8) {
            for (int j = 0; j < jn; ++j) {
                const ${acc}8 v = CLNN_LOADV(8, s + j * CS);
%   for t in range(8):
                dst[${t} * NWI + j] = v.s${t};
%   endfor
            }
        } else
% endif
        {
            for (int j = 0; j < jn; ++j)
                for (int t = 0; t < kn; ++t)
                    dst[t * NWI + j] = CLNN_LOAD(s, j * CS + t);
        }
        for (int j = jn; j < NWI; ++j)
            for (int t = 0; t < kn; ++t)
                dst[t * NWI + j] = (acc_t)0;
        return;
    }
    for (int t = 0; t < kn; ++t, dst += NWI) {
        __global const real_t *s = src + src_off + kq * KS + (flip ? KD - 1 - kr : kr);
        if (whole) {
            for (int j = 0; j < NWI; ++j)
                dst[j] = CLNN_LOAD(s, (nb * NWI + j) * CS);
        } else {
            // the last panel: its columns, then zeros (no test per element)
            const int jn = cols - nb * NWI;
            for (int j = 0; j < jn; ++j)
                dst[j] = CLNN_LOAD(s, (nb * NWI + j) * CS);
            for (int j = jn; j < NWI; ++j)
                dst[j] = (acc_t)0;
        }
        if (++kr == KD) { kr = 0; ++kq; }
    }
}
