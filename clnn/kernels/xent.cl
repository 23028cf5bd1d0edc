## xent.cl: cross-entropy as torch.nn.functional.cross_entropy computes it, fused with
## its gradient: class-index or probability targets, class weights, ignore_index,
## label smoothing, inputs (N, C) or (N, C, d1, ...).
## Parameters:  dtype   float32 | float64 | float16 | bfloat16
##              target  "index" (int32 class indices) | "prob" (probabilities, x's shape)
## Used by clnn/ops/xent.py.
<%include file="_common.cl"/>
//
// A row is one position (n, s) of the input viewed as (N, C, S), S = d1 * d2 ...: its C
// logits lie at (n C + c) S + s, S apart. Each row has an effective target t over the
// classes, from which everything follows:
//   index:  t_c = w_c ((1 - eps) [c == y] + eps / C)      (0 for y == ignore_index)
//   prob:   t_c = w_c ((1 - eps) y_c + eps / C)
//   loss = -sum_c t_c log softmax(z)_c,   dL/dz_c = softmax(z)_c sum(t) - t_c
// (w = 1 without weights). Each row's loss is written times ``loss_scale`` and its
// gradient times ``grad_scale`` (1/D for a mean, D the rows' total weight).

inline acc_t clnn_target(const int c, const int C, const int y, const acc_t yc,
                         __global const real_t *w, const int w_off, const int weighted,
                         const acc_t eps)
{
    const acc_t wc = weighted ? CLNN_LOAD(w, w_off + c) : (acc_t)1;
% if target == "index":
    return wc * (((acc_t)1 - eps) * (c == y ? (acc_t)1 : (acc_t)0) + eps / (acc_t)C);
% else:
    return wc * (((acc_t)1 - eps) * yc + eps / (acc_t)C);
% endif
}

% if target == "index":
// The weight each row carries in a mean (w_y, or 1; 0 when ignored), and a count of
// targets outside 0..C-1 that are not ignore_index: the routine reads both back
// before the loss kernel runs, so a bad target is an error before anything is written.
__kernel void clnn_xent_row_weights(const int n, const int C, const int ignore_index,
                                    const int weighted,
                                    __global const int *y, const int y_off,
                                    __global const real_t *w, const int w_off,
                                    __global acc_t *row_w, __global acc_t *bad)
{
    CLNN_FOR_EACH(r, n) {
        const int t = y[y_off + r];
        const int ignored = t == ignore_index;
        const int out_of_range = !ignored && (t < 0 || t >= C);
        bad[r] = out_of_range ? (acc_t)1 : (acc_t)0;
        row_w[r] = (ignored || out_of_range) ? (acc_t)0
                   : (weighted ? CLNN_LOAD(w, w_off + t) : (acc_t)1);
    }
}
% endif

__kernel void clnn_xent(const int n, const int C, const int S, const int ignore_index,
                        const int weighted, const acc_t eps, const acc_t loss_scale,
                        const acc_t grad_scale,
                        __global const real_t *z, const int z_off,
% if target == "index":
                        __global const int *y, const int y_off,
% else:
                        __global const real_t *y, const int y_off,
% endif
                        __global const real_t *w, const int w_off,
                        __global real_t *dz, const int dz_off, const int want_dz,
                        __global real_t *loss_out, const int lo_off, const int loss_real,
                        __global acc_t *loss_acc)
{
    CLNN_FOR_EACH(r, n) {
        const int b = r / S, s = r % S;
        const int base = b * C * S + s;             // logit c at base + c * S
% if target == "index":
        const int t = y[y_off + r];
        const int ignored = t == ignore_index;
#define CLNN_YC(c) ((acc_t)0)
% else:
        const int t = -1, ignored = 0;
#define CLNN_YC(c) CLNN_LOAD(y, y_off + base + (c) * S)
% endif
        acc_t m = (acc_t)(-INFINITY);
        for (int c = 0; c < C; ++c)
            m = fmax(m, CLNN_LOAD(z, z_off + base + c * S));
        acc_t se = (acc_t)0, st = (acc_t)0;
        for (int c = 0; c < C; ++c) {
            se += exp(CLNN_LOAD(z, z_off + base + c * S) - m);
            if (!ignored)
                st += clnn_target(c, C, t, CLNN_YC(c), w, w_off, weighted, eps);
        }
        const acc_t lse = log(se);
        acc_t loss = (acc_t)0;
        for (int c = 0; c < C; ++c) {
            const acc_t logp = CLNN_LOAD(z, z_off + base + c * S) - m - lse;
            const acc_t tc = ignored ? (acc_t)0
                             : clnn_target(c, C, t, CLNN_YC(c), w, w_off, weighted, eps);
            loss -= tc != (acc_t)0 ? tc * logp : (acc_t)0;   // 0 log 0 is 0
            if (want_dz)
                CLNN_STORE((exp(logp) * st - tc) * grad_scale, dz, dz_off + base + c * S);
        }
        if (loss_real)
            CLNN_STORE(loss * loss_scale, loss_out, lo_off + r);
        else
            loss_acc[r] = loss * loss_scale;
    }
}
