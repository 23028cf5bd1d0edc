## loss.cl: the quadratic loss of the tutorial and its gradient.
## Parameters:  dtype   float32 | float64 | float16 | bfloat16
##              wg      0: a work-item per row; WG: a work-group of WG per row (GPUs)
##              dscale  1: the gradient also times scale_by[sb_off], a float on the device
##                      (a mixed-precision step's loss scale, clnn/nn/amp.py)
##              head    0, or WG: also clnn_quadratic_head, a small batch's loss in one
##                      work-group of WG (_head.cl); lossout acc | real, its loss's type
## Used by clnn/ops/loss.py.
<%include file="_common.cl"/>
//
// L = sum((a - y)^2) / (2 * batch) over a (rows, cols) batch, fused with its gradient
// dL/da = (a - y) / batch. Each row's half sum of squares goes to loss_row (acc_t),
// which the routine sums into L; grad_scale is 1/batch.
//
<%def name="quadratic_row()">\
        acc_t s = (acc_t)0;
        for (int j = 0; j < cols; ++j) {
            const int k = r * cols + j;
            const acc_t d = CLNN_LOAD(a, a_off + k) - CLNN_LOAD(y, y_off + k);
            s += d * d;
            CLNN_STORE(d * gs, da, da_off + k);
        }
        const acc_t loss_r = s * (acc_t)0.5f;
</%def>
__kernel void clnn_quadratic(const int rows, const int cols, const acc_t grad_scale,
% if dscale:
                             __global const float *scale_by, const int sb_off,
% endif
                             __global const real_t *a, const int a_off,
                             __global const real_t *y, const int y_off,
                             __global real_t *da, const int da_off,
                             __global acc_t *loss_row)
{
    const acc_t gs = grad_scale${" * (acc_t)scale_by[sb_off]" if dscale else ""};
    for (int r = (int)get_global_id(0); r < rows; r += (int)get_global_size(0)) {
${quadratic_row()}\
        loss_row[r] = loss_r;
    }
}
% if head:

// ---- a small batch: the rows and the mean loss in one launch
<%include file="_wg.cl" args="wg=head"/>
<%namespace name="hd" file="_head.cl"/>
${hd.head_kernel("clnn_quadratic", "a", "da", quadratic_row)}
% endif
% if wg:

// ---- GPUs: a work-group of ${wg} per row, the half sum of squares from a work-group
// reduction in a fixed order (_wg.cl).
<%include file="_wg.cl" args="wg=wg"/>
__kernel __attribute__((reqd_work_group_size(CLNN_WG, 1, 1)))
void clnn_quadratic_wg(const int rows, const int cols, const acc_t grad_scale,
% if dscale:
                       __global const float *scale_by, const int sb_off,
% endif
                       __global const real_t *a, const int a_off,
                       __global const real_t *y, const int y_off,
                       __global real_t *da, const int da_off,
                       __global acc_t *loss_row)
{
    __local acc_t scratch[CLNN_WG];
    const acc_t gs = grad_scale${" * (acc_t)scale_by[sb_off]" if dscale else ""};
    for (int r = (int)get_group_id(0); r < rows; r += (int)get_num_groups(0)) {
        acc_t s = (acc_t)0;
        for (int j = (int)get_local_id(0); j < cols; j += CLNN_WG) {
            const int k = r * cols + j;
            const acc_t d = CLNN_LOAD(a, a_off + k) - CLNN_LOAD(y, y_off + k);
            s += d * d;
            CLNN_STORE(d * gs, da, da_off + k);
        }
        s = clnn_wg_sum(scratch, s);
        if (get_local_id(0) == 0)
            loss_row[r] = s * (acc_t)0.5f;
    }
}
% endif
