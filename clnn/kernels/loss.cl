## loss.cl: the quadratic loss of the tutorial and its gradient.
## Parameters:  dtype  float32 | float64 | float16
## Used by clnn/ops/loss.py.
<%include file="_common.cl"/>
//
// L = sum((a - y)^2) / (2 * batch) over a (rows, cols) batch, fused with its gradient
// dL/da = (a - y) / batch. Each row's half sum of squares goes to loss_row (acc_t),
// which the routine sums into L; grad_scale is 1/batch.
//
__kernel void clnn_quadratic(const int rows, const int cols, const acc_t grad_scale,
                             __global const real_t *a, const int a_off,
                             __global const real_t *y, const int y_off,
                             __global real_t *da, const int da_off,
                             __global acc_t *loss_row)
{
    for (int r = (int)get_global_id(0); r < rows; r += (int)get_global_size(0)) {
        acc_t s = (acc_t)0;
        for (int j = 0; j < cols; ++j) {
            const int k = r * cols + j;
            const acc_t d = CLNN_LOAD(a, a_off + k) - CLNN_LOAD(y, y_off + k);
            s += d * d;
            CLNN_STORE(d * grad_scale, da, da_off + k);
        }
        loss_row[r] = s * (acc_t)0.5f;
    }
}
